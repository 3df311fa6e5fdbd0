"""code_gen's data: 26 problem families (clamp, caesar shift, chunking, primes, ...) and the rows
made from them.

Each family is varied by a seed-drawn parameter (the shift, the bounds, the chunk size) and
tested on seed-drawn inputs; expected outputs come from the family's reference solution, so a
row's tests and its reference always agree. Rows carry NeMo Gym code_gen's
`verifier_metadata.unit_tests` in LiveCodeBench's call-based shape ({inputs, outputs, fn_name}).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Callable

SYSTEM = "You are an expert Python programmer. Answer with code only."
INSTRUCTIONS = (
    "Write the complete function (and any imports it needs) in a single ```python code block. "
    "Do not read input or print; the function will be called directly."
)
TESTS_PER_ROW = 6


@dataclass(frozen=True)
class Family:
    """A problem family: signature and statement with a {p} parameter, a reference solution, inputs."""

    id: str
    signature: str  # e.g. "clamp(x)"
    statement: str  # "returns x limited to the range [{lo}, {hi}]"
    solution: str  # reference source, formatted with the parameters
    params: Callable[[random.Random], dict]
    inputs: Callable[[random.Random, dict], tuple]  # one call's arguments

    @property
    def fn_name(self) -> str:
        return self.signature.split("(", 1)[0]


def _ints(rng: random.Random, n: int = 6, lo: int = -20, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(0, n))]


WORDS = ["apple", "banana", "kiwi", "level", "Radar", "tree", "sky", "moon", "a", "noon", "python", "code"]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))


FAMILIES = [
    Family(
        "add_k",
        "add_k(x)",
        "returns x plus {k}",
        "def add_k(x):\n    return x + {k}\n",
        lambda r: {"k": r.randint(2, 99)},
        lambda r, p: (r.randint(-1000, 1000),),
    ),
    Family(
        "clamp",
        "clamp(x)",
        "returns x limited to the closed range [{lo}, {hi}]",
        "def clamp(x):\n    return max({lo}, min({hi}, x))\n",
        lambda r: {"lo": r.randint(-50, 0), "hi": r.randint(1, 50)},
        lambda r, p: (r.randint(-100, 100),),
    ),
    Family(
        "count_vowels",
        "count_vowels(s)",
        "returns how many vowels (a, e, i, o, u, either case) the string s has",
        "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
        lambda r: {},
        lambda r, p: (_text(r),),
    ),
    Family(
        "reverse_words",
        "reverse_words(s)",
        "returns the words of s (split on spaces) in reverse order, joined by one space",
        "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
        lambda r: {},
        lambda r, p: (_text(r),),
    ),
    Family(
        "is_palindrome",
        "is_palindrome(s)",
        "returns True if s reads the same backwards, ignoring case, else False",
        "def is_palindrome(s):\n    t = s.lower()\n    return t == t[::-1]\n",
        lambda r: {},
        lambda r, p: (r.choice(WORDS),),
    ),
    Family(
        "sum_multiples",
        "sum_multiples(n)",
        "returns the sum of all integers from 1 to n-1 divisible by {a} or {b}",
        "def sum_multiples(n):\n    return sum(i for i in range(1, n) if i % {a} == 0 or i % {b} == 0)\n",
        lambda r: {"a": r.randint(2, 5), "b": r.randint(6, 9)},
        lambda r, p: (r.randint(0, 200),),
    ),
    Family(
        "fib",
        "fib(n)",
        "returns the n-th Fibonacci number, with fib(0) == 0 and fib(1) == 1",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        lambda r: {},
        lambda r, p: (r.randint(0, 60),),
    ),
    Family(
        "running_max",
        "running_max(xs)",
        "returns a list whose i-th item is the largest of xs[0..i]",
        "def running_max(xs):\n    out = []\n    for x in xs:\n        out.append(x if not out else max(out[-1], x))\n    return out\n",
        lambda r: {},
        lambda r, p: (_ints(r, 8),),
    ),
    Family(
        "dedupe",
        "dedupe(xs)",
        "returns xs without repeated items, keeping each item's first occurrence, in order",
        "def dedupe(xs):\n    seen, out = set(), []\n    for x in xs:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out\n",
        lambda r: {},
        lambda r, p: (_ints(r, 10, 0, 5),),
    ),
    Family(
        "rotate_left",
        "rotate_left(xs)",
        "returns the list xs rotated left by {k} positions (wrapping around; an empty list stays empty)",
        "def rotate_left(xs):\n    if not xs:\n        return []\n    k = {k} % len(xs)\n    return xs[k:] + xs[:k]\n",
        lambda r: {"k": r.randint(1, 7)},
        lambda r, p: (_ints(r, 8),),
    ),
    Family(
        "count_char",
        "count_char(s)",
        "returns how many times the character '{c}' occurs in s",
        "def count_char(s):\n    return s.count('{c}')\n",
        lambda r: {"c": r.choice("aeno")},
        lambda r, p: (_text(r),),
    ),
    Family(
        "caesar",
        "caesar(s)",
        "shifts every lowercase letter of s forward by {k} places in the alphabet (z wraps to a) and leaves other characters alone",
        "def caesar(s):\n    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)\n",
        lambda r: {"k": r.randint(1, 25)},
        lambda r, p: (_text(r),),
    ),
    Family(
        "digit_sum",
        "digit_sum(n)",
        "returns the sum of the decimal digits of the integer n (ignore the sign)",
        "def digit_sum(n):\n    return sum(int(d) for d in str(abs(n)))\n",
        lambda r: {},
        lambda r, p: (r.randint(-(10**6), 10**6),),
    ),
    Family(
        "is_prime",
        "is_prime(n)",
        "returns True if the integer n is a prime number, else False",
        "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n            return False\n        i += 1\n    return True\n",
        lambda r: {},
        lambda r, p: (r.randint(-3, 120),),
    ),
    Family(
        "second_largest",
        "second_largest(xs)",
        "returns the second largest distinct value in xs, or None if there is none",
        "def second_largest(xs):\n    v = sorted(set(xs))\n    return v[-2] if len(v) >= 2 else None\n",
        lambda r: {},
        lambda r, p: (_ints(r, 6, 0, 9),),
    ),
    Family(
        "flatten",
        "flatten(xss)",
        "returns one list with the items of the lists in xss, in order (one level deep)",
        "def flatten(xss):\n    return [x for xs in xss for x in xs]\n",
        lambda r: {},
        lambda r, p: ([_ints(r, 3) for _ in range(r.randint(0, 4))],),
    ),
    Family(
        "chunk",
        "chunk(xs)",
        "splits the list xs into consecutive chunks of {k} items (the last may be shorter) and returns the list of chunks",
        "def chunk(xs):\n    return [xs[i:i + {k}] for i in range(0, len(xs), {k})]\n",
        lambda r: {"k": r.randint(2, 4)},
        lambda r, p: (_ints(r, 9),),
    ),
    Family(
        "word_count",
        "word_count(s)",
        "returns a dict mapping each word of s (split on spaces, lowercased) to how often it occurs",
        "def word_count(s):\n    out = {{}}\n    for w in s.lower().split():\n        out[w] = out.get(w, 0) + 1\n    return out\n",
        lambda r: {},
        lambda r, p: (_text(r),),
    ),
    Family(
        "is_power",
        "is_power(n)",
        "returns True if the integer n is a power of {b} ({b}**0 == 1 counts), else False",
        "def is_power(n):\n    if n < 1:\n        return False\n    while n % {b} == 0:\n        n //= {b}\n    return n == 1\n",
        lambda r: {"b": r.randint(2, 5)},
        lambda r, p: (r.choice([p["b"] ** r.randint(0, 6), r.randint(-5, 300)]),),
    ),
    Family(
        "ones",
        "ones(n)",
        "returns the number of 1 bits in the binary form of the non-negative integer n",
        "def ones(n):\n    return bin(n).count('1')\n",
        lambda r: {},
        lambda r, p: (r.randint(0, 10**6),),
    ),
    Family(
        "merge_sorted",
        "merge_sorted(a, b)",
        "merges two ascending lists into one ascending list",
        "def merge_sorted(a, b):\n    return sorted(a + b)\n",
        lambda r: {},
        lambda r, p: (sorted(_ints(r)), sorted(_ints(r))),
    ),
    Family(
        "mode",
        "mode(xs)",
        "returns the most common value of the non-empty list xs; on a tie, the smallest of them",
        "def mode(xs):\n    return min(set(xs), key=lambda x: (-xs.count(x), x))\n",
        lambda r: {},
        lambda r, p: ([r.randint(0, 4) for _ in range(r.randint(1, 9))],),
    ),
    Family(
        "scale",
        "scale(xs)",
        "returns a new list with every item of xs multiplied by {k}",
        "def scale(xs):\n    return [x * {k} for x in xs]\n",
        lambda r: {"k": r.randint(-5, 9)},
        lambda r, p: (_ints(r, 7),),
    ),
    Family(
        "count_above",
        "count_above(xs)",
        "returns how many items of xs are strictly greater than {t}",
        "def count_above(xs):\n    return sum(x > {t} for x in xs)\n",
        lambda r: {"t": r.randint(-10, 10)},
        lambda r, p: (_ints(r, 10),),
    ),
    Family(
        "pad_left",
        "pad_left(s)",
        "returns s padded on the left with '*' to a length of {w} (strings already that long are returned unchanged)",
        "def pad_left(s):\n    return s.rjust({w}, '*')\n",
        lambda r: {"w": r.randint(4, 12)},
        lambda r, p: (r.choice(WORDS),),
    ),
    Family(
        "triangle",
        "triangle(n)",
        "returns the sum 1 + 2 + ... + n for n >= 0, times {m}",
        "def triangle(n):\n    return {m} * n * (n + 1) // 2\n",
        lambda r: {"m": r.randint(1, 5)},
        lambda r, p: (r.randint(0, 500),),
    ),
]
BY_ID = {f.id: f for f in FAMILIES}


def reference_solution(row: dict) -> str:
    """The reference program of a generated row (its family's solution, with its parameters)."""
    problem = row["problem"]
    return BY_ID[problem["id"]].solution.format(**problem["params"])


def make_row(family: Family, rng: random.Random) -> dict:
    params = family.params(rng)
    solution = family.solution.format(**params)
    ns: dict[str, Any] = {}
    exec(compile(solution, f"<reference {family.id}>", "exec"), ns)  # our own shipped code, at generation
    fn = ns[family.fn_name]
    calls = [family.inputs(rng, params) for _ in range(TESTS_PER_ROW)]
    inputs = ["\n".join(json.dumps(a) for a in args) for args in calls]
    outputs = [json.dumps(fn(*args)) for args in calls]
    example_args = ", ".join(repr(a) for a in calls[0])
    prompt = (
        f"Write a Python function `{family.signature}` that {family.statement.format(**params)}.\n"
        f"For example, `{family.fn_name}({example_args})` returns `{outputs[0]}`.\n\n{INSTRUCTIONS}"
    )
    return {
        "responses_create_params": {
            "input": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        },
        "agent_ref": {"type": "responses_api_agents", "name": "code_gen"},
        "verifier_metadata": {"unit_tests": {"inputs": inputs, "outputs": outputs, "fn_name": family.fn_name}},
        "problem": {"id": family.id, "params": params},
    }


def generate(size: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [make_row(rng.choice(FAMILIES), rng) for _ in range(size)]
