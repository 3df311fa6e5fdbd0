"""A TRL `environment_factory` class and reward function: add two small numbers, with a calculator.

Written for TRL 1.16's trainer, and run unchanged by the farm (farm.yaml beside this file):

    GRPOTrainer(model=..., environment_factory=Calculator, reward_funcs=[correct_answer], ...)

Each row (rows.jsonl, written by make_rows.py) asks for the sum of two numbers that only `reset`
tells: it returns "The numbers are A and B.", which TRL (and the farm) append to the user message
before the first model call. The model may call `add` or `subtract`; `get_reward` pays 1 when a
tool computed the sum, and `correct_answer` pays 1 when the last number of the final answer is it.
SmolLM2-135M-Instruct gets some of these right without tools (docs/trl-environments.md).
"""

from __future__ import annotations

import re


class Calculator:
    """The numbers to add (from the row, through reset) and the results the tools computed."""

    def __init__(self) -> None:
        self.target = 0
        self.results: list[int] = []

    def reset(self, a: int, b: int, **kwargs) -> str:
        self.target = a + b
        self.results = []
        return f"\nThe numbers are {a} and {b}."

    def add(self, x: int, y: int) -> int:
        """Add two integers.

        Args:
            x: The first integer.
            y: The second integer.
        """
        self.results.append(x + y)
        return x + y

    def subtract(self, x: int, y: int) -> int:
        """Subtract the second integer from the first.

        Args:
            x: The integer to subtract from.
            y: The integer to subtract.
        """
        self.results.append(x - y)
        return x - y

    def get_reward(self) -> float:
        return 1.0 if self.target in self.results else 0.0


def correct_answer(completions, a, b, **kwargs) -> list[float]:
    """1.0 for each completion whose final message ends on the number a + b, else 0.0."""
    rewards = []
    for completion, x, y in zip(completions, a, b):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        numbers = re.findall(r"-?\d+", text or "")
        rewards.append(1.0 if numbers and int(numbers[-1]) == x + y else 0.0)
    return rewards
