#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
cat > textstats/core.py <<'EOF'
"""Word statistics. A word is a run of the letters a-z, compared in lower case."""

import re
from collections import Counter


def _words(text):
    return re.findall(r"[a-z]+", text.lower())


def word_count(text):
    return len(_words(text))


def unique_words(text):
    return set(_words(text))


def top_words(text, n):
    counts = Counter(_words(text))
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]


def average_word_length(text):
    words = _words(text)
    return round(sum(map(len, words)) / len(words), 2) if words else 0.0
EOF
python3 -m pytest -q -p no:cacheprovider tests > /dev/null
