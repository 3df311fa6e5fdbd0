"""math against NeMo Gym's published expectations (resources_servers/math_with_judge/tests/test_app.py):
the library verdict on (expected answer, model answer) pairs, written here as data.

NeMo Gym's server scores these with math-verify as the farm does; the judge is off in these
cases (NeMo Gym's judge cases are about the judge's labels, covered in test_env_math.py). Where
the farm keeps a different outcome on purpose, the case is listed with the reason."""

from __future__ import annotations

import pytest

from envs.math import Math
from envs.sdk import Transcript

pytestmark = pytest.mark.slow

# (expected_answer, model answer, NeMo Gym's reward)
PUBLISHED = [
    ("4", "2 + 2 = \\boxed{4}", 1.0),
    ("\\boxed{12}", "3 * 4 = \\boxed{12}", 1.0),
    ("\\boxed{5}", "10 - 5 = \\boxed{5}", 1.0),
    ("4.0", "2 + 2 = \\boxed{\\frac{8}{2}}", 1.0),
    ("\\boxed{12}", "3 * 4 = 13", 0.0),
    ("17.001", "17", 0.0),
    ("3", "3", 1.0),
    ("8", "3 + 5 = \\boxed{8}", 1.0),
    ("2", "3", 0.0),
    ("1.4", "Final answer: {7 / 5}", 0.0),  # the library says no; NeMo Gym's judge then decides
    ("x + 1", "$1", 0.0),
    ("x + 1", "$1 + x$", 1.0),
]


@pytest.fixture(scope="module")
def env():
    e = Math()
    yield e
    e.pool.close()


def row(expected: str) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": "q"}]}, "expected_answer": expected}


@pytest.mark.parametrize("expected,answer,reward", PUBLISHED)
async def test_nemo_gym_published_library_verdicts(env, expected, answer, reward):
    got = await env.score(row(expected), None, Transcript(final_text=answer, output=[], tool_calls=[]))
    assert got.reward == reward


async def test_an_empty_expected_answer_is_a_broken_row_not_a_zero(env):
    """NeMo Gym scores ("", "") 0.0; the farm keeps its rule that a row it cannot check is a
    `verifier` failure with the reason, never a silent 0 (a kept disagreement)."""
    with pytest.raises(ValueError, match="expected answer .. does not parse"):
        await env.score(row(""), None, Transcript(final_text="", output=[], tool_calls=[]))
