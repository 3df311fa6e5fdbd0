"""math: math-verify on the last \\boxed{}, killed at its time limit, an LLM judge asked in both orders."""

import asyncio
import json
import multiprocessing
import os
import time

import pytest
from helpers.policies import ScriptedPolicy
from helpers.workers import run_through_worker

import envs.math as math_env
from envs.cpu import VerifierTimeout
from envs.math import Math, generate
from envs.sdk import AgentSettings, JudgeConfig, JudgeFailure, JudgeReply, RowError, Transcript, judging, last_boxed
from farm.errors import RolloutFailure
from farm.schema import Sampling, Task
from workers.loops.agent import AgentContext
from workers.loops.loop import AgentLoop
from workers.policy.judges import JudgePool


def said(text: str) -> Transcript:
    return Transcript(final_text=text, output=[], tool_calls=[])


def row(expected: str, question: str = "Compute it.") -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": question}]},
        "question": question,
        "expected_answer": expected,
    }


@pytest.fixture
def make_math():
    """Math environments whose verifier pools are shut down after the test."""
    made: list[Math] = []

    def make(**options) -> Math:
        made.append(Math(**options))
        return made[-1]

    yield make
    for e in made:
        e.pool.close()


@pytest.fixture
def env(make_math):
    return make_math()


def test_generation_is_deterministic_by_seed():
    a, b, c = generate(20, seed=1), generate(20, seed=1), generate(20, seed=2)
    assert a == b and a != c
    assert json.loads(json.dumps(a)) == a
    kinds = {r["metadata"]["kind"] for r in generate(60, seed=0)}
    assert kinds == set(math_env.KINDS)
    for r in a:
        assert r["agent_ref"] == {"type": "responses_api_agents", "name": "math"}
        assert r["question"] in r["responses_create_params"]["input"][0]["content"]
        assert "\\boxed{}" in r["responses_create_params"]["input"][0]["content"]


@pytest.mark.slow
async def test_every_generated_answer_verifies_against_itself(env):
    rows = generate(12, seed=4)
    verdicts = await asyncio.gather(*(env.score(r, None, said(f"So \\boxed{{{r['expected_answer']}}}.")) for r in rows))
    assert [v.reward for v in verdicts] == [1.0] * len(rows)


@pytest.mark.parametrize(
    "expected, answer",
    [
        ("\\frac{3}{4}", "The result is \\boxed{0.75}"),
        ("\\frac{3}{4}", "\\boxed{3/4}"),
        ("-\\frac{7}{2}", "x = -3.5, so \\boxed{-\\dfrac{7}{2}}"),
        ("81", "3^4 = \\boxed{81}"),
        ("5", "Solving gives \\boxed{x = 5}"),
        ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"),
        ("$12$", "first \\boxed{7}, no wait: \\boxed{12}"),
    ],
)
@pytest.mark.slow
async def test_known_correct_answers_get_full_reward(env, expected, answer):
    v = await env.score(row(expected), None, said(answer))
    assert v.reward == 1.0 and v.components == {"library": 1.0} and v.metrics["has_boxed"]


@pytest.mark.parametrize(
    "expected, answer",
    [("81", "The answer is 81."), ("\\frac{1}{2}", "So x = 1/2"), ("12", "First 7, then finally $12$")],
)
@pytest.mark.slow
async def test_a_plain_final_answer_counts_as_nemo_gym_reads_it(env, expected, answer):
    v = await env.score(row(expected), None, said(answer))
    assert v.reward == 1.0 and not v.metrics["has_boxed"]


@pytest.mark.parametrize(
    "expected, answer",
    [
        ("\\frac{3}{4}", "\\boxed{\\frac{4}{3}}"),
        ("5", "\\boxed{6}"),
        ("12", "\\boxed{12} at first, but finally \\boxed{13}"),
        ("81", "\\boxed{80}, so the answer is 81."),  # a box is preferred to the text after it
        ("81", "\\boxed{eighty}"),
        ("7", ""),
    ],
)
@pytest.mark.slow
async def test_known_wrong_answers_get_none(env, expected, answer):
    v = await env.score(row(expected), None, said(answer))
    assert v.reward == 0.0 and v.components == {"library": 0.0}


def test_last_boxed_balances_braces():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("no box") is None and last_boxed("\\boxed{unclosed") is None


@pytest.mark.slow
async def test_broken_expected_answer_raises_not_scores_zero(env):
    with pytest.raises(ValueError, match="does not parse"):
        await env.score(row("\\frac{"), None, said("\\boxed{5}"))
    with pytest.raises(RowError, match="expected_answer"):
        await env.score({"responses_create_params": {"input": "q"}, "question": "q"}, None, said("\\boxed{5}"))


def sleepy_compare(expected, boxed, text=""):
    """Stands for a call blocked outside Python's CPU accounting; module level, so the pool can run it."""
    time.sleep(60)


def spinning_compare(expected, boxed, text=""):
    """Stands for a SymPy call that never returns: it burns CPU forever."""
    while True:
        pass


def pinned_compare(expected, boxed, text=""):
    """An honest comparison that needs about 0.6 s of CPU, pinned to CPU 0 (where the test's
    burners also run), so on that loaded CPU it takes several seconds of wall time."""
    os.sched_setaffinity(0, {0})
    start = time.process_time()
    while time.process_time() - start < 0.6:
        pass
    return expected == boxed


@pytest.mark.slow
async def test_a_spinning_comparison_is_stopped_at_its_cpu_limit(make_math):
    e = make_math(library_timeout_s=1.0)
    e.compare = spinning_compare
    t0 = time.monotonic()
    with pytest.raises(VerifierTimeout, match="used more than 1.0s of CPU time"):  # the CPU limit, not the wall
        await e.score(row("5"), None, said("\\boxed{5}"))
    # 1 CPU-second is more than 1 s of wall time on a loaded machine (a parallel run: 5.8 s once)
    assert time.monotonic() - t0 < 10
    del e.compare  # back to math-verify, in the same pool
    assert (await e.score(row("5"), None, said("\\boxed{5}"))).reward == 1.0


@pytest.mark.slow
async def test_a_blocked_comparison_is_killed_at_its_wall_backstop(make_math):
    e = make_math(library_timeout_s=1.0, library_wall_s=2.0)
    e.compare = sleepy_compare
    t0 = time.monotonic()
    with pytest.raises(VerifierTimeout, match="ran past 2.0s of wall time"):
        await e.score(row("5"), None, said("\\boxed{5}"))
    assert time.monotonic() - t0 < 10
    del e.compare  # back to math-verify, in the same (replenished) pool
    assert (await e.score(row("5"), None, said("\\boxed{5}"))).reward == 1.0


def _burn(stop):
    os.sched_setaffinity(0, {0})
    while not stop.is_set():
        pass


@pytest.mark.slow
async def test_the_limit_is_cpu_time_so_a_loaded_machine_does_not_fail_honest_answers(make_math):
    """Three processes burn CPU 0 while a comparison needing 0.6 s of CPU runs there too: it takes
    well over its 1 s limit in wall time, and still scores, because the limit counts its CPU."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    burners = [ctx.Process(target=_burn, args=(stop,), daemon=True) for _ in range(3)]
    for b in burners:
        b.start()
    try:
        e = make_math(library_timeout_s=1.0)
        e.compare = pinned_compare
        t0 = time.monotonic()
        verdict = await e.score(row("5"), None, said("\\boxed{5}"))
        wall = time.monotonic() - t0
    finally:
        stop.set()
        for b in burners:
            b.join(timeout=5)
    assert verdict.reward == 1.0
    assert wall > 1.0  # a wall-time limit of 1 s would have killed it


# The judge is tested against a scripted judge backend rather than a model: what matters here is
# math's logic (both orders must say equal, labels parsed, failures raised), which a scripted judge
# pins down exactly; SmolLM2 would answer at random. The pool's HTTP path, limit, deadline and
# cache are tested against real servers in tests/test_judges.py.


class ScriptedJudges:
    """A judge backend whose reply is decide(answer_a, answer_b) -> text; every request is kept in `calls`."""

    def __init__(self, decide, calls: list):
        self.decide, self.calls = decide, calls

    async def ask(self, name, messages, sampling, default=None):
        self.calls.append({"judge": name, "messages": messages, "default": default, **sampling})
        if isinstance(self.decide, Exception):
            raise self.decide
        user = messages[-1]["content"]
        a = user.split("Answer A:\n", 1)[1].split("\n\nAnswer B:", 1)[0]
        b = user.split("Answer B:\n", 1)[1]
        return JudgeReply(name, self.decide(a, b), 0.01)


async def scored_with(env: Math, judges: ScriptedJudges, r: dict, transcript: Transcript):
    with judging(judges, getattr(env, "judges", None)):
        return await env.score(r, None, transcript)


@pytest.mark.slow
async def test_judge_counts_equal_only_when_both_orders_agree(make_math):
    calls: list = []
    agreeing = ScriptedJudges(lambda a, b: "Same value. [[A=B]]", calls)
    env = make_math(judge="grader")
    v = await scored_with(env, agreeing, row("\\frac{1}{2}", "Half of one?"), said("\\boxed{one half}"))
    assert v.reward == 1.0 and v.components == {"library": 0.0, "judge": 1.0}
    assert v.metrics["judge_verdicts"] == ["equal", "equal"]
    first, second = (c["messages"][-1]["content"] for c in calls)
    assert "Half of one?" in first and first.index("\\frac{1}{2}") < first.index("one half")
    assert second.index("one half") < second.index("\\frac{1}{2}")  # asked again, swapped
    assert calls[0]["judge"] == "grader" and calls[0]["temperature"] == 0.0

    # A judge biased to the expected answer's position agrees in one order only: not equal.
    calls.clear()
    biased = ScriptedJudges(lambda a, b: "[[A=B]]" if a == "\\frac{1}{2}" else "[[A!=B]]", calls)
    v = await scored_with(env, biased, row("\\frac{1}{2}"), said("\\boxed{one half}"))
    assert v.reward == 0.0 and v.metrics["judge_verdicts"] == ["equal", "different"] and len(calls) == 2

    # Said different first: the second order is not asked.
    calls.clear()
    v = await scored_with(env, ScriptedJudges(lambda a, b: "[[A!=B]]", calls), row("3"), said("\\boxed{4}"))
    assert v.reward == 0.0 and v.metrics["judge_verdicts"] == ["different"] and len(calls) == 1

    # No label is not equal; the first label decides.
    assert math_env.read_verdict("I cannot tell.") == "unparsed"
    assert math_env.read_verdict("[[A!=B]] ... not [[A=B]]") == "different"

    # The library already said yes: the judge is never asked.
    calls.clear()
    v = await scored_with(env, ScriptedJudges(lambda a, b: "[[A!=B]]", calls), row("2"), said("\\boxed{2}"))
    assert v.reward == 1.0 and v.components == {"library": 1.0} and calls == []


@pytest.mark.slow
async def test_judge_failures_raise_and_the_old_options_define_a_judge(make_math):
    """A judge that fails raises its JudgeFailure (a `verifier` failure), never a 0; `judge_url` and
    `judge_model` still configure math's judge: an implicit judge named `math` on the pool."""
    calls: list = []
    down = ScriptedJudges(JudgeFailure("grader", "no answer within its deadline of 1s"), calls)
    with pytest.raises(JudgeFailure, match="judge grader: no answer within its deadline") as info:
        await scored_with(make_math(judge="grader"), down, row("3"), said("\\boxed{4}"))
    assert info.value.kind == "verifier" and len(calls) == 1

    old = make_math(judge_url="http://judge.test/v1", judge_model="stub")
    assert old.judge == "math" and old.judges["math"].urls == ["http://judge.test"]
    calls.clear()
    v = await scored_with(old, ScriptedJudges(lambda a, b: "[[A!=B]]", calls), row("3"), said("\\boxed{4}"))
    assert v.reward == 0.0 and calls[0]["judge"] == "math" and calls[0]["default"].model == "stub"
    with pytest.raises(ValueError, match="judge_model"):
        Math(judge_url="http://judge.test")


@pytest.mark.slow
async def test_verifier_error_is_a_failed_rollout_with_its_reason(tokenizer, env):
    """A scripted policy: this test is about the verifier's failure reaching the rollout through
    the real agent loop, not about sampling."""
    policy = ScriptedPolicy(tokenizer, ["The answer is \\boxed{5}."] * 2)
    agent = AgentLoop.over_tokens(env, policy, tokenizer, AgentSettings(loop="single_turn"))
    task = Task.new(run_id="m", agent="math", row=row("\\frac{"), reply_to="farm:results:m")
    with pytest.raises(RolloutFailure, match="verifier raised ValueError: expected answer") as info:
        await agent.run(task, AgentContext(worker_id="test", settings=None))
    assert info.value.kind == "verifier" and not info.value.retryable
    good = await agent.run(
        Task.new(run_id="m", agent="math", row=row("5"), reply_to="farm:results:m"),
        AgentContext(worker_id="test", settings=None),
    )
    assert good.status.value == "ok" and good.reward == 1.0 and good.metrics["extracted_answer"] == "5"


@pytest.mark.slow
@pytest.mark.vllm
def test_worker_runs_math_against_real_vllm(settings, vllm, model_dir):
    """Real rollouts through Redis, a `farm worker --agent math` process and vLLM; one row with a
    broken expected answer comes back failed with the verifier's reason."""
    rows = generate(3, seed=11) + [row("\\frac{")]
    got = run_through_worker(settings, vllm, model_dir, "math", rows, sampling=Sampling(max_tokens=32, temperature=0.7))
    broken = got.pop(len(rows) - 1)
    assert broken.status.value == "failed" and broken.error.kind == "verifier"
    assert "does not parse" in broken.error.message
    for r in got:
        assert r.status.value in ("ok", "truncated"), r.error
        assert r.reward in (0.0, 1.0) and "library" in r.reward_components
        n = len(r.trace.completion())
        assert n > 0 and len(r.trace.completion_logprobs()) == n and r.worker_id.startswith("math@")


@pytest.mark.vllm
@pytest.mark.slow
async def test_the_real_vllm_server_can_be_the_judge(vllm):
    """The judge's HTTP path (the pool) against a real OpenAI-compatible server; SmolLM2's verdict itself is noise."""
    config = JudgeConfig(urls=[vllm.url], model=vllm.served_model_name)
    pool = JudgePool({"vllm": config})
    try:
        with judging(pool):
            equal, verdicts = await math_env.equivalent("vllm", "What is half of one?", "\\frac{1}{2}", "0.5")
    finally:
        await pool.aclose()
    assert 1 <= len(verdicts) <= 2 and set(verdicts) <= {"equal", "different", "unparsed"}
    assert equal == (verdicts == ["equal", "equal"])
