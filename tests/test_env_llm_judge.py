"""llm_judge against NeMo Gym's published expectations (resources_servers/equivalence_llm_judge/tests/test_app.py).

NeMo Gym's tests mock the judge server and script its verdicts; here a scripted judge backend
answers the same recorded verdicts (a stand-in, because what is pinned is how verdicts become
rewards; the pool's HTTP path, limit and deadline are tested against real servers in
tests/test_judges.py). Each case: the row, the policy's answer, the judge's replies in order,
NeMo Gym's reward and number of judge evaluations.
"""

import pytest

from envs.llm_judge import LLMJudge, first_label, last_match
from envs.sdk import JudgeFailure, JudgeReply, RowError, Transcript, judging


class RecordedJudge:
    """Answers each request with the next recorded verdict; keeps every request's messages."""

    def __init__(self, replies: list[str]):
        self.replies, self.asked = list(replies), []

    async def ask(self, name, messages, sampling, default=None):
        self.asked.append(messages)
        return JudgeReply(name, self.replies.pop(0), 0.02)


def row(expected="2", question="Q: 1+1?", **extra) -> dict:
    params = {"input": [{"role": "user", "content": question}]} if question is not None else {"input": []}
    return {"responses_create_params": params, "expected_answer": expected, **extra}


def said(text: str) -> Transcript:
    return Transcript(final_text=text, output=[], tool_calls=[])


async def score(env: LLMJudge, judge: RecordedJudge, r: dict, answer: str):
    with judging(judge) as context:
        verdict = await env.score(r, None, said(answer))
    return verdict, context


# NeMo Gym's cases: (test name, options, row, answer, judge replies, reward, evaluations)
CASES = [
    ("test_verify_equal_then_confirm", {}, row(), "It is 2.", ["some text [[A=B]] trailing"], 1.0, 1),
    (
        "test_verify_equal_then_confirm (check_twice_swap)",
        {"check_twice_swap": True},
        row(),
        "It is 2.",
        ["[[A=B]]", "[[A=B]]"],
        1.0,
        2,
    ),
    ("test_verify_not_equal_first", {}, row(), "It is 3.", ["[[A!=B]]"], 0.0, 1),
    (
        "test_unexpected_judge_output_defaults_to_not_equal",
        {"unparsed": "zero"},
        row("x", question=None),
        "text",
        ["no label present"],
        0.0,
        1,
    ),
    (
        "test_swap_fails_uses_configured_reward",
        {"check_twice_swap": True, "reward_if_swap_fails": -1.0},
        row("B", question="Q?"),
        "A",
        ["[[A=B]]", "[[A!=B]]"],
        -1.0,
        2,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_nemo_gym_cases_score_as_nemo_gym_scores_them(case):
    _, options, r, answer, replies, reward, evaluations = case
    judge = RecordedJudge(replies)
    verdict, context = await score(LLMJudge(**options), judge, r, answer)
    assert verdict.reward == reward
    assert len(judge.asked) == evaluations == len(verdict.metrics["judge_verdicts"]) == len(context.calls)
    assert [c["text"] for c in context.calls] == replies  # the raw verdicts are recorded
    assert verdict.components == {"judge": reward}


async def test_the_prompt_carries_question_reference_and_answer_and_swaps_them():
    judge = RecordedJudge(["[[A=B]]", "[[A=B]]"])
    await score(LLMJudge(check_twice_swap=True), judge, row("2"), "It is 2.")
    first, second = (m[-1]["content"] for m in judge.asked)
    assert "Q: 1+1?" in first and first.index("2") < first.index("It is 2.")
    assert second.index("It is 2.") < second.rindex("\n2\n")


async def test_missing_assistant_text_uses_the_extraction_failure_message():
    """NeMo Gym's test_missing_assistant_text_uses_configured_failure_message."""
    judge = RecordedJudge(["[[A!=B]]"])
    verdict, _ = await score(LLMJudge(msg_extraction_failure="[CUSTOM EXTRACTION FAILURE]"), judge, row("x"), "")
    assert "[CUSTOM EXTRACTION FAILURE]" in judge.asked[0][-1]["content"] and verdict.reward == 0.0


async def test_rows_in_nemo_gym_layouts_and_rubric_rows():
    # expected_answer under metadata, options and uuid, as NeMo Gym's LLMJudgeRunRequest takes them.
    judge = RecordedJudge(["[[A=B]]"])
    r = row(None, metadata={"expected_answer": "Paris"}, options=[{"A": "Paris"}], uuid=7)
    del r["expected_answer"]
    verdict, _ = await score(LLMJudge(), judge, r, "Paris.")
    assert verdict.reward == 1.0 and "Paris" in judge.asked[0][-1]["content"]
    # A per-record output_regex picks the answer out of the text.
    judge = RecordedJudge(["[[A=B]]"])
    r = row("42", template_metadata={"output_regex": r"Answer:\s*(\S+)"})
    await score(LLMJudge(), judge, r, "Thinking... Answer: 41\nno wait. Answer: 42")
    assert "Candidate answer (B):\n42\n" in judge.asked[0][-1]["content"]
    # A rubric row.
    judge = RecordedJudge(["Covers both points. [[PASS]]"])
    r = {"responses_create_params": {"input": "Explain tides."}, "rubric": "Mentions the moon and gravity."}
    verdict, _ = await score(LLMJudge(), judge, r, "The moon's gravity pulls the oceans.")
    assert verdict.reward == 1.0 and "Mentions the moon" in judge.asked[0][-1]["content"]
    with pytest.raises(RowError, match="neither expected_answer"):
        LLMJudge().check_row({"responses_create_params": {"input": "q"}})


async def test_an_unparseable_verdict_is_a_verifier_failure_by_default():
    judge = RecordedJudge(["I think they match."])
    with pytest.raises(JudgeFailure, match="judge judge: verdict without") as info:
        await score(LLMJudge(), judge, row(), "2")
    assert info.value.kind == "verifier"
    with pytest.raises(ValueError, match="unparsed"):
        LLMJudge(unparsed="maybe")


def test_labels_and_extraction_as_nemo_gym_reads_them():
    assert first_label("[[A!=B]] ... [[A=B]]", "[[A=B]]", "[[A!=B]]") is False
    assert first_label("x [[A=B]]", "[[A=B]]", "[[A!=B]]") is True
    assert first_label("none", "[[A=B]]", "[[A!=B]]") is None
    assert last_match("a: 1, a: 2", r"a: (\d)") == "2" and last_match("text", "(") == "text"
