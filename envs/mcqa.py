"""mcqa: multiple-choice questions, options A..J, graded by the letter the model picks.

Data: rows in the layout of NeMo Gym's mcqa resources server, so its datasets (e.g.
Nemotron-RL-knowledge-mcqa) load unchanged: `options` (a list of one-key dicts,
`[{"A": "Paris"}, {"B": "Lima"}]`), `expected_answer` (the letter), `grading_mode`, optional
`template_metadata.output_regex` (a custom answer pattern), `uuid` and free `metadata`.
`generate(size, seed)` makes simple questions offline (envs/mcqa_data.py: arithmetic, capitals,
primes, largest number, unit conversions) with 4 to 10 options and a mix of grading modes, or
fewer options, chosen kinds and a simpler answer format for small models.

Grading, as NeMo Gym's mcqa server grades (the answer's letter must be one of the row's option
letters; an empty answer scores 0):
  template_metadata.output_regex  when present, first: one pattern or a list tried in order,
                                  case-insensitive, the last match wins; its group is a letter
                                  (localized letters such as Arabic or full-width ones read as
                                  A-D) or an option's text. An invalid pattern is skipped, and the
                                  grading mode decides (`bad_output_regex` in the metrics);
  strict_single_letter_boxed      the last `\\boxed{...}` holds a letter: `\\boxed{B}`,
                                  `\\boxed{\\text{B}}`, `\\boxed{(B)}`, `\\boxed{B: Paris}`;
  lenient_boxed                   strict, else the boxed text contains exactly one option's text;
  lenient_answer_colon            the FIRST `Answer: X`, X exactly a letter or an option's text
                                  (`**Answer: C**` is not read: use the _md mode for markdown);
  lenient_answer_colon_md         the LAST `Answer: X` (markdown `**Answer:**` and `__Answer__:`
                                  too) that yields a letter: X's leading letter, else its last
                                  standalone capital; a list of choices (`A/B`, `A or B`) is none.
`MCQA(grading_mode=...)` sets the mode for every row, as NeMo Gym's server-level
`grading_mode` does. Kept apart from NeMo Gym: an unknown grading mode, or options that do not
hold the expected letter, is an error of the row (recorded as a failed rollout with the reason),
not a silent 0.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Union

from envs.mcqa_data import LETTERS, MODES, Shape, generate
from envs.sdk import AgentSettings, Environment, Row, Transcript, Verdict, last_boxed

# --- verifier ---

_TEXT_WRAP = re.compile(r"\\text(?:bf)?\{\s*(.*?)\s*\}", re.S)
_BARE_LETTER = re.compile(r"[^A-Za-z]*([A-Z])[^A-Za-z]*")
_LABELLED_LETTER = re.compile(r"[^A-Za-z]*([A-Z])\s*[:).\-]")
_ANSWER_COLON = re.compile(r"answer\s*:\s*(.+)", re.I)
_ANSWER_COLON_MD = re.compile(r"[*_]{0,2}Answer[*_]{0,2}\s*:[*_\s]{0,2}(.+)", re.I | re.M)
_STANDALONE = re.compile(r"(?<![A-Za-z])([A-Za-z])(?![A-Za-z])")
_LEADING = re.compile(r"([a-zA-Z])(?![a-zA-Z0-9])")
_LAST_CAPITAL = re.compile(r"\b[A-Z]\b(?!.*\b[A-Z]\b)", re.S)
_LIST_SEPARATOR = re.compile(r"\s*[/|&,;]\s*|\s+(?:or|and)\s+|\s+", re.I)
# Option letters as other scripts write them (Arabic, Bengali, full-width), read as A-D.
LOCALIZED = {"أ": "A", "ب": "B", "ج": "C", "د": "D", "অ": "A", "ব": "B", "ড": "C", "ঢ": "D",
             "Ａ": "A", "Ｂ": "B", "Ｃ": "C", "Ｄ": "D"}  # fmt: skip


def options_map(options: Any) -> dict[str, str]:
    """NeMo Gym's `[{"A": text}, ...]` as {"A": text}; a malformed list raises ValueError."""
    if not isinstance(options, list) or not options:
        raise ValueError('row lacks `options` (a list of one-key dicts such as {"A": "..."})')
    out = {}
    for entry in options:
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ValueError(f'malformed option {entry!r}: expected a one-key dict such as {{"A": "..."}}')
        ((letter, text),) = entry.items()
        if not (isinstance(letter, str) and len(letter) == 1 and letter.isalpha()):
            raise ValueError(f"malformed option letter {letter!r}")
        out[letter.upper()] = "" if text is None else str(text)
    return out


def _norm(s: str) -> str:
    return " ".join(s.lower().split())


def _unwrap(s: str) -> str:
    while (m := _TEXT_WRAP.fullmatch(s.strip())) is not None:
        s = m.group(1)
    return s.strip()


def _by_text(candidate: str, options: dict[str, str], *, contains: bool) -> Optional[str]:
    """The one option whose text equals (or is contained in) the candidate; None if none or several."""
    cand = _norm(candidate)
    hits = {k for k, v in options.items() if _norm(v) and (_norm(v) in cand if contains else _norm(v) == cand)}
    return hits.pop() if len(hits) == 1 else None


def strict_boxed(text: str, options: dict[str, str]) -> Optional[str]:
    inner = last_boxed(text)
    if inner is None:
        return None
    inner = _unwrap(inner)
    m = _BARE_LETTER.fullmatch(inner) or _LABELLED_LETTER.match(inner)
    letter = m.group(1).upper() if m else None
    return letter if letter in options else None


def lenient_boxed(text: str, options: dict[str, str]) -> Optional[str]:
    letter = strict_boxed(text, options)
    if letter is None and (inner := last_boxed(text)) is not None:
        letter = _by_text(_unwrap(inner), options, contains=True)
    return letter


def localized(text: str) -> str:
    """Option letters written in other scripts as A-D."""
    return "".join(f" {LOCALIZED[c]}" if c in LOCALIZED else c for c in text).strip()


def answer_colon(text: str, options: dict[str, str]) -> Optional[str]:
    """The first `Answer: X`: X exactly one option letter, or exactly one option's text."""
    m = _ANSWER_COLON.search(text)
    if m is None:
        return None
    candidate = _unwrap(m.group(1)).strip()
    if len(candidate) == 1 and candidate.upper() in options:
        return candidate.upper()
    return next((k for k, v in options.items() if _norm(v) == _norm(candidate)), None)


def _is_choice_list(text: str, options: dict[str, str]) -> bool:
    """Two different option letters next to each other with only a separator between: `A/B`, `A or B`."""
    found = [(m.group(1).upper(), m.span(1)) for m in _STANDALONE.finditer(text) if m.group(1).upper() in options]
    return any(
        a != b and _LIST_SEPARATOR.fullmatch(text[sa[1] : sb[0]]) is not None
        for (a, sa), (b, sb) in zip(found, found[1:])
    )


def choice_letter(payload: str, options: dict[str, str]) -> Optional[str]:
    """The one option letter an answer payload names: `B`, `B because ...`, `(D)`, `$D$`; None for a list."""
    candidate = localized(payload).strip().strip("*_` \t\n\r.,;:")
    if _is_choice_list(candidate, options):
        return None
    if len(candidate) == 1:
        letter: Optional[str] = candidate
    elif (m := _LEADING.match(candidate)) is not None:
        letter = m.group(1)
    else:
        letter = m.group(0) if (m := _LAST_CAPITAL.search(candidate)) is not None else None
    return letter.upper() if letter and letter.upper() in options else None


def answer_colon_md(text: str, options: dict[str, str]) -> Optional[str]:
    """The last markdown-aware `Answer: X` that names one option letter."""
    for payload in reversed(_ANSWER_COLON_MD.findall(text)):
        letter = choice_letter(payload, options)
        if letter is not None:
            return letter
    return None


def custom_regex(text: str, patterns: Any, options: dict[str, str], bad: Optional[list] = None) -> Optional[str]:
    """`template_metadata.output_regex` (one pattern or a list, tried in order); the last match wins.
    A pattern that does not compile is skipped (and added to `bad`)."""
    for pattern in [patterns] if isinstance(patterns, str) else list(patterns):
        try:
            matches = re.findall(pattern, text, re.I)
        except (re.error, TypeError):
            if bad is not None:
                bad.append(pattern)
            continue
        if not matches:
            continue
        captured = matches[-1]
        captured = localized((captured[0] if isinstance(captured, tuple) else captured).strip()).upper()
        if len(captured) == 1 and captured.isalpha():
            return captured
        letter = next((k for k, v in options.items() if _norm(v) == _norm(captured)), None)
        if letter is not None:
            return letter
    return None


GRADERS = {
    "strict_single_letter_boxed": strict_boxed,
    "lenient_boxed": lenient_boxed,
    "lenient_answer_colon": answer_colon,
    "lenient_answer_colon_md": answer_colon_md,
}


class MCQARow(Row):
    """An mcqa row as NeMo Gym lays it out: one-key option dicts, the right letter, how to grade."""

    options: Optional[list[dict[str, Any]]] = None
    expected_answer: str = ""
    grading_mode: Optional[str] = None
    template_metadata: Optional[dict[str, Any]] = None

    def __post_init__(self) -> None:
        letters = options_map(self.options)
        if self.expected_answer.strip().upper() not in letters:
            raise ValueError(f"expected_answer {self.expected_answer!r} is not one of the options {sorted(letters)}")
        if self.grading_mode is not None and self.grading_mode not in GRADERS:
            raise ValueError(f"unknown grading_mode {self.grading_mode!r}; known: {', '.join(GRADERS)}")


def grade(text: str, row: MCQARow, mode: Optional[str] = None, bad: Optional[list] = None) -> tuple[Optional[str], str]:
    """(the letter picked or None, how it was found); `mode` (the server's) overrides the row's."""
    options = options_map(row.options)
    mode = mode or row.grading_mode or MODES[0]
    if not text.strip():
        return None, mode
    regex = (row.template_metadata or {}).get("output_regex")
    if regex:
        letter = custom_regex(text, regex, options, bad)
        if letter is not None:
            return letter, "output_regex"
    return GRADERS[mode](text, options), mode


class MCQA(Environment):
    name = "mcqa"
    verifier_version = "1"
    agent = AgentSettings(loop="single_turn", max_steps=1, verify_timeout_s=10.0)
    row_type = MCQARow

    def __init__(
        self,
        grading_mode: Optional[str] = None,
        options: Union[int, list[int], None] = None,
        kinds: Optional[list[str]] = None,
        answer_format: Optional[str] = None,
    ):
        """`grading_mode` grades every row in that mode (NeMo Gym's server-level setting) and fixes the
        mode of generated rows; unset, each row's own mode grades it and generated rows mix them.
        `options`, `kinds` and `answer_format` shape generated rows (envs/mcqa_data.py)."""
        if grading_mode is not None and grading_mode not in GRADERS:
            raise ValueError(f"unknown grading_mode {grading_mode!r}; known: {', '.join(GRADERS)}")
        self.grading_mode = grading_mode
        self.shape = Shape.of(options, kinds, answer_format)

    async def verify(self, row: MCQARow, state: Any, transcript: Transcript) -> Verdict:
        bad: list = []
        letter, how = grade(transcript.final_text, row, self.grading_mode, bad)
        correct = letter is not None and letter == row.expected_answer.strip().upper()
        metrics = {"extracted_answer": letter, "graded_by": how, "answered": letter is not None}
        if bad:
            metrics["bad_output_regex"] = [str(p)[:200] for p in bad]
        return Verdict(reward=float(correct), components={"correct": float(correct)}, metrics=metrics)

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        return generate(size, seed, self.grading_mode, self.shape)


__all__ = ["LETTERS", "MCQA", "MCQARow", "MODES", "generate", "grade"]
