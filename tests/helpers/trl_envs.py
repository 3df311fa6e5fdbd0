"""TRL `environment_factory` classes and reward functions for the factory tests (tests/test_factory*.py),
good and broken ones, in a file of their own so that a test can name each one's file and line, and
a worker process can import them (`helpers.trl_envs:Counter`, with tests/ on its PYTHONPATH).

Also `tool_template_dir`: the SmolLM2 model directory with TRL's own Qwen2.5 chat template, which
renders tools (SmolLM2's does not, and TRL refuses a template without tool support).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path


class Counter:
    """A counter to bring to the row's target: a sync tool, an async one, one that raises."""

    made = 0  # instances ever made, over every Counter (the pooling tests read it)

    def __init__(self) -> None:
        Counter.made += 1
        self.count = 0
        self.target = 0
        self.resets = 0

    def reset(self, target: int, start: int = 0, **kwargs) -> str:
        self.count, self.target = start, target
        self.resets += 1
        return f" The counter is at {start}."

    def increment(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        self.count += by
        return self.count

    async def double(self) -> int:
        """Double the counter."""
        await asyncio.sleep(0)
        self.count *= 2
        return self.count

    def fail(self, reason: str) -> str:
        """A tool that always fails.

        Args:
            reason: Why it fails.
        """
        raise ValueError(f"failed: {reason}")

    def get_reward(self) -> float:
        return 1.0 if self.count == self.target else 0.0


class Echo:
    """The second environment of a dict factory: its own tool, no reward of its own."""

    def reset(self, **kwargs) -> None:
        self.said: list[str] = []

    def echo(self, text: str) -> str:
        """Say a text back.

        Args:
            text: What to say.
        """
        self.said.append(text)
        return text


def make_counter() -> Counter:
    return Counter()


def exact(completions, target, **kwargs) -> list[float]:
    """1.0 when the final message ends on the target number."""
    out = []
    for completion, t in zip(completions, target):
        numbers = re.findall(r"-?\d+", completion[-1]["content"])
        out.append(1.0 if numbers and int(numbers[-1]) == t else 0.0)
    return out


def shape(prompts, completions, completion_ids, **kwargs) -> list[float]:
    """How many prompt and completion messages and ids TRL handed over (100 x, 1 x, 0.001 x would
    lose precision in float32: ids go to `ids`)."""
    return [100.0 * len(p) + len(c) for p, c in zip(prompts, completions)]


def ids(completion_ids, **kwargs) -> list[float]:
    return [float(len(c)) for c in completion_ids]


async def async_exact(completions, target, **kwargs) -> list[float]:
    await asyncio.sleep(0)
    return exact(completions, target)


def logs(completions, log_extra, log_metric, **kwargs) -> list[float]:
    log_extra("said", [c[-1]["content"] for c in completions])
    log_metric("calls", 2.0)
    return [0.5] * len(completions)


def abstains(completions, **kwargs) -> list:
    return [None] * len(completions)


def raising(completions, **kwargs) -> list[float]:
    raise RuntimeError("the grader is down")


def wordy(completions, **kwargs) -> list:
    return ["high"] * len(completions)


def two(completions, **kwargs) -> list[float]:
    return [1.0, 2.0]


def takes_nothing_extra(prompts, completions) -> list[float]:
    return [0.0] * len(completions)


def needs_answer(completions, answer, **kwargs) -> list[float]:
    return [0.0] * len(completions)


def strict_columns(
    prompts, completions, completion_ids, trainer_state, log_extra, log_metric, environments, target
) -> list[float]:
    return [0.0] * len(completions)


class NoReset:
    def count(self) -> int:
        """How many."""
        return 0


class Undocumented:
    def reset(self, **kwargs) -> None:
        pass

    def look(self, where: str) -> str:
        return where


class Unhinted:
    def reset(self, **kwargs) -> None:
        pass

    def look(self, where) -> str:
        """Look somewhere.

        Args:
            where: Where to look.
        """
        return where


class StrictReset:
    def reset(self, target: int) -> None:
        self.target = target

    def get_reward(self) -> float:
        return 1.0


class Exploding:
    def __init__(self) -> None:
        raise OSError("no such device")

    def reset(self, **kwargs) -> None:
        pass


class ResetRaises:
    def reset(self, **kwargs) -> None:
        raise KeyError("target")

    def get_reward(self) -> float:
        return 1.0


class NoneReward(Counter):
    def get_reward(self):  # type: ignore[override]
        return None


class AsyncReward(Counter):
    async def get_reward(self) -> float:  # type: ignore[override]
        await asyncio.sleep(0)
        return 0.25


def tool_template_dir(model_dir: Path, into: Path) -> Path:
    """`model_dir` (SmolLM2) as a model directory whose chat template is TRL's qwen2_5.jinja; the
    weights are linked, not copied."""
    import trl

    into.mkdir(parents=True, exist_ok=True)
    for f in Path(model_dir).iterdir():
        if f.name.startswith("chat_template"):
            continue
        if f.suffix in (".safetensors", ".bin", ".gguf"):
            (into / f.name).symlink_to(f.resolve())
        else:
            shutil.copy(f, into / f.name)
    template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    config = json.loads((into / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (into / "tokenizer_config.json").write_text(json.dumps(config))
    return into


class RewardRaises(Counter):
    def get_reward(self) -> float:
        raise ZeroDivisionError("no steps taken")
