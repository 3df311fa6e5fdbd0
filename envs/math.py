"""math: answers checked by math-verify (boxed preferred), with an optional LLM judge as a second opinion.

Data: rows in the layout of NeMo Gym's `math_with_judge` (`question`, `expected_answer`), so its
datasets load unchanged; `generate(size, seed)` makes small arithmetic and algebra problems
offline with exact answers (fraction sums, linear equations, powers, percentages, gcd/lcm,
quadratic roots), written as LaTeX (`\\frac{p}{q}`, integers).

Verifier: the last `\\boxed{...}` of the answer is compared with the expected answer by
math-verify (symbolic equality, so `0.75`, `3/4` and `\\frac{3}{4}` agree); an answer without a
box is read as NeMo Gym reads it, by math-verify's expression and LaTeX extraction over the
whole text (its final answer: `The answer is 81.`). SymPy can stall on
hostile input, so the comparison runs in a CpuPool process and is stopped once it has used
`library_timeout_s` seconds of CPU time (not wall time: on a loaded worker a slow but honest
comparison still finishes), or killed past `library_wall_s` of wall time if it blocks
(math-verify's own signal-based timeouts only work in a main thread, hence
`parsing_timeout=None, timeout_seconds=None` there). math-verify catches every Exception and
says "not equal", but the pool's limit cannot be caught (envs/cpu.py), so a slow right answer is
a `verifier` failure, not a 0. setup() warms every pool process with a few comparisons (`warm`),
since a fresh process's first parse alone costs more than a small limit. When the library says
no and a judge is configured, the judge is asked twice with the two answers in swapped order, and
the answers count as equal only when both orders say so, which cancels the judge's position bias.
The judge is one of the farm's (`judge: NAME`, from `judges:` in the settings, asked through
`ctx.judge`: its own concurrency limit, deadline and cache); the older options `judge_url` and
`judge_model` (any OpenAI-compatible server) still work: they define a judge named `math` on the
same pool, used when the settings name none so.

Errors are not scores: an expected answer math-verify cannot parse, a comparison past its time
limit, or a judge that fails (past its deadline, unreachable) raise, and the rollout is recorded
as a `verifier` failure. A model answer that is missing, unparseable or wrong is simply reward 0.
"""

from __future__ import annotations

import logging
import random
from fractions import Fraction
from math import gcd, lcm
from typing import Any, Optional, Union

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from envs.cpu import CpuPool
from envs.sdk import AgentSettings, Environment, JudgeConfig, Row, Transcript, Verdict, ctx, last_boxed


class MathRow(Row):
    """A math row: the answer to compare with (LaTeX or a number) and, for the judge, the question."""

    expected_answer: Union[str, int, float]
    question: Optional[str] = None


PROMPT = (
    "Solve the following math problem. Put the final answer (and only the answer) inside \\boxed{{}}.\n\n{question}"
)

# --- verifier: the library comparison (a module-level function, so it can run in the pool) ---


def strip_delimiters(answer: str) -> str:
    """`$x$` and `\\(x\\)` as x: datasets often wrap expected answers in math delimiters."""
    s = answer.strip()
    if s.startswith("\\(") and s.endswith("\\)"):
        s = s[2:-2].strip()
    if len(s) > 1 and s.startswith("$") and s.endswith("$"):
        s = s.strip("$").strip()
    return s


def compare(expected: str, boxed: Optional[str], text: str = "") -> bool:
    """math-verify equality of `\\boxed{expected}` and `\\boxed{boxed}`; runs in a CpuPool process.
    Without a box, the answer's text is read as NeMo Gym reads it: math-verify's expression and
    LaTeX extraction over the whole text (its last final answer).

    Raises ValueError when the expected answer does not parse (math-verify then returns only its
    string fallback, no SymPy object): that is a broken row, not a wrong answer. math-verify is
    imported at module level so that pool processes, forked from the worker, start with it loaded.
    """
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold = parse(f"\\boxed{{{strip_delimiters(expected)}}}", [LatexExtractionConfig()], parsing_timeout=None)
    if not any(not isinstance(g, str) for g in gold):
        raise ValueError(f"expected answer {expected!r} does not parse with math-verify")
    if boxed is None:
        if not text.strip():
            return False
        pred = parse(text, [ExprExtractionConfig(), LatexExtractionConfig()], parsing_timeout=None)
        return bool(pred) and verify(gold, pred, timeout_seconds=None)
    pred = parse(f"\\boxed{{{boxed}}}", [LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None)
    return bool(pred) and verify(gold, pred, timeout_seconds=None)


def warm() -> None:
    """A pool process's first comparisons, so that the limit later measures comparisons only: the
    first parse of each kind (integers, fractions, decimals, roots, a plain-text answer) loads
    parsers and SymPy code. Raises when math-verify cannot compare at all."""
    for expected, boxed, text in [
        ("2", "2", ""),
        ("\\frac{3}{4}", "0.75", ""),
        ("2\\sqrt{2}", "\\sqrt{8}", ""),
        ("x^2+1", "1+x^{2}", ""),
        ("81", None, "The answer is 81."),
    ]:
        if not compare(expected, boxed, text):
            raise RuntimeError(f"math-verify does not find {boxed or text!r} equal to {expected!r}")


# --- verifier: the LLM judge ---

JUDGE_SYSTEM = (
    "You compare two answers to a math problem and decide whether they are mathematically equivalent. "
    "Ignore formatting and wording; only the mathematical value matters. Think briefly, then end with "
    "exactly one verdict label: [[A=B]] if the answers are equivalent, [[A!=B]] if they are not."
)
JUDGE_USER = "Problem:\n{question}\n\nAnswer A:\n{first}\n\nAnswer B:\n{second}"
EQUAL, DIFFERENT = "[[A=B]]", "[[A!=B]]"
JUDGE_SAMPLING = {"temperature": 0.0, "max_tokens": 256}
IMPLICIT_JUDGE = "math"  # the judge `judge_url`/`judge_model` define, when `judges:` has none by that name


def judge_messages(question: str, first: str, second: str) -> list[dict]:
    user = JUDGE_USER.format(question=question, first=first, second=second)
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def read_verdict(text: str) -> str:
    """'equal', 'different', or 'unparsed' (no label: counted as not equal, as NeMo Gym does);
    the first label decides."""
    eq, ne = text.find(EQUAL), text.find(DIFFERENT)
    if eq < 0 and ne < 0:
        return "unparsed"
    return "equal" if eq >= 0 and (ne < 0 or eq < ne) else "different"


async def ask(judge: str, question: str, first: str, second: str) -> str:
    reply = await ctx.judge(judge, judge_messages(question, first, second), **JUDGE_SAMPLING)
    return read_verdict(reply.text)


async def equivalent(judge: str, question: str, expected: str, answer: str) -> tuple[bool, list[str]]:
    """Both orders must say equal; the second is asked only when the first does."""
    first = await ask(judge, question, expected, answer)
    if first != "equal":
        return False, [first]
    second = await ask(judge, question, answer, expected)
    return second == "equal", [first, second]


# --- the environment ---


class Math(Environment):
    name = "math"
    verifier_version = "1"
    agent = AgentSettings(loop="single_turn", max_steps=1, verify_timeout_s=120.0)  # judge included
    row_type = MathRow
    compare = staticmethod(compare)  # the library comparison; any module-level function can stand in

    def __init__(
        self,
        judge_url: Optional[str] = None,
        judge_model: Optional[str] = None,
        *,
        judge: Optional[str] = None,
        library_timeout_s: float = 10.0,
        library_wall_s: Optional[float] = None,
    ):
        if judge_url:
            if not judge_model:
                raise ValueError("math: judge_url needs judge_model (the model name the judge server serves)")
            self.judges = {IMPLICIT_JUDGE: JudgeConfig(urls=[judge_url], model=judge_model, deadline_s=60.0)}
            judge = judge or IMPLICIT_JUDGE
        self.judge = judge  # a judge's name (`judges:` in the settings); None: the library alone
        self.library_timeout_s = library_timeout_s  # CPU seconds per answer
        self.library_wall_s = library_wall_s  # wall-clock backstop; CpuPool's default when None
        self.pool = CpuPool(warmup=warm)

    async def setup(self) -> None:
        await self.pool.start()

    async def aclose(self) -> None:
        await self.pool.aclose()

    async def verify(self, row: MathRow, state: Any, transcript: Transcript) -> Verdict:
        expected = str(row.expected_answer)
        boxed = last_boxed(transcript.final_text)
        text = transcript.final_text if boxed is None else ""
        library = await self.pool.run(
            self.compare, expected, boxed, text, cpu_s=self.library_timeout_s, wall_s=self.library_wall_s
        )
        components = {"library": float(library)}
        metrics: dict[str, Any] = {"has_boxed": boxed is not None, "extracted_answer": boxed}
        correct = library
        if not library and self.judge is not None and transcript.final_text.strip():
            question = row.question or _last_user_text(row.responses_create_params.input)
            correct, verdicts = await equivalent(self.judge, question, expected, boxed or transcript.final_text)
            components["judge"] = float(correct)
            metrics["judge_verdicts"] = verdicts
        return Verdict(reward=float(correct), components=components, metrics=metrics)

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        return generate(size, seed)


def _last_user_text(messages: Any) -> str:
    if isinstance(messages, str):
        return messages
    users = [m.get("content", "") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users and isinstance(users[-1], str) else ""


# --- data: small problems with exact answers, made offline ---


def latex(x: Fraction) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    sign = "-" if x < 0 else ""
    return f"{sign}\\frac{{{abs(x.numerator)}}}{{{x.denominator}}}"


def _nonzero(rng: random.Random, lo: int, hi: int) -> int:
    return rng.choice([n for n in range(lo, hi + 1) if n != 0])


def _fraction_sum(rng):
    a, c = rng.randint(1, 9), rng.randint(1, 9)
    b, d = rng.randint(2, 12), rng.randint(2, 12)
    op = rng.choice("+-")
    value = Fraction(a, b) + Fraction(c, d) if op == "+" else Fraction(a, b) - Fraction(c, d)
    return f"Compute $\\frac{{{a}}}{{{b}}} {op} \\frac{{{c}}}{{{d}}}$ and simplify the result.", value


def _linear(rng):
    a, b, c = _nonzero(rng, -9, 9), rng.randint(-20, 20), rng.randint(-30, 30)
    lhs = f"{a}x" if a not in (1, -1) else ("x" if a == 1 else "-x")
    lhs += f" + {b}" if b > 0 else (f" - {-b}" if b < 0 else "")
    return f"Solve for $x$: ${lhs} = {c}$.", Fraction(c - b, a)


def _power(rng):
    if rng.random() < 0.5:
        base, exp = rng.randint(2, 9), rng.randint(2, 5)
        return f"Compute ${base}^{{{exp}}}$.", Fraction(base) ** exp
    p, q, exp = rng.randint(1, 5), rng.randint(2, 7), rng.randint(2, 3)
    return f"Compute $\\left(\\frac{{{p}}}{{{q}}}\\right)^{{{exp}}}$.", Fraction(p, q) ** exp


def _percent(rng):
    p, n = rng.choice([5, 10, 12, 15, 20, 25, 30, 40, 50, 75]), rng.randint(2, 60) * 10
    return f"What is ${p}\\%$ of ${n}$?", Fraction(p * n, 100)


def _gcd_lcm(rng):
    a, b = rng.randint(4, 90), rng.randint(4, 90)
    if rng.random() < 0.5:
        return f"What is the greatest common divisor of ${a}$ and ${b}$?", Fraction(gcd(a, b))
    return f"What is the least common multiple of ${a}$ and ${b}$?", Fraction(lcm(a, b))


def _quadratic(rng):
    r1, r2 = rng.randint(-9, 9), rng.randint(-9, 9)
    s, p = -(r1 + r2), r1 * r2
    poly = (
        "x^2"
        + (f" + {s}x" if s > 0 else f" - {-s}x" if s < 0 else "")
        + (f" + {p}" if p > 0 else f" - {-p}" if p < 0 else "")
    )
    return f"What is the largest root of ${poly} = 0$?", Fraction(max(r1, r2))


KINDS = {
    "fraction_sum": _fraction_sum,
    "linear_equation": _linear,
    "power": _power,
    "percent": _percent,
    "gcd_lcm": _gcd_lcm,
    "quadratic_root": _quadratic,
}


def generate(size: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        kind = rng.choice(sorted(KINDS))
        question, value = KINDS[kind](rng)
        rows.append(
            {
                "responses_create_params": {"input": [{"role": "user", "content": PROMPT.format(question=question)}]},
                "agent_ref": {"type": "responses_api_agents", "name": "math"},
                "question": question,
                "expected_answer": latex(value),
                "metadata": {"kind": kind},
            }
        )
    return rows
