"""llm_judge: a judge model grades the answer against a reference answer or a rubric.

Data: rows in the layout of NeMo Gym's `equivalence_llm_judge` (`expected_answer` at the top level
or under `metadata`, optional `options`, `uuid`, `template_metadata.output_regex`), so its
datasets load unchanged; a row with `rubric` instead is graded against the rubric.
`generate(size, seed)` makes small capital-city questions offline.

Verifier (NeMo Gym's semantics): the question is the row's last user message, the answer the
rollout's final text (`msg_extraction_failure` when empty; the last match of the row's
`template_metadata.output_regex`, else of `response_extract_regex`, when set). The judge (one of
the farm's, `judge: NAME`, asked with `ctx.judge`) sees the prompt template filled with question,
expected answer and answer, and the first of its labels decides: `[[A=B]]` equal (reward 1),
`[[A!=B]]` not. With `check_twice_swap` an equal verdict is asked again with the two answers
swapped, and a second "not equal" gives `reward_if_swap_fails`. Rubric rows end with `[[PASS]]`
or `[[FAIL]]`.

Errors are not scores: a judge that fails (past its deadline, refused, an unreadable reply) fails
the rollout as `verifier`. A verdict without a label is one too by default (`unparsed: fail`: a
judge that does not follow its prompt is a broken judge, not a wrong answer); `unparsed: zero`
scores it 0 as NeMo Gym does. A row with neither an expected answer nor a rubric is `malformed`.
"""

from __future__ import annotations

import random
import re
from typing import Any, Literal, Optional, Union

from envs.sdk import AgentSettings, Environment, JudgeFailure, Row, RowError, Transcript, Verdict, ctx

PROMPT = (
    "Judge whether the candidate answer to the question is equivalent to the reference answer: the same "
    "meaning or value, whatever its wording or formatting.\n\n"
    "Question:\n{question}\n\nReference answer (A):\n{expected_answer}\n\nCandidate answer (B):\n{generated_answer}\n\n"
    "Explain briefly, then end with exactly one label: [[A=B]] if they are equivalent, [[A!=B]] if they are not."
)
RUBRIC_PROMPT = (
    "Grade the response to the question against the rubric.\n\n"
    "Question:\n{question}\n\nRubric:\n{rubric}\n\nResponse:\n{generated_answer}\n\n"
    "Explain briefly, then end with exactly one label: [[PASS]] if the response meets the rubric, [[FAIL]] if not."
)
PASS, FAIL = "[[PASS]]", "[[FAIL]]"


class LLMJudgeRow(Row):
    """An equivalence_llm_judge row (its fields; others kept and ignored), or a rubric row."""

    expected_answer: Optional[Union[str, int, float]] = None
    rubric: Optional[str] = None
    question: Optional[str] = None
    options: Optional[list[dict]] = None
    metadata: Optional[dict[str, Any]] = None
    template_metadata: Optional[dict[str, Any]] = None
    uuid: Optional[Union[str, int]] = None

    def expected(self) -> Optional[str]:
        if self.expected_answer not in (None, ""):
            return str(self.expected_answer)
        value = (self.metadata or {}).get("expected_answer")
        return str(value) if value is not None else None


def first_label(text: str, yes: str, no: str) -> Optional[bool]:
    """True or False by the first label in the text; None without one."""
    y, n = text.find(yes), text.find(no)
    if y < 0 and n < 0:
        return None
    return y >= 0 and (n < 0 or y < n)


def last_match(text: str, regex: Optional[str]) -> str:
    """NeMo Gym's extraction: the last match's first non-empty group, else the whole match; the text
    itself when there is no regex or no match."""
    if not regex:
        return text
    try:
        matches = list(re.finditer(regex, text, flags=re.MULTILINE | re.DOTALL))
    except re.error:
        return text
    if not matches:
        return text
    m = matches[-1]
    for group in m.groups():
        if isinstance(group, str) and group.strip():
            return group.strip()
    return m.group(0).strip()


class LLMJudge(Environment):
    name = "llm_judge"
    verifier_version = "1"
    agent = AgentSettings(loop="single_turn", max_steps=1, verify_timeout_s=180.0)  # two judge calls
    row_type = LLMJudgeRow

    def __init__(
        self,
        judge: str = "judge",
        *,
        judge_system_message: Optional[str] = None,
        judge_prompt_template: str = PROMPT,
        judge_equal_label: str = "[[A=B]]",
        judge_not_equal_label: str = "[[A!=B]]",
        question_extract_regex: Optional[str] = None,
        response_extract_regex: Optional[str] = None,
        msg_extraction_failure: str = "[NO VALID ANSWER EXTRACTED]",
        check_twice_swap: bool = False,
        reward_if_swap_fails: float = 0.0,
        unparsed: Literal["fail", "zero"] = "fail",
    ):
        if unparsed not in ("fail", "zero"):
            raise ValueError(f"llm_judge: unparsed must be 'fail' or 'zero', got {unparsed!r}")
        self.judge = judge
        self.system = judge_system_message
        self.template = judge_prompt_template
        self.labels = (judge_equal_label, judge_not_equal_label)
        self.question_regex = question_extract_regex
        self.response_regex = response_extract_regex
        self.no_answer = msg_extraction_failure
        self.swap = check_twice_swap
        self.swap_fails = reward_if_swap_fails
        self.unparsed = unparsed

    def check_row(self, row: dict) -> Any:
        typed = super().check_row(row)
        if typed.expected() is None and not typed.rubric:
            raise RowError("row has neither expected_answer (top level or metadata) nor rubric")
        return typed

    async def verify(self, row: LLMJudgeRow, state: Any, transcript: Transcript) -> Verdict:
        question = last_match(_last_user_text(row.responses_create_params.input), self.question_regex)
        text = transcript.final_text.strip()
        regex = (row.template_metadata or {}).get("output_regex") or self.response_regex
        answer = last_match(text, regex) if text else self.no_answer
        if row.rubric and row.expected() is None:
            prompt = RUBRIC_PROMPT.format(question=question, rubric=row.rubric, generated_answer=answer)
            passed = await self._ask(prompt, (PASS, FAIL))
            verdicts = [PASS if passed else FAIL]
            reward = float(passed)
        else:
            expected = row.expected() or ""
            equal = await self._ask(self._prompt(question, expected, answer), self.labels)
            verdicts = [self.labels[0] if equal else self.labels[1]]
            reward = float(equal)
            if equal and self.swap:
                again = await self._ask(self._prompt(question, answer, expected), self.labels)
                verdicts.append(self.labels[0] if again else self.labels[1])
                reward = 1.0 if again else self.swap_fails
        return Verdict(
            reward=reward,
            components={"judge": reward},
            metrics={"judge_verdicts": verdicts, "judged_answer": answer[:2000]},
        )

    def _prompt(self, question: str, expected: str, answer: str) -> str:
        return self.template.format(question=question, expected_answer=expected, generated_answer=answer)

    async def _ask(self, prompt: str, labels: tuple[str, str]) -> bool:
        messages = [{"role": "user", "content": prompt}]
        if self.system:
            messages.insert(0, {"role": "system", "content": self.system})
        reply = await ctx.judge(self.judge, messages)
        verdict = first_label(reply.text, *labels)
        if verdict is None:
            if self.unparsed == "zero":
                return False
            raise JudgeFailure(self.judge, f"verdict without {labels[0]} or {labels[1]}: {reply.text[:200]!r}")
        return verdict

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        rng = random.Random(seed)
        rows = []
        for i in range(size):
            country, capital = rng.choice(CAPITALS)
            question = f"What is the capital of {country}? Answer in a few words."
            rows.append(
                {
                    "responses_create_params": {"input": [{"role": "user", "content": question}]},
                    "agent_ref": {"type": "responses_api_agents", "name": "llm_judge"},
                    "expected_answer": capital,
                    "uuid": f"{seed}-{i}",
                }
            )
        return rows


def _last_user_text(messages: Any) -> str:
    if isinstance(messages, str):
        return messages.strip()
    users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    texts = [u for u in users if isinstance(u, str)]
    return texts[-1].strip() if texts else ""


CAPITALS = [
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Nigeria", "Abuja"),
    ("Peru", "Lima"),
    ("Norway", "Oslo"),
    ("Egypt", "Cairo"),
    ("Australia", "Canberra"),
    ("Canada", "Ottawa"),
    ("India", "New Delhi"),
    ("Germany", "Berlin"),
]
