"""IFEval's verifiable instructions, checked offline with no downloads.

Each instruction is registered under IFEval's id (`length_constraints:number_words`, ...) with
IFEval's keyword-argument names (`relation`, `num_words`, ...), so a NeMo Gym / IFEval row is
checked unchanged. Next to the check sit the two things the offline prompt generator needs:
a description of the instruction (the sentence the model reads) and a sampler of its kwargs.
A few ids from open-instruct's IFEvalG / IFBench extension (`last_word:last_word_answer`,
`count:lowercase_counting`, ...) are here too, because NeMo Gym's example rows use them.

Why not IFEval's own code: it needs nltk's punkt data and langdetect, both downloads or heavy
dependencies at run time. Sentences are split by a small rule-based splitter (punctuation
followed by space, with common abbreviations, initials and a lower-case continuation not
counted as ends), words are `\\w+` runs as IFEval counts them, and the language checks use a
script-and-stopword guess (`guess_language`) that is good enough for "is this English / Hindi
/ Japanese", not a general-purpose detector.

Deliberate differences from the reference: a missing or unexpected kwarg raises
InstructionError instead of being filled in at random (a verifier must never invent its own
target); relations accept `at most`, `more than` and `exactly` besides IFEval's `less than`
and `at least`; keywords are matched literally (escaped), never as regular expressions, so a
row cannot make a check backtrack for minutes.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional


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


def _paragraphs_by_divider(text: str) -> Optional[int]:
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


def _paragraphs_by_blank_line(text: str, strict: bool) -> Optional[int]:
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


# --- the registry -------------------------------------------------------------------------

Check = Callable[..., bool]


@dataclass
class Instruction:
    """One verifiable instruction: its check, its kwargs, and how to ask for it."""

    id: str
    check: Check  # check(response, **kwargs) -> bool
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    describe: Optional[Callable[[dict], str]] = None
    sample: Optional[Callable[[random.Random, str], dict]] = None  # (rng, request so far) -> kwargs
    groups: frozenset = field(default_factory=frozenset)  # generator: at most one per group


REGISTRY: dict[str, Instruction] = {}


def instruction(id: str, required=(), optional=(), describe=None, sample=None, groups=()):
    def register(fn: Check) -> Check:
        REGISTRY[id] = Instruction(id, fn, tuple(required), tuple(optional), describe, sample, frozenset(groups) | {id})
        return fn

    return register


def check_instruction(instruction_id: str, kwargs: Optional[dict], response: str) -> bool:
    """Whether `response` follows one instruction; InstructionError when it cannot be checked."""
    spec = REGISTRY.get(instruction_id)
    if spec is None:
        raise InstructionError(f"unknown instruction id {instruction_id!r}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InstructionError(f"{instruction_id}: kwargs must be an object, got {type(kwargs).__name__}")
    given = {k: v for k, v in (kwargs or {}).items() if v is not None}  # IFEval rows carry null kwargs
    missing = [k for k in spec.required if k not in given]
    unexpected = [k for k in given if k not in spec.required and k not in spec.optional]
    if missing or unexpected:
        raise InstructionError(
            f"{instruction_id}: "
            + "; ".join(
                ([f"missing kwargs {missing}"] if missing else [])
                + ([f"unexpected kwargs {unexpected}"] if unexpected else [])
            )
        )
    try:
        return bool(spec.check(response, **given))
    except InstructionError:
        raise
    except (TypeError, ValueError, AttributeError) as exc:
        raise InstructionError(f"{instruction_id}: bad kwargs {given}: {exc}") from None


# --- generator vocabulary -----------------------------------------------------------------

KEYWORDS = [
    "river",
    "lantern",
    "harvest",
    "compass",
    "orbit",
    "signal",
    "garden",
    "bridge",
    "memory",
    "engine",
    "market",
    "winter",
    "courage",
    "history",
    "network",
    "balance",
    "storm",
    "puzzle",
]
FORBIDDEN = ["very", "really", "thing", "good", "important", "also", "just", "many", "people", "great"]
FIRST_WORDS = ["today", "imagine", "first", "however", "consider", "finally", "yes", "indeed"]
END_PHRASES = ["Any other questions?", "Is there anything else I can help with?", "That is all for now."]
COUNT_RELATIONS = ["at least", "less than", "at most"]


def _letters(rng):
    return rng.choice("aeinorst")


# length constraints


@instruction(
    "length_constraints:number_words",
    required=("num_words", "relation"),
    describe=lambda k: f"Answer with {k['relation']} {k['num_words']} words.",
    sample=lambda r, t: {"relation": r.choice(COUNT_RELATIONS), "num_words": r.choice([20, 40, 60, 80, 120])},
    groups={"length"},
)
def _number_words(text, num_words, relation):
    return compare(len(words(text)), relation, num_words)


@instruction(
    "length_constraints:number_sentences",
    required=("num_sentences", "relation"),
    describe=lambda k: f"Your response should contain {k['relation']} {k['num_sentences']} sentences.",
    sample=lambda r, t: {"relation": r.choice(COUNT_RELATIONS + ["exactly"]), "num_sentences": r.randint(2, 8)},
    groups={"length"},
)
def _number_sentences(text, num_sentences, relation):
    return compare(len(split_sentences(text)), relation, num_sentences)


@instruction(
    "length_constraints:number_paragraphs",
    required=("num_paragraphs",),
    describe=lambda k: (
        f"There should be {k['num_paragraphs']} paragraphs. Paragraphs are separated with the markdown divider: ***"
    ),
    sample=lambda r, t: {"num_paragraphs": r.randint(2, 4)},
    groups={"paragraphs"},
)
def _number_paragraphs(text, num_paragraphs):
    return _paragraphs_by_divider(text) == int(num_paragraphs)


@instruction(
    "length_constraints:nth_paragraph_first_word",
    required=("num_paragraphs", "nth_paragraph", "first_word"),
    describe=lambda k: (
        f"There should be {k['num_paragraphs']} paragraphs. Paragraphs and only paragraphs "
        "are separated with each other by two new lines as if it was '\\n\\n' in python. "
        f"Paragraph {k['nth_paragraph']} must start with word {k['first_word']}."
    ),
    sample=lambda r, t: (
        lambda n: {"num_paragraphs": n, "nth_paragraph": r.randint(1, n), "first_word": r.choice(FIRST_WORDS)}
    )(r.randint(2, 4)),
    groups={"paragraphs", "start"},
)
def _nth_paragraph_first_word(text, num_paragraphs, nth_paragraph, first_word):
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    nth = int(nth_paragraph)
    if len(paragraphs) != int(num_paragraphs) or not 1 <= nth <= len(paragraphs):
        return False
    word = paragraphs[nth - 1].split()[0].lstrip("'\"“‘*#")
    word = re.split(r"[.,?!'\"”’:;]", word, maxsplit=1)[0]
    return word.lower() == str(first_word).strip().lower()


# keywords


@instruction(
    "keywords:existence",
    required=("keywords",),
    describe=lambda k: f"Include keywords {', '.join(k['keywords'])} in the response.",
    sample=lambda r, t: {"keywords": sorted(r.sample(KEYWORDS, 2))},
    groups={"keywords"},
)
def _existence(text, keywords):
    if isinstance(keywords, str):
        keywords = [keywords]
    return all(re.search(re.escape(k), text, re.IGNORECASE) for k in keywords)


@instruction(
    "keywords:frequency",
    required=("keyword", "frequency", "relation"),
    describe=lambda k: (
        f"In your response, the word {k['keyword']} should appear {k['relation']} {k['frequency']} times."
    ),
    sample=lambda r, t: {
        "keyword": r.choice(KEYWORDS),
        "frequency": r.randint(1, 3),
        "relation": r.choice(["at least", "less than"]),
    },
    groups={"keywords"},
)
def _frequency(text, keyword, frequency, relation):
    return compare(len(re.findall(re.escape(keyword.strip()), text, re.IGNORECASE)), relation, frequency)


@instruction(
    "keywords:forbidden_words",
    required=("forbidden_words",),
    describe=lambda k: f"Do not include keywords {', '.join(k['forbidden_words'])} in the response.",
    sample=lambda r, t: {"forbidden_words": sorted(r.sample(FORBIDDEN, 2))},
    groups={"forbidden"},
)
def _forbidden(text, forbidden_words):
    if isinstance(forbidden_words, str):
        forbidden_words = [forbidden_words]
    return not any(re.search(r"\b" + re.escape(w) + r"\b", text, re.IGNORECASE) for w in forbidden_words)


@instruction(
    "keywords:letter_frequency",
    required=("letter", "let_frequency", "let_relation"),
    describe=lambda k: (
        f"In your response, the letter {k['letter']} should appear {k['let_relation']} {k['let_frequency']} times."
    ),
    sample=lambda r, t: {
        "letter": _letters(r),
        "let_frequency": r.randint(3, 12),
        "let_relation": r.choice(["at least", "less than"]),
    },
    groups={"letters"},
)
def _letter_frequency(text, letter, let_frequency, let_relation):
    letter = str(letter).strip().lower()
    if len(letter) != 1:
        raise InstructionError(f"keywords:letter_frequency: letter must be one character, got {letter!r}")
    return compare(text.lower().count(letter), let_relation, let_frequency)


# content and format


@instruction(
    "detectable_content:number_placeholders",
    required=("num_placeholders",),
    describe=lambda k: (
        f"The response must contain at least {k['num_placeholders']} placeholders "
        "represented by square brackets, such as [address]."
    ),
    sample=lambda r, t: {"num_placeholders": r.randint(1, 4)},
    groups={"json"},
)
def _placeholders(text, num_placeholders):
    return len(re.findall(r"\[.*?\]", text)) >= int(num_placeholders)


@instruction(
    "detectable_content:postscript",
    required=("postscript_marker",),
    describe=lambda k: (
        f"At the end of your response, please explicitly add a postscript starting with {k['postscript_marker']}"
    ),
    sample=lambda r, t: {"postscript_marker": r.choice(["P.S.", "P.P.S"])},
    groups={"end", "json", "case"},
)
def _postscript(text, postscript_marker):
    marker = postscript_marker.strip()
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + re.escape(marker.lower()) + r".*$"
    return bool(re.findall(pattern, text.lower(), flags=re.MULTILINE))


@instruction(
    "detectable_format:number_bullet_lists",
    required=("num_bullets",),
    describe=lambda k: (
        f"Your answer must contain exactly {k['num_bullets']} bullet points. "
        "Use the markdown bullet points such as:\n* This is point 1.\n* This is point 2"
    ),
    sample=lambda r, t: {"num_bullets": r.randint(2, 5)},
    groups={"json", "bullets"},
)
def _bullets(text, num_bullets):
    stars = re.findall(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", text, flags=re.MULTILINE)
    return len(stars) + len(dashes) == int(num_bullets)


CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


@instruction(
    "detectable_format:constrained_response",
    describe=lambda k: f"Answer with one of the following options: {', '.join(CONSTRAINED_OPTIONS)}",
    sample=lambda r, t: {},
    groups={"shape", "json", "case"},
)
def _constrained(text):
    return any(option in text for option in CONSTRAINED_OPTIONS)


@instruction(
    "detectable_format:number_highlighted_sections",
    required=("num_highlights",),
    describe=lambda k: (
        f"Highlight at least {k['num_highlights']} sections in your answer with markdown, i.e. *highlighted section*."
    ),
    sample=lambda r, t: {"num_highlights": r.randint(1, 3)},
    groups={"json", "bullets"},
)
def _highlights(text, num_highlights):
    single = [h for h in re.findall(r"\*[^\n\*]*\*", text) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", text) if h[2:-2].strip()]
    return len(single) + len(double) >= int(num_highlights)


@instruction(
    "detectable_format:multiple_sections",
    required=("section_spliter", "num_sections"),
    describe=lambda k: (
        f"Your response must have {k['num_sections']} sections. Mark the beginning of each "
        f"section with {k['section_spliter']} X, such as:\n{k['section_spliter']} 1\n"
        f"[content of section 1]\n{k['section_spliter']} 2\n[content of section 2]"
    ),
    sample=lambda r, t: {"section_spliter": r.choice(["Section", "SECTION"]), "num_sections": r.randint(2, 4)},
    groups={"paragraphs", "json", "case"},
)
def _sections(text, section_spliter, num_sections):
    found = re.findall(r"\s?" + re.escape(section_spliter.strip()) + r"\s?\d+\s?", text)
    return len(found) >= int(num_sections)


@instruction(
    "detectable_format:json_format",
    describe=lambda k: "Entire output should be wrapped in JSON format. You can use markdown ticks such as ```.",
    sample=lambda r, t: {},
    groups={"json", "shape", "start", "end", "case", "paragraphs", "bullets", "title"},
)
def _json(text):
    value = text.strip()
    for prefix in ("```json", "```Json", "```JSON", "```"):
        if value.startswith(prefix):
            value = value[len(prefix) :]
            break
    value = value.removesuffix("```").strip()
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


@instruction(
    "detectable_format:title",
    describe=lambda k: "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>.",
    sample=lambda r, t: {},
    groups={"title", "json"},
)
def _title(text):
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", text))


# combinations, start and end


@instruction(
    "combination:two_responses",
    describe=lambda k: (
        "Give two different responses. Responses and only responses should be separated by 6 asterisk symbols: ******."
    ),
    sample=lambda r, t: {},
    groups={"shape", "paragraphs", "json"},
)
def _two_responses(text):
    parts = text.split("******")
    kept = []
    for i, part in enumerate(parts):
        if part.strip():
            kept.append(part.strip())
        elif i not in (0, len(parts) - 1):
            return False
    return len(kept) == 2 and kept[0] != kept[1]


@instruction(
    "combination:repeat_prompt",
    required=("prompt_to_repeat",),
    describe=lambda k: (
        "First repeat the request word for word without change, then give your answer "
        "(1. do not say any words or characters before repeating the request; 2. the request "
        "you need to repeat does not include this sentence)"
    ),
    sample=lambda r, t: {"prompt_to_repeat": t},
    groups={"start", "shape", "json", "case"},
)
def _repeat_prompt(text, prompt_to_repeat):
    return text.strip().lower().startswith(prompt_to_repeat.strip().lower())


@instruction(
    "startend:end_checker",
    required=("end_phrase",),
    describe=lambda k: (
        f"Finish your response with this exact phrase {k['end_phrase']} No other words should follow this phrase."
    ),
    sample=lambda r, t: {"end_phrase": r.choice(END_PHRASES)},
    groups={"end", "json", "case"},
)
def _end_checker(text, end_phrase):
    return text.strip().strip('"').lower().endswith(end_phrase.strip().lower())


@instruction(
    "startend:quotation",
    describe=lambda k: "Wrap your entire response with double quotation marks.",
    sample=lambda r, t: {},
    groups={"start", "end", "json"},
)
def _quotation(text):
    value = text.strip()
    return len(value) > 1 and value[0] == '"' and value[-1] == '"'


# case and punctuation


def _is_english(text: str) -> bool:
    langs = guess_language(text)
    return langs is None or "en" in langs  # like IFEval, an undecidable text is not held against it


@instruction(
    "change_case:english_capital",
    describe=lambda k: "Your entire response should be in English, and in all capital letters.",
    sample=lambda r, t: {},
    groups={"case"},
)
def _english_capital(text):
    return text.isupper() and _is_english(text)


@instruction(
    "change_case:english_lowercase",
    describe=lambda k: (
        "Your entire response should be in English, and in all lowercase letters. No capital letters are allowed."
    ),
    sample=lambda r, t: {},
    groups={"case"},
)
def _english_lowercase(text):
    return text.islower() and _is_english(text)


@instruction(
    "change_case:capital_word_frequency",
    required=("capital_frequency", "capital_relation"),
    describe=lambda k: (
        f"In your response, words with all capital letters should appear "
        f"{k['capital_relation']} {k['capital_frequency']} times."
    ),
    sample=lambda r, t: {"capital_frequency": r.randint(2, 6), "capital_relation": r.choice(["at least", "less than"])},
    groups={"case"},
)
def _capital_words(text, capital_frequency, capital_relation):
    tokens = re.findall(r"\w+(?:[-'’]\w+)*", text)  # hyphenated words count once
    return compare(sum(t.isupper() for t in tokens), capital_relation, capital_frequency)


@instruction(
    "punctuation:no_comma",
    describe=lambda k: "In your entire response, refrain from the use of any commas.",
    sample=lambda r, t: {},
    groups={"json"},
)
def _no_comma(text):
    return "," not in text


@instruction(
    "language:response_language",
    required=("language",),
    describe=lambda k: (
        f"Your ENTIRE response should be in {LANGUAGES.get(k['language'], k['language'])} "
        "language, no other language is allowed."
    ),
    sample=None,
)  # a tiny policy cannot be asked for Swahili fairly; rows may still carry it
def _response_language(text, language):
    langs = guess_language(text)
    return langs is not None and str(language).lower() in langs


# open-instruct IFEvalG / IFBench ids used by NeMo Gym's example rows


@instruction(
    "first_word:first_word_answer",
    required=("first_word",),
    describe=lambda k: f"The first word of your response should be the word {k['first_word']}.",
    sample=lambda r, t: {"first_word": r.choice(FIRST_WORDS)},
    groups={"start"},
)
def _first_word_answer(text, first_word):
    tokens = text.split()
    return bool(tokens) and tokens[0].strip().lower() == str(first_word).strip().lower()


@instruction(
    "first_word:first_word_sent",
    required=("first_word",),
    describe=lambda k: f"The first word of each sentence should be the word {k['first_word']}.",
)
def _first_word_sent(text, first_word):
    target = (first_word if isinstance(first_word, str) else first_word[0]).strip().lower()
    sentences = split_sentences(text)
    return bool(sentences) and all(s.split()[0].lower() == target for s in sentences)


@instruction(
    "last_word:last_word_answer",
    required=("last_word",),
    describe=lambda k: f"The last word of your response should be the word {k['last_word']}.",
    sample=lambda r, t: {"last_word": r.choice(KEYWORDS)},
    groups={"end", "json"},
)
def _last_word_answer(text, last_word):
    tokens = text.split()
    return bool(tokens) and re.sub(r"[^\w\s]", "", tokens[-1]).lower() == str(last_word).strip().lower()


@instruction(
    "punctuation:punctuation_dot",
    describe=lambda k: "In your entire response, refrain from the use of . (i.e. dots) as punctuation and in general.",
)
def _no_dot(text):
    return "." not in text


@instruction(
    "punctuation:punctuation_exclamation",
    describe=lambda k: (
        "In your entire response, refrain from the use of ! (i.e. exclamation marks) as punctuation and in general."
    ),
    sample=lambda r, t: {},
)
def _no_exclamation(text):
    return "!" not in text


@instruction(
    "count:lowercase_counting",
    required=("N",),
    describe=lambda k: f"In your response, all lowercase words should appear at most {k['N']} times.",
)
def _lowercase_counting(text, N):
    return len(re.findall(r"\b[a-z]+\b", text)) <= int(N)


@instruction(
    "letters:letter_counting",
    required=("N", "relation"),
    describe=lambda k: f"Answer with {k['relation']} {k['N']} letters.",
)
def _letter_counting(text, N, relation):
    return compare(len(re.findall(r"[a-zA-Z]", text)), relation, N)


@instruction(
    "paragraphs:paragraphs",
    describe=lambda k: "There should be 2 paragraphs. Paragraphs are separated with the markdown divider: ***",
)
def _two_paragraphs_divider(text):
    return _paragraphs_by_divider(text) == 2


@instruction(
    "paragraphs:paragraphs2",
    describe=lambda k: (
        "There should be 2 paragraphs. Paragraphs and only paragraphs are separated with each other by two line breaks."
    ),
)
def _two_paragraphs_blank(text):
    return _paragraphs_by_blank_line(text, strict=True) == 2


GENERATABLE = [spec for spec in REGISTRY.values() if spec.sample is not None]
__all__ = [
    "InstructionError",
    "Instruction",
    "REGISTRY",
    "GENERATABLE",
    "check_instruction",
    "compare",
    "guess_language",
    "split_sentences",
    "words",
]
