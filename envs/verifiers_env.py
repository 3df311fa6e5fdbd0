"""verifiers: rollouts graded by their harness, such as a verifiers environment scored by its own rubric.

The gateway's harness agents (workers/loops/harness.py) may grade themselves: an in-process harness
calls `task.report(reward, components)`, a command POSTs them to `$FARM_TASK_URL/report`. This
environment takes that grade as the rollout's reward, so a verifiers environment's rubric (see
examples/harnesses/verifiers_rubric.py) decides what its rollouts are worth. A harness that reports
nothing fails the rollout (kind `verifier`), never a silent 0.

Data: short arithmetic questions with their answer (`question`, `answer`), generated offline; a
verifiers harness builds its own dataset row from them. It has no tools.

    agents:
      vf_arith:
        command: [".venv-verifiers/bin/python", "examples/harnesses/verifiers_rubric.py"]
        env: verifiers
"""

from __future__ import annotations

import random
from typing import Optional

from envs.sdk import AgentSettings, Environment, ErrorKind, RolloutFailure, Row, Transcript, Verdict

SYSTEM = "Answer with the number only."


class QuestionRow(Row):
    question: Optional[str] = None
    answer: Optional[str] = None


class Verifiers(Environment):
    name = "verifiers"
    verifier_version = "1"
    agent = AgentSettings(loop="single_turn", max_steps=4, sampling={"max_tokens": 32})
    row_type = QuestionRow

    async def verify(self, row: QuestionRow, state: None, transcript: Transcript) -> Verdict:
        if transcript.reported is None:
            raise RolloutFailure(
                ErrorKind.verifier,
                "the harness reported no reward: env verifiers takes the harness's own grade "
                "(task.report(reward, components), or POST $FARM_TASK_URL/report)",
            )
        return transcript.reported

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        rng = random.Random(seed)
        rows = []
        for _ in range(size):
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            question = f"What is {a} + {b}?"
            rows.append(
                {
                    "responses_create_params": {
                        "input": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
                    },
                    "agent_ref": {"type": "responses_api_agents", "name": "verifiers"},
                    "question": question,
                    "answer": str(a + b),
                }
            )
        return rows
