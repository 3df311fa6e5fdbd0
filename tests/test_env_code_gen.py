"""code_gen: generation is deterministic, the verifier scores known answers right, end to end."""

from __future__ import annotations

import asyncio
import json
import os
import random

import pytest
import yaml
from helpers.workers import run_through_worker

from envs.code_families import FAMILIES, generate, make_row, reference_solution
from envs.code_gen import CodeGen, extract_code
from envs.sdk import Transcript
from farm.schema import Sampling

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the code sandbox's isolation needs root on Linux")


def answer(code: str, prose: str = "Here is my solution.") -> Transcript:
    text = f"{prose}\n```python\n{code}```\nDone."
    return Transcript(final_text=text, output=[], tool_calls=[])


@pytest.fixture
def env(redis_url, queue):
    e = CodeGen(reward="fraction", redis_url=redis_url, queue=queue, wall_s=3.0, cpu_s=2)
    yield e
    e.close()


def test_generation_is_deterministic_and_covers_the_families():
    assert generate(40, seed=7) == generate(40, seed=7)
    assert generate(10, seed=1) != generate(10, seed=2)
    rows = generate(300, seed=0)
    assert {r["problem"]["id"] for r in rows} == {f.id for f in FAMILIES} and len(FAMILIES) >= 20
    row = rows[0]
    assert row["agent_ref"] == {"type": "responses_api_agents", "name": "code_gen"}
    tests = row["verifier_metadata"]["unit_tests"]
    assert len(tests["inputs"]) == len(tests["outputs"]) == 6 and tests["fn_name"] in reference_solution(row)
    assert "```python" in row["responses_create_params"]["input"][-1]["content"]
    json.dumps(rows)  # JSONL-ready


def test_extracts_the_last_python_block():
    assert extract_code("```python\na = 1\n```\ntext\n```python\nb = 2\n```") == "b = 2\n"
    assert extract_code("```py\nc = 3\n```") == "c = 3\n"
    assert extract_code("```\nd = 4\n```") == "d = 4\n"  # unlabelled, as a fallback
    assert extract_code("```python\ne = 5\n```\n```text\nnot code\n```") == "e = 5\n"
    assert extract_code("no code here") is None
    assert extract_code("```python\nunterminated = 1\n") is None  # cut off by max_tokens


@pytest.mark.slow
async def test_every_shipped_reference_solution_gets_full_reward(env):
    rng = random.Random(3)
    rows = [make_row(f, rng) for f in FAMILIES]
    verdicts = await asyncio.gather(*[env.score(r, None, answer(reference_solution(r))) for r in rows])
    for row, v in zip(rows, verdicts):
        assert v.reward == 1.0, (row["problem"], v)
        assert v.components == {"has_code": 1.0, "pass_fraction": 1.0, "all_passed": 1.0}
        assert v.metrics["reason"] == "ok" and v.metrics["passed"] == v.metrics["total"] == 6


@pytest.mark.slow
async def test_wrong_solutions_get_nothing(env):
    rows = generate(3, seed=11)
    wrong = [f"def {r['verifier_metadata']['unit_tests']['fn_name']}(*args):\n    return 'nope'\n" for r in rows]
    verdicts = await asyncio.gather(*[env.score(r, None, answer(w)) for r, w in zip(rows, wrong)])
    assert [v.reward for v in verdicts] == [0.0, 0.0, 0.0]
    assert all(v.metrics["reason"] == "ok" and v.metrics["passed"] == 0 for v in verdicts)


@pytest.mark.slow
async def test_partial_solutions_get_the_fraction_or_nothing_when_all_is_required(env, redis_url, queue):
    def right(row):  # how many tests `half` passes: those whose input is not above the upper bound
        tests, lo = row["verifier_metadata"]["unit_tests"], row["problem"]["params"]["lo"]
        return sum(max(lo, int(i)) == json.loads(o) for i, o in zip(tests["inputs"], tests["outputs"]))

    clamp = next(f for f in FAMILIES if f.id == "clamp")
    row = next(r for r in (make_row(clamp, random.Random(s)) for s in range(100)) if 0 < right(r) < 6)
    lo, expected_right = row["problem"]["params"]["lo"], right(row)
    half = f"def clamp(x):\n    return max({lo}, x)\n"  # forgets the upper bound
    v = await env.score(row, None, answer(half))
    assert v.reward == pytest.approx(expected_right / 6) and v.metrics["passed"] == expected_right
    strict = CodeGen(reward="all", redis_url=redis_url, queue=queue, start_sandbox_worker=False, wall_s=3.0)
    strict._client = env.client  # share the running sandbox workers
    v = await strict.score(row, None, answer(half))
    assert v.reward == 0.0 and v.metrics["passed"] == expected_right
    assert (await strict.score(row, None, answer(reference_solution(row)))).reward == 1.0


@pytest.mark.slow
async def test_fraction_rewards_several_partial_answers(env):
    row = make_row(next(f for f in FAMILIES if f.id == "is_prime"), random.Random(0))
    tests = row["verifier_metadata"]["unit_tests"]
    truth = [json.loads(o) for o in tests["outputs"]]
    for guess, code in [(False, "def is_prime(n):\n    return False\n"), (True, "def is_prime(n):\n    return True\n")]:
        v = await env.score(row, None, answer(code))
        assert v.reward == pytest.approx(sum(t == guess for t in truth) / len(truth))


@pytest.mark.slow
async def test_programs_that_time_out_or_do_not_load_score_zero_with_a_reason(env):
    row = generate(1, seed=4)[0]
    fn = row["verifier_metadata"]["unit_tests"]["fn_name"]
    cases = {
        "timeout": f"def {fn}(*a):\n    while True:\n        pass\n",
        "memory": f"x = bytearray(16 * 1024**3)\ndef {fn}(*a):\n    return 0\n",
        "error": f"def {fn}(*a) return 0\n",
    }
    verdicts = await asyncio.gather(*[env.score(row, None, answer(code)) for code in cases.values()])
    for reason, v in zip(cases, verdicts):
        assert v.reward == 0.0 and v.metrics["reason"] == reason, (reason, v)
        assert v.metrics["failure_kind"] == reason
    v = await env.score(row, None, Transcript(final_text="I think it is 42.", output=[], tool_calls=[]))
    assert v.reward == 0.0 and v.metrics["reason"] == "no_code" and v.components["has_code"] == 0.0


def test_the_default_reward_is_all_or_nothing_as_in_nemo_gym():
    assert CodeGen().reward == "all"


@pytest.mark.slow
async def test_by_default_the_sandbox_queue_is_a_password_protected_redis_of_its_own():
    env = CodeGen(wall_s=3.0)
    row = generate(1, seed=5)[0]
    try:
        v = await env.score(row, None, answer(reference_solution(row)))
        assert v.reward == 1.0
        url = env.client.redis_url
        assert ":6379" not in url and "@127.0.0.1:" in url and len(url.split("@")[0]) > 20
        import redis

        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url("redis://" + url.split("@", 1)[1]).ping()
    finally:
        env.close()


async def test_a_broken_sandbox_is_a_sandbox_error_failure_not_a_zero(redis_url, queue):
    from farm.errors import RolloutFailure

    env = CodeGen(redis_url=redis_url, queue=queue, start_sandbox_worker=False, wall_s=0.5, sandbox_wait_s=0.5)
    row = generate(1, seed=0)[0]
    with pytest.raises(RolloutFailure) as failure:
        await env.score(row, None, answer(reference_solution(row)))
    assert failure.value.kind == "sandbox_error" and "no sandbox result" in failure.value.message
    with pytest.raises(ValueError):
        await env.score({"responses_create_params": {}}, None, answer("x = 1\n"))


@pytest.mark.vllm
@pytest.mark.slow
def test_worker_runs_code_gen_against_real_vllm(settings, vllm, model_dir, tmp_path):
    """Real rollouts through Redis, a `farm worker` process (which starts its own sandbox
    worker) and the shared vLLM; SmolLM2-135M is weak, so this checks the pipeline."""
    config = tmp_path / "farm.yaml"
    config.write_text(yaml.safe_dump({"agents": {"code_gen": {"env": "code_gen", "sampling": {"max_tokens": 160}}}}))
    got = run_through_worker(
        settings,
        vllm,
        model_dir,
        "code_gen",
        generate(4, seed=2),
        sampling=lambda i: Sampling(max_tokens=160, temperature=0.7, seed=i),
        timeout_s=300,
        FARM_CONFIG=str(config),
    )
    assert len(got) == 4
    for r in got:
        assert r.status.value in ("ok", "truncated"), r.error
        assert 0.0 <= r.reward <= 1.0
        assert set(r.reward_components) == {"has_code", "pass_fraction", "all_passed"}
        assert r.metrics["reason"] in ("ok", "timeout", "memory", "output_limit", "killed", "error", "no_code")
        n = len(r.trace.completion())
        assert n > 0 and len(r.trace.completion_logprobs()) == n
        assert r.worker_id.startswith("code_gen@")
    # SmolLM2 answers with a code block nearly always: at least one program went through the sandbox.
    assert any(r.reward_components["has_code"] == 1.0 and r.metrics["reason"] != "no_code" for r in got)


# NeMo Gym's published code_gen expectations (resources_servers/code_gen/tests/test_app.py), as data:
# (the model's text, stdin inputs, expected outputs, NeMo Gym's reward).
NEMO_GYM_CASES = [
    ("```python\nn=int(input())\nprint(n*n)\n```", ["2\n", "5\n"], ["4", "25"], 1.0),
    ("```python\nn=int(input())\nprint(n+1)\n```", ["3\n"], ["9"], 0.0),  # wrong answer
    ("n=int(input())\nprint(n*n)", ["2\n"], ["4"], 0.0),  # no fenced code block: nothing is run
    ("```python\nprint('hello'  # Missing closing parenthesis\n```", ["\n"], ["hello"], 0.0),  # syntax error
    ("```python\nn=int(input())\nprint(n/0)\n```", ["5\n"], ["error"], 0.0),  # runtime error
]


@pytest.mark.parametrize("text,inputs,outputs,reward", NEMO_GYM_CASES)
@pytest.mark.slow
async def test_nemo_gym_published_verdicts(redis_url, queue, text, inputs, outputs, reward):
    env = CodeGen(redis_url=redis_url, queue=queue, wall_s=3.0, cpu_s=2)  # the default: all or nothing
    try:
        row = {
            "responses_create_params": {"input": [{"role": "user", "content": "Read n and print n^2."}]},
            "verifier_metadata": {"unit_tests": {"inputs": inputs, "outputs": outputs}},
        }
        got = await env.score(row, None, Transcript(final_text=text, output=[], tool_calls=[]))
    finally:
        env.close()
    assert got.reward == reward
