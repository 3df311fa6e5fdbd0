"""mcqa: multiple-choice questions, options A..J, graded by the letter the model picks.

Data: rows in the layout of NeMo Gym's mcqa resources server, so its datasets (e.g.
Nemotron-RL-knowledge-mcqa) load unchanged: `options` (a list of one-key dicts,
`[{"A": "Paris"}, {"B": "Lima"}]`), `expected_answer` (the letter), `grading_mode`, optional
`template_metadata.output_regex` (a custom answer pattern), `uuid` and free `metadata`.
`generate(size, seed)` makes simple questions offline (arithmetic, capitals, primes, largest
number, unit conversions) with 4 to 10 options and a mix of grading modes.

Grading (the answer's letter must be one of the row's option letters):
  template_metadata.output_regex  when present, first: case-insensitive, the last match wins; its
                                  first group is a letter, or an option's text;
  strict_single_letter_boxed      the last `\\boxed{...}` holds a letter: `\\boxed{B}`,
                                  `\\boxed{\\text{B}}`, `\\boxed{(B)}`, `\\boxed{B: Paris}`;
  lenient_boxed                   strict, else the boxed text contains exactly one option's text;
  lenient_answer_colon            the last `Answer: X` line, X a letter or an option's exact text.
Unlike NeMo Gym, which falls back to the grading mode, an invalid regex, an unknown grading
mode or options that do not hold the expected letter are errors of the row: the verifier
raises and the rollout is recorded as failed with the reason.
"""

from __future__ import annotations

import random
import re
import uuid
from typing import Any, Optional

from envs.sdk import AgentSettings, Environment, Row, Transcript, Verdict

MODES = ("strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon")
LETTERS = "ABCDEFGHIJ"

# --- verifier ---

_TEXT_WRAP = re.compile(r"\\text(?:bf)?\{\s*(.*?)\s*\}", re.S)
_BARE_LETTER = re.compile(r"[^A-Za-z]*([A-Z])[^A-Za-z]*")
_LABELLED_LETTER = re.compile(r"[^A-Za-z]*([A-Z])\s*[:).\-]")
_ANSWER_COLON = re.compile(r"answer\s*:\s*(.+)", re.I)


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


def last_boxed(text: str) -> Optional[str]:
    """The content of the last `\\boxed{...}`, braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


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


def answer_colon(text: str, options: dict[str, str]) -> Optional[str]:
    found = _ANSWER_COLON.findall(text)
    if not found:
        return None
    candidate = _unwrap(found[-1].strip().strip("*_ ").rstrip("."))
    m = re.fullmatch(r"\(?([A-Za-z])\)?", candidate) or _LABELLED_LETTER.match(candidate)
    if m and m.group(1).upper() in options:
        return m.group(1).upper()
    return _by_text(candidate, options, contains=False)


def custom_regex(text: str, patterns: Any, options: dict[str, str]) -> Optional[str]:
    """`template_metadata.output_regex` (one pattern or a list, tried in order); the last match wins."""
    for pattern in [patterns] if isinstance(patterns, str) else list(patterns):
        try:
            matches = re.findall(pattern, text, re.I)
        except re.error as exc:
            raise ValueError(f"template_metadata.output_regex {pattern!r} is not a valid regex: {exc}") from None
        if not matches:
            continue
        captured = matches[-1]
        captured = (captured[0] if isinstance(captured, tuple) else captured).strip()
        if len(captured) == 1 and captured.upper() in options:
            return captured.upper()
        letter = _by_text(captured, options, contains=False)
        if letter is not None:
            return letter
    return None


GRADERS = {
    "strict_single_letter_boxed": strict_boxed,
    "lenient_boxed": lenient_boxed,
    "lenient_answer_colon": answer_colon,
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
            raise ValueError(f"unknown grading_mode {self.grading_mode!r}; known: {', '.join(MODES)}")


def grade(text: str, row: MCQARow) -> tuple[Optional[str], str]:
    """(the letter picked or None, how it was found); raises ValueError on a malformed output_regex."""
    options = options_map(row.options)
    mode = row.grading_mode or MODES[0]
    regex = (row.template_metadata or {}).get("output_regex")
    if regex:
        letter = custom_regex(text, regex, options)
        if letter is not None:
            return letter, "output_regex"
    return GRADERS[mode](text, options), mode


class MCQA(Environment):
    name = "mcqa"
    agent = AgentSettings(loop="single_turn", max_steps=1, verify_timeout_s=10.0)
    row_type = MCQARow

    def __init__(self, grading_mode: Optional[str] = None):
        """`grading_mode` fixes the mode of generated rows; by default they mix all modes and templates."""
        if grading_mode is not None and grading_mode not in GRADERS:
            raise ValueError(f"unknown grading_mode {grading_mode!r}; known: {', '.join(MODES)}")
        self.grading_mode = grading_mode

    async def verify(self, row: MCQARow, state: Any, transcript: Transcript) -> Verdict:
        letter, how = grade(transcript.final_text, row)
        correct = letter is not None and letter == row.expected_answer.strip().upper()
        return Verdict(
            reward=float(correct),
            components={"correct": float(correct)},
            metrics={"extracted_answer": letter, "graded_by": how, "answered": letter is not None},
        )

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        return generate(size, seed, self.grading_mode)


# --- data: simple questions, made offline ---

CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Peru": "Lima",
    "Norway": "Oslo",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Canada": "Ottawa",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Chile": "Santiago",
    "Germany": "Berlin",
    "Greece": "Athens",
    "Poland": "Warsaw",
    "Ireland": "Dublin",
    "Portugal": "Lisbon",
    "Austria": "Vienna",
    "Thailand": "Bangkok",
    "Argentina": "Buenos Aires",
    "Australia": "Canberra",
    "Mexico": "Mexico City",
    "India": "New Delhi",
    "Sweden": "Stockholm",
}
UNITS = [
    ("minutes", "hours", 60),
    ("seconds", "minutes", 60),
    ("centimetres", "metres", 100),
    ("grams", "kilograms", 1000),
    ("hours", "days", 24),
    ("days", "weeks", 7),
]

INSTRUCTIONS = {
    "strict_single_letter_boxed": "Think step by step, then put only the letter of your final answer inside \\boxed{}.",
    "lenient_boxed": "Put your final answer (its letter or its text) inside \\boxed{}.",
    "lenient_answer_colon": "Finish with a line of the form 'Answer: X', where X is the letter of your choice.",
}
TEMPLATES = [  # custom formats through template_metadata.output_regex, as NeMo Gym datasets carry them
    (
        'Select one option and conclude with "Final Choice: X" where X is the option letter.',
        r"Final Choice:\s*([A-Za-z])",
    ),
    ('Conclude with "ANSWER IS X" on the final line, where X is the option letter.', r"ANSWER IS\s*([A-Za-z])"),
]


def _distinct(rng: random.Random, correct, make, n: int) -> list:
    values = [correct]
    for _ in range(1000):
        if len(values) == n:
            break
        v = make()
        if v not in values:
            values.append(v)
    rng.shuffle(values)
    return values


def _arithmetic(rng, n):
    a, b = rng.randint(3, 19), rng.randint(3, 19)
    return f"What is {a} × {b}?", a * b, lambda: a * b + rng.choice([-1, 1]) * rng.randint(1, 20)


def _capital(rng, n):
    country = rng.choice(sorted(CAPITALS))
    others = sorted(set(CAPITALS.values()) - {CAPITALS[country]})
    return f"What is the capital of {country}?", CAPITALS[country], lambda: rng.choice(others)


def _prime(rng, n):
    prime = rng.choice([p for p in range(11, 100) if all(p % d for d in range(2, p))])
    composites = [c for c in range(10, 100) if any(c % d == 0 for d in range(2, c))]
    return "Which of these numbers is prime?", prime, lambda: rng.choice(composites)


def _largest(rng, n):
    values = rng.sample(range(100, 1000), n)
    pool = [v for v in values if v != max(values)]
    return "Which of these numbers is the largest?", max(values), lambda: pool.pop() if pool else rng.randint(0, 99)


def _units(rng, n):
    small, big, factor = rng.choice(UNITS)
    k = rng.randint(2, 9)
    return f"How many {small} are in {k} {big}?", k * factor, lambda: rng.randint(1, 15) * factor


KINDS = {"arithmetic": _arithmetic, "capital": _capital, "prime": _prime, "largest": _largest, "units": _units}


def generate(size: int, seed: int = 0, grading_mode: Optional[str] = None) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        n = rng.randint(4, 10)
        kind = rng.choice(sorted(KINDS))
        question, correct, make = KINDS[kind](rng, n)
        values = _distinct(rng, correct, make, n)
        options = [{LETTERS[i]: str(v)} for i, v in enumerate(values)]
        expected = LETTERS[values.index(correct)]
        mode = grading_mode or rng.choice(MODES)
        template = rng.choice(TEMPLATES) if grading_mode is None and rng.random() < 0.2 else None
        listing = "\n".join(f"{k}: {v}" for o in options for k, v in o.items())
        instruction = template[0] if template else INSTRUCTIONS[mode]
        row = {
            "responses_create_params": {
                "input": [{"role": "user", "content": f"{question}\n{listing}\n\n{instruction}"}]
            },
            "agent_ref": {"type": "responses_api_agents", "name": "mcqa"},
            "options": options,
            "expected_answer": expected,
            "grading_mode": mode,
            "uuid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            "metadata": {"kind": kind},
        }
        if template:
            row["template_metadata"] = {
                "output_regex": template[1],
                "template_id": f"farm_mcqa_{TEMPLATES.index(template)}",
                "format_type": "mcqa",
            }
        rows.append(row)
    return rows
