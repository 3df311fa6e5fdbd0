from textstats import average_word_length, top_words, unique_words, word_count

TEXT = "The cat and the hat. The cat sat!"


def test_word_count():
    assert word_count(TEXT) == 8
    assert word_count("") == 0


def test_unique_words():
    assert unique_words(TEXT) == {"the", "cat", "and", "hat", "sat"}


def test_top_words():
    assert top_words(TEXT, 2) == [("the", 3), ("cat", 2)]
    assert top_words("b a c a b", 3) == [("a", 2), ("b", 2), ("c", 1)]


def test_average_word_length():
    assert average_word_length(TEXT) == 3.0
    assert average_word_length("ab abcd") == 3.0
    assert average_word_length("") == 0.0
