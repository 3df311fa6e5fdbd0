"""Text helpers of the IFEval checks: relations, words, sentences, paragraphs, a language guess."""

from __future__ import annotations

import re
from collections import Counter
from typing import Optional


class InstructionError(ValueError):
    """An instruction a row asks for cannot be checked: unknown id, or bad kwargs."""


# --- text helpers -------------------------------------------------------------------------

RELATIONS = {
    "less than": lambda n, k: n < k,
    "at most": lambda n, k: n <= k,
    "at least": lambda n, k: n >= k,
    "more than": lambda n, k: n > k,
    "exactly": lambda n, k: n == k,
}


def compare(count: int, relation: str, threshold: int) -> bool:
    op = RELATIONS.get(str(relation).strip().lower().replace("_", " "))
    if op is None:
        raise InstructionError(f"unknown relation {relation!r}; expected one of {', '.join(RELATIONS)}")
    return op(count, int(threshold))


def words(text: str) -> list[str]:
    """IFEval's word count: runs of word characters (so "don't" is two words)."""
    return re.findall(r"\w+", text)


_ABBREVIATIONS = {
    "mr",
    "mrs",
    "ms",
    "dr",
    "prof",
    "sr",
    "jr",
    "st",
    "vs",
    "etc",
    "e.g",
    "i.e",
    "inc",
    "ltd",
    "co",
    "no",
    "fig",
    "approx",
    "dept",
    "est",
    "u.s",
    "u.k",
    "a.m",
    "p.m",
    "mt",
    "jan",
    "feb",
    "aug",
    "sept",
    "oct",
    "nov",
    "dec",
    "cf",
    "al",
}
_END = re.compile(r"([.!?]+[\"'”’)\]]*)(\s+)")


def split_sentences(text: str) -> list[str]:
    """Sentences: terminal punctuation then whitespace, or a blank line, ends one."""
    out: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        start = 0
        for m in _END.finditer(block):
            piece = block[start : m.end(1)]
            if m.group(1).rstrip("\"'”’)]") == ".":
                token = re.search(r"(\S+)\.\S*$", piece)
                last = token.group(1).lstrip("(\"'“‘").lower() if token else ""
                following = block[m.end() : m.end() + 1]
                if last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()) or following.islower():
                    continue
            out.append(piece.strip())
            start = m.end()
        out.append(block[start:].strip())
    return [s for s in out if re.search(r"\w", s)]


def paragraphs_by_divider(text: str) -> Optional[int]:
    """Paragraphs separated by `***`; None when an inner paragraph is empty (IFEval fails those)."""
    parts = re.split(r"\s?\*\*\*\s?", text)
    count = len(parts)
    for i, part in enumerate(parts):
        if not part.strip():
            if i in (0, len(parts) - 1):
                count -= 1
            else:
                return None
    return count


def paragraphs_by_blank_line(text: str, strict: bool) -> Optional[int]:
    parts = text.split("\n\n")
    count = len(parts)
    for i, part in enumerate(parts):
        if not part.strip():
            if strict and i not in (0, len(parts) - 1):
                return None
            count -= 1
    return count


# --- language guess -----------------------------------------------------------------------

_SCRIPTS = [  # (first, last, candidate languages), checked by letter counts
    (0xAC00, 0xD7AF, ("ko",)),
    (0x1100, 0x11FF, ("ko",)),
    (0x3040, 0x30FF, ("ja",)),
    (0x4E00, 0x9FFF, ("zh",)),
    (0x0400, 0x04FF, ("ru", "uk", "bg")),
    (0x0600, 0x06FF, ("ar", "fa", "ur")),
    (0x0900, 0x097F, ("hi", "mr", "ne")),
    (0x0980, 0x09FF, ("bn",)),
    (0x0A00, 0x0A7F, ("pa",)),
    (0x0A80, 0x0AFF, ("gu",)),
    (0x0B80, 0x0BFF, ("ta",)),
    (0x0C00, 0x0C7F, ("te",)),
    (0x0C80, 0x0CFF, ("kn",)),
    (0x0D00, 0x0D7F, ("ml",)),
    (0x0E00, 0x0E7F, ("th",)),
    (0x0370, 0x03FF, ("el",)),
    (0x0590, 0x05FF, ("he",)),
]
_STOPWORDS = {
    "en": "the and is of to in that it you with for this are was be have not on as they your can will",
    "es": "el la los las de que y en un una es por con para del se no más lo como su al",
    "fr": "le la les des et est un une du que pour dans pas vous sur avec ce il qui au sont",
    "de": "der die das und ist nicht ein eine zu mit den von sich auf für ich es im dem auch",
    "it": "il di che e la è un una per non sono con del della gli anche si nel questo",
    "pt": "o os as de que e do da em um uma para não com é por mais dos na no",
    "nl": "de het een en van is dat niet op te zijn met voor ik je ook aan",
    "sv": "och att det är som en på för med inte av jag har till om",
    "fi": "ja on ei se että oli hän mutta kun ovat myös tämä joka ole",
    "sw": "na ya wa kwa ni za katika la kuwa hii cha yake hiyo",
    "tr": "ve bir bu da de için ile çok ne gibi daha olarak ama",
    "pl": "i w nie się na jest że z do to jak ale co po",
    "vi": "và của là có không những được các một trong cho người",
    "id": "dan yang di ini itu dengan untuk tidak dari dalam akan adalah",
}
_STOPSETS = {lang: set(ws.split()) for lang, ws in _STOPWORDS.items()}


def guess_language(text: str) -> Optional[set[str]]:
    """Languages the text is plausibly in (ISO 639-1), or None when there is too little to tell."""
    script_counts: Counter = Counter()
    latin = 0
    for ch in text:
        if not ch.isalpha():
            continue
        code = ord(ch)
        if code < 0x250:
            latin += 1
            continue
        for first, last, langs in _SCRIPTS:
            if first <= code <= last:
                script_counts[langs] += 1
                break
    if script_counts and max(script_counts.values()) > latin:
        langs = max(script_counts, key=script_counts.get)
        if langs == ("zh",) and script_counts.get(("ja",)):  # kanji with kana is Japanese
            return {"ja"}
        if langs == ("ru", "uk", "bg"):
            if re.search("[ієїґ]", text.lower()):
                return {"uk"}
            return {"ru", "bg"}
        return set(langs)
    tokens = [t.lower() for t in re.findall(r"[^\W\d_]+", text)]
    if not tokens:
        return None
    scores = {lang: sum(t in stop for t in tokens) for lang, stop in _STOPSETS.items()}
    best = max(scores.values())
    if best == 0:
        return None
    return {lang for lang, s in scores.items() if s == best}


LANGUAGES = {
    "en": "English",
    "es": "Spanish",
    "fr": "French",
    "de": "German",
    "it": "Italian",
    "pt": "Portuguese",
    "ru": "Russian",
    "ja": "Japanese",
    "ko": "Korean",
    "hi": "Hindi",
    "zh": "Chinese",
    "ar": "Arabic",
    "sw": "Swahili",
    "fi": "Finnish",
}
