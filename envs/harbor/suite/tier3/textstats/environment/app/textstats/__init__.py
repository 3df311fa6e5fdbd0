from textstats.core import average_word_length, top_words, unique_words, word_count

__all__ = ["average_word_length", "top_words", "unique_words", "word_count"]
