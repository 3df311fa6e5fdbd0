"""reasoning_gym: rows from the library by seed, answers extracted and scored by each task's own checker."""

import json

import pytest
from helpers.workers import run_through_worker

from envs.reasoning_gym import ReasoningGym, extract
from envs.sdk import Transcript
from farm.schema import Sampling


def said(text: str) -> Transcript:
    return Transcript(final_text=text, output=[], tool_calls=[])


@pytest.fixture
async def sudoku():
    env = ReasoningGym()
    yield env
    env.pool.close()


def test_generation_is_deterministic_by_seed_and_json_ready():
    env = ReasoningGym()
    a, b, c = env.generate(5, seed=1), env.generate(5, seed=1), env.generate(5, seed=2)
    assert a == b and a != c
    assert json.loads(json.dumps(a)) == a
    r = a[0]
    assert r["metadata"]["source_dataset"] == "mini_sudoku" and r["seed"] == 1
    assert r["agent_ref"] == {"type": "responses_api_agents", "name": "reasoning_gym"}
    system, user = r["responses_create_params"]["input"]
    assert "<answer>" in system["content"] and user["content"] == r["question"]


def test_a_weighted_mix_of_tasks():
    env = ReasoningGym(tasks={"leg_counting": 3.0, "basic_arithmetic": 1.0})
    rows = env.generate(40, seed=3)
    counts = {t: sum(r["metadata"]["source_dataset"] == t for r in rows) for t in ("leg_counting", "basic_arithmetic")}
    assert sum(counts.values()) == 40 and counts["leg_counting"] > counts["basic_arithmetic"] > 0
    assert rows == env.generate(40, seed=3) and rows != env.generate(40, seed=4)
    assert {r["metadata"]["source_dataset"] for r in ReasoningGym(tasks=["gcd", "chain_sum"]).generate(20)} == {
        "gcd",
        "chain_sum",
    }


def test_extraction_prefers_the_answer_tag_then_the_last_box_then_the_text():
    assert extract("<answer>1</answer> then <answer> 2 </answer> \\boxed{3}") == ("2", "answer_tag")
    assert extract("\\boxed{1} and finally \\boxed{\\frac{1}{2}}") == ("\\frac{1}{2}", "boxed")
    assert extract("  42 \n") == ("42", "text")


@pytest.mark.parametrize("task", ["mini_sudoku", "basic_arithmetic", "leg_counting", "gcd", "word_sorting"])
@pytest.mark.slow
async def test_known_correct_answers_get_full_reward(task):
    env = ReasoningGym(task=task)
    try:
        rows = json.loads(json.dumps(env.generate(3, seed=7)))  # as they arrive off the wire
        for r in rows:
            for text in (
                f"Let me think.\n<answer>{r['answer']}</answer>",
                f"So the answer is \\boxed{{{r['answer']}}}",
                r["answer"],
            ):
                v = await env.score(r, None, said(text))
                assert v.reward == 1.0 and v.components == {"score": 1.0} and v.metrics["task"] == task, text
    finally:
        env.pool.close()


@pytest.mark.slow
async def test_known_wrong_answers_get_none(sudoku):
    r = sudoku.generate(1, seed=5)[0]
    grid = [line.split() for line in r["answer"].split("\n")]
    grid[0][0], grid[0][1] = grid[0][1], grid[0][0]  # two cells swapped: breaks the rows' rule
    swapped = "\n".join(" ".join(line) for line in grid)
    partial = await sudoku.score(r, None, said(f"<answer>{swapped}</answer>"))
    assert 0.0 < partial.reward < 1.0  # the task's own partial credit, kept as is
    for text in (
        "<answer>no idea</answer>",
        "I do not know.",
        f"<answer>wrong</answer> even if the text later says \\boxed{{{r['answer']}}}",
        "",
    ):
        v = await sudoku.score(r, None, said(text))
        assert v.reward == 0.0, text
    arithmetic = ReasoningGym(task="basic_arithmetic")
    try:
        r = arithmetic.generate(1, seed=5)[0]
        for text in (f"<answer>{int(r['answer']) + 1}</answer>", "<answer></answer>", "\\boxed{x}"):
            assert (await arithmetic.score(r, None, said(text))).reward == 0.0, text
    finally:
        arithmetic.pool.close()


@pytest.mark.slow
async def test_rows_that_cannot_be_scored_raise(sudoku):
    r = sudoku.generate(1, seed=5)[0]
    with pytest.raises(ValueError, match="source_dataset"):
        await sudoku.score({**r, "metadata": {}}, None, said("<answer>1</answer>"))
    with pytest.raises(ValueError, match="not registered"):
        await sudoku.score({**r, "metadata": {**r["metadata"], "source_dataset": "no_such_task"}}, None, said("1"))


@pytest.mark.slow
@pytest.mark.vllm
def test_worker_runs_reasoning_gym_against_real_vllm(settings, vllm, model_dir):
    rows = ReasoningGym(tasks=["leg_counting", "basic_arithmetic"]).generate(4, seed=2)
    got = run_through_worker(
        settings, vllm, model_dir, "reasoning_gym", rows, sampling=Sampling(max_tokens=32, temperature=0.7)
    )
    for r in got:
        assert r.status.value in ("ok", "truncated"), r.error
        assert 0.0 <= r.reward <= 1.0 and set(r.reward_components) == {"score"}
        assert r.metrics["task"] in ("leg_counting", "basic_arithmetic")
        n = len(r.trace.completion())
        assert n > 0 and len(r.trace.completion_logprobs()) == n and r.worker_id.startswith("reasoning_gym@")
