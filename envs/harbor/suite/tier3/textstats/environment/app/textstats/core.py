"""Word statistics. A word is a run of the letters a-z, compared in lower case."""


def word_count(text):
    """The number of words in `text`."""
    raise NotImplementedError


def unique_words(text):
    """The set of the distinct words of `text`, in lower case."""
    raise NotImplementedError


def top_words(text, n):
    """The `n` most frequent words as (word, count) pairs: the highest count first, ties in
    alphabetical order."""
    raise NotImplementedError


def average_word_length(text):
    """The mean length of the words of `text`, rounded to 2 decimals (0.0 when there are none)."""
    raise NotImplementedError
