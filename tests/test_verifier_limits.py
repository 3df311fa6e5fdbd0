"""A verifier's CPU-time limit cannot be swallowed, and a warm pool measures only the comparison.

The limit (envs/cpu.py) interrupts the call with an exception; library code that catches every
exception (math-verify's verify, reasoning-gym checkers with a bare `except:`) would turn it
into a wrong answer, reward 0, so a right but slow answer would be trained on as wrong. Here a
slow right answer past a tiny limit is a `verifier` failure (masked in training), every time,
for each environment that verifies in the pool; and a fast exact answer on a freshly set-up
environment still scores under that tiny limit, since setup() warms every pool process (the
libraries' first parse alone costs more than the limit).
"""

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs.cpu import CpuPool, VerifierTimeout
from envs.instruction_following import InstructionFollowing
from envs.math import Math
from envs.reasoning_gym import ReasoningGym
from envs.sdk import Transcript
from farm.errors import RolloutFailure
from farm.schema import ErrorKind
from workers.loops.env_calls import verify as verify_rollout

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY = 0.05  # CPU seconds: well above a warm exact comparison, well below the slow ones here


def said(text: str) -> Transcript:
    return Transcript(final_text=text, output=[], tool_calls=[])


@pytest.fixture
async def made():
    """Environments (or pools) made by the test, closed afterwards."""
    things: list = []
    yield things
    for thing in things:
        await thing.aclose()


async def failed_as_verifier(env, row: dict, text: str) -> RolloutFailure:
    """The rollout's outcome through the agent loops' shared verify step: it must fail as `verifier`."""
    with pytest.raises(RolloutFailure) as info:
        v = await verify_rollout(env, env.check_row(row), None, said(text), 60.0)
        pytest.fail(f"scored {v.reward} instead of failing")
    assert info.value.kind is ErrorKind.verifier
    return info.value


FRESH = """
import asyncio, importlib, json, sys
from envs.sdk import Transcript

async def main(spec):
    module, name = spec["env"].rsplit(".", 1)
    env = getattr(importlib.import_module(module), name)(**spec["options"])
    await env.setup()
    try:
        cases = [c for c in spec["cases"] for _ in range(env.pool.workers)]  # each case on every process, likely
        said = lambda text: Transcript(final_text=text, output=[], tool_calls=[])
        verdicts = await asyncio.gather(*(env.score(row, None, said(text)) for row, text in cases))
        print(json.dumps([v.reward for v in verdicts]))
    finally:
        await env.aclose()

asyncio.run(main(json.loads(sys.stdin.read())))
"""


def rewards_in_a_fresh_worker(env: str, options: dict, cases: list) -> list[float]:
    """The rewards of `cases` ((row, answer) pairs) in a new interpreter that has imported nothing but
    the environment's module, as a worker that just started and ran the environment's setup()."""
    spec = json.dumps({"env": env, "options": options, "cases": cases})
    done = subprocess.run(
        [sys.executable, "-c", FRESH], input=spec, capture_output=True, text=True, cwd=ROOT, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the pool itself: functions that swallow the limit ---


def swallows_exceptions() -> bool:
    """A checker written like math-verify's verify: any exception means 'not equal'."""
    try:
        while True:
            pass
    except Exception:
        return False


def swallows_everything() -> bool:
    """A checker written like reasoning-gym's simple_integration: a bare `except:`."""
    try:
        while True:
            pass
    except:  # noqa: E722
        return False


def quick(x: int) -> int:
    return x + 1


@pytest.mark.parametrize("fn", [swallows_exceptions, swallows_everything])
async def test_a_limit_the_checker_swallows_still_fails_the_call(made, fn):
    pool = CpuPool(workers=1)
    made.append(pool)
    for _ in range(3):
        t0 = time.monotonic()
        with pytest.raises(VerifierTimeout, match=f"used more than {TINY}s of CPU time"):
            await pool.run(fn, cpu_s=TINY, wall_s=30)
        assert time.monotonic() - t0 < 10  # stopped by the CPU limit, not the wall backstop
    assert await pool.run(quick, 1, cpu_s=TINY) == 2  # the same process still serves


# --- math ---

N = 200
SLOW_ZERO = "\\frac{x^{%d}-1}{x-1}-(%s)" % (N, "+".join(["1", "x"] + ["x^{%d}" % k for k in range(2, N)]))


def math_row(expected: str) -> dict:
    return {"responses_create_params": {"input": "Compute it."}, "expected_answer": expected}


async def test_math_a_slow_right_answer_past_its_limit_is_a_verifier_failure(made):
    env = Math(library_timeout_s=TINY)
    made.append(env)
    await env.setup()
    for _ in range(3):
        failure = await failed_as_verifier(env, math_row("0"), f"\\boxed{{{SLOW_ZERO}}}")
        assert "CPU time" in str(failure)
    patient = Math()
    made.append(patient)
    assert (await patient.score(math_row("0"), None, said(f"\\boxed{{{SLOW_ZERO}}}"))).reward == 1.0  # it is right


def test_math_a_fast_answer_on_a_freshly_set_up_environment_scores_under_a_tiny_limit():
    cases = [(math_row("2"), "\\boxed{2}"), (math_row("\\frac{3}{4}"), "\\boxed{0.75}"), (math_row("81"), "It is 81.")]
    rewards = rewards_in_a_fresh_worker("envs.math.Math", {"library_timeout_s": TINY}, cases)
    assert rewards and set(rewards) == {1.0}


# --- reasoning_gym: simple_integration's checker simplifies with SymPy inside a bare `except:` ---


def padded_antiderivative(entry: dict, n: int = 200) -> str:
    """The entry's own answer plus zero written as (X+1)^n minus its expansion: right, and slow to simplify."""
    import sympy

    x = sympy.Symbol(entry["metadata"]["variable"])
    return f"{entry['answer']} + ({x} + 1)**{n} - ({sympy.expand((x + 1) ** n)})"


async def test_reasoning_gym_a_slow_right_answer_past_its_limit_is_a_verifier_failure(made):
    env = ReasoningGym(task="simple_integration", score_timeout_s=TINY)
    made.append(env)
    await env.setup()
    row = env.generate(1, seed=0)[0]
    slow = f"<answer>{padded_antiderivative(row)}</answer>"
    for _ in range(3):
        failure = await failed_as_verifier(env, row, slow)
        assert "CPU time" in str(failure)
    patient = ReasoningGym(task="simple_integration")
    made.append(patient)
    assert (await patient.score(row, None, said(slow))).reward == 1.0  # it is right


def test_reasoning_gym_a_fast_answer_on_a_freshly_set_up_environment_scores_under_a_tiny_limit():
    """The rows are made here; the fresh worker never imports reasoning-gym itself, as a worker that
    reads its rows off the queue does not."""
    rows = ReasoningGym(task="simple_integration").generate(2, seed=3)
    cases = [(r, f"<answer>{r['answer']}</answer>") for r in rows]
    options = {"task": "simple_integration", "score_timeout_s": TINY}
    rewards = rewards_in_a_fresh_worker("envs.reasoning_gym.ReasoningGym", options, cases)
    assert rewards and set(rewards) == {1.0}


# --- instruction_following: two checks whose regexes are quadratic on a degenerate answer ---

REPEAT = {
    "instruction_id_list": ["copy:repeat_phrase"],
    "kwargs": [{"phrase": "The quick brown fox jumps over the lazy dog", "small_n": 2}],
    "responses_create_params": {"input": "Write."},
}
POSTSCRIPT = {
    "instruction_id_list": ["detectable_content:postscript"],
    "kwargs": [{"postscript_marker": "P.S."}],
    "responses_create_params": {"input": "Write."},
}
DEGENERATE = [(REPEAT, "The " * 8000), (POSTSCRIPT, "Hello." + " " * 30000 + "bye")]  # about 1.4 s of CPU each
HAIKU = {
    "instruction_id_list": ["detectable_format:title", "length_constraints:number_words", "punctuation:no_comma"],
    "kwargs": [None, {"num_words": 10, "relation": "less than"}, {}],
    "responses_create_params": {"input": "Write a haiku with a title, under 10 words, no commas."},
}


@pytest.mark.parametrize("row, text", DEGENERATE, ids=["repeat_phrase", "postscript"])
async def test_instruction_following_a_degenerate_answer_past_its_limit_is_a_verifier_failure(made, row, text):
    """repeat_phrase's scan is stopped by the CPU limit; postscript's is one C call of the regex
    engine, which does not look at signals, so the wall-clock backstop kills it: a failure either way."""
    env = InstructionFollowing(grade_timeout_s=TINY)
    made.append(env)
    await env.setup()
    for _ in range(3):
        failure = await failed_as_verifier(env, row, text)
        assert "VerifierTimeout" in str(failure)


async def test_instruction_following_grades_a_degenerate_answer_off_the_event_loop(made):
    """Within the default limit the degenerate answer is graded (not followed: reward 0), and the
    worker's event loop keeps running meanwhile, as the other rollouts' need it to."""
    env = InstructionFollowing()
    made.append(env)
    await env.setup()
    stamps = [time.monotonic()]
    done = asyncio.Event()

    async def tick():
        while not done.is_set():
            await asyncio.sleep(0.01)
            stamps.append(time.monotonic())

    ticker = asyncio.create_task(tick())
    try:
        verdict = await env.score(REPEAT, None, said("The " * 8000))
    finally:
        stamps.append(time.monotonic())
        done.set()
        await ticker
    assert verdict.reward == 0.0
    stall = max(b - a for a, b in zip(stamps, stamps[1:]))
    assert stall < 0.5, f"the event loop stalled for {stall:.2f}s"


def test_instruction_following_a_fast_answer_on_a_freshly_set_up_environment_scores_under_a_tiny_limit():
    cases = [(HAIKU, "<<Rain>>\nSoft rain falls"), (REPEAT, "The quick red fox jumps over the lazy dog. " * 2)]
    options = {"grade_timeout_s": TINY}
    rewards = rewards_in_a_fresh_worker("envs.instruction_following.InstructionFollowing", options, cases)
    assert rewards == [1.0] * len(rewards) and rewards


def spin_forever(path: str) -> None:
    """A verifier stuck in a loop (it notes its pid first, for the test to watch)."""
    import os

    Path(path).write_text(str(os.getpid()))
    while True:
        pass


async def test_a_cancelled_rollouts_verifier_is_killed_at_once(tmp_path):
    """A cancel (farm.cancel) cancels the rollout's asyncio task while its verifier runs in the
    pool: the pool process running it is killed then, not after its 60 s CPU limit."""
    pool = CpuPool(workers=1)
    await pool.start()
    mark = tmp_path / "pid"
    try:
        running = asyncio.create_task(pool.run(spin_forever, str(mark), cpu_s=60))
        for _ in range(200):
            if mark.exists() and mark.read_text():
                break
            await asyncio.sleep(0.05)
        pid = int(mark.read_text())
        running.cancel()
        t0 = time.monotonic()
        while Path(f"/proc/{pid}").exists() and time.monotonic() - t0 < 5:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            await asyncio.sleep(0.02)
        took = time.monotonic() - t0
        alive = Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
        assert not alive and took < 2, f"verifier process {pid} still running {took:.2f}s after the cancel"
        assert (await pool.run(quick, 3, cpu_s=5)) == 4, "the pool serves the next call"
    finally:
        pool.close()
