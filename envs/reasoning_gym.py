"""reasoning_gym: any procedural task of the reasoning-gym library, scored by the task's own checker.

Data: `generate(size, seed)` asks reasoning-gym for `size` entries of one task (`mini_sudoku`
by default) or of a weighted mix of tasks (its `composite` dataset), offline and deterministic
by seed. Rows keep NeMo Gym's reasoning_gym layout, `question`, `answer` and `metadata` (whose
`source_dataset` names the task), so rows it exports load unchanged, plus the `seed` they came
from. The prompt is reasoning-gym's own default system prompt, which asks for the final answer
inside `<answer></answer>` tags.

Verifier: the answer is taken from the last `<answer>` tag, else from the last `\\boxed{}`
(models trained on math often box instead), else the whole text; then the task's own
`score_answer(answer, entry)` scores it, in a CpuPool process with a CPU-time limit
(`score_timeout_s`), since some checkers (SymPy algebra, puzzle simulators) are CPU-heavy. Scores
may be partial (0..1), as the task defines them. A row without a task name, an unknown task, a
checker that raises or one past its limit is a verifier error (a failed rollout with the reason),
never a silent 0: checkers that wrap their work in a bare `except:` (simple_integration) cannot
catch the limit (envs/cpu.py). setup() warms every pool process (`warm`: the library's import,
then one answer scored for each configured task), so the limit measures the scoring only.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from typing import Any, Optional, Union

from envs.cpu import CpuPool
from envs.sdk import AgentSettings, Environment, Row, Transcript, Verdict

log = logging.getLogger("farm.envs.reasoning_gym")


class ReasoningRow(Row):
    """A reasoning-gym entry as NeMo Gym lays it out; `metadata.source_dataset` names the task."""

    metadata: dict[str, Any]
    question: str = ""
    answer: Any = None
    seed: Optional[int] = None

    def __post_init__(self) -> None:
        task = self.metadata.get("source_dataset")
        if not isinstance(task, str) or not task:
            raise ValueError("metadata.source_dataset (the reasoning-gym task name) is missing")


_BOXED = re.compile(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")


def extract(text: str) -> tuple[str, str]:
    """(answer, where it came from: 'answer_tag' | 'boxed' | 'text')."""
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(text, tag_name="answer")
    if tagged is not None:
        return tagged, "answer_tag"
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip(), "boxed"
    return text.strip(), "text"


@functools.lru_cache(maxsize=None)
def _scorer(task: str):
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


def score(task: str, answer: str, entry: dict) -> float:
    """The task's own score for `answer`; runs in a CpuPool process (hence module level)."""
    value = _scorer(task)(answer=answer, entry=entry)
    return float(value)


def warm(tasks: tuple[str, ...], configs: tuple[dict, ...]) -> None:
    """A pool process's first scores: reasoning-gym imported, and each task's own answer to one
    entry scored, which loads what its checker uses. Raises when reasoning-gym does not import; a
    task that cannot be warmed is left to fail at its own rows, with its reason."""
    import reasoning_gym

    for task, config in zip(tasks, configs):
        try:
            entry = _jsonable(reasoning_gym.create_dataset(task, size=1, seed=0, **config)[0])
            score(task, str(entry["answer"]), entry)
        except Exception as exc:  # its rows fail on their own, each with this reason; say it once here
            log.warning("reasoning_gym task %r not warmed: %s: %s", task, type(exc).__name__, exc)


def _jsonable(entry: dict) -> dict:
    """The entry as it reads after a JSON round trip (tuples become lists, sets sorted lists), since rows
    travel as JSON and msgpack; anything else is refused here rather than on the wire."""
    return json.loads(json.dumps(entry, default=_reject))


def _reject(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"reasoning-gym entry field of type {type(obj).__name__} is not JSON-serializable")


class ReasoningGym(Environment):
    name = "reasoning_gym"
    verifier_version = "1"
    agent = AgentSettings(loop="single_turn", max_steps=1, verify_timeout_s=60.0)
    row_type = ReasoningRow

    def __init__(
        self,
        task: str = "mini_sudoku",
        tasks: Union[dict[str, float], list[str], None] = None,
        config: Optional[dict] = None,
        score_timeout_s: float = 20.0,
    ):
        """`tasks` (names, or names -> weights) makes a mix; `config` holds per-task options,
        keyed by task name for a mix, or the single task's options otherwise."""
        if isinstance(tasks, (list, tuple)):
            tasks = {t: 1.0 for t in tasks}
        self.task = task
        self.tasks = dict(tasks) if tasks else None
        self.config = dict(config or {})
        self.score_timeout_s = score_timeout_s  # CPU seconds per answer
        names = tuple(self.tasks or (task,))
        configs = tuple(dict(self.config.get(t, {})) for t in names) if self.tasks else (dict(self.config),)
        self.pool = CpuPool(warmup=warm, warmup_args=(names, configs))

    async def setup(self) -> None:
        await self.pool.start()

    async def aclose(self) -> None:
        await self.pool.aclose()

    async def verify(self, row: ReasoningRow, state: Any, transcript: Transcript) -> Verdict:
        task = row.metadata["source_dataset"]
        answer, source = extract(transcript.final_text)
        entry = {"question": row.question, "answer": row.answer, "metadata": row.metadata}
        value = await self.pool.run(score, task, answer, entry, cpu_s=self.score_timeout_s)
        return Verdict(
            reward=value,
            components={"score": value},
            metrics={"task": task, "answer_from": source, "answer_tag": float(source == "answer_tag")},
        )

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        import reasoning_gym
        from reasoning_gym.utils import SYSTEM_PROMPTS

        if self.tasks:
            from reasoning_gym.composite import DatasetSpec

            specs = [
                DatasetSpec(name=name, weight=float(w), config=dict(self.config.get(name, {})))
                for name, w in self.tasks.items()
            ]
            dataset = reasoning_gym.create_dataset("composite", size=size, seed=seed, datasets=specs)
        else:
            dataset = reasoning_gym.create_dataset(self.task, size=size, seed=seed, **self.config)
        rows = []
        for i in range(size):
            entry = _jsonable(dataset[i])
            rows.append(
                {
                    "responses_create_params": {
                        "input": [
                            {"role": "system", "content": SYSTEM_PROMPTS["default"]},
                            {"role": "user", "content": entry["question"]},
                        ]
                    },
                    "agent_ref": {"type": "responses_api_agents", "name": "reasoning_gym"},
                    "question": entry["question"],
                    "answer": entry["answer"],
                    "metadata": entry["metadata"],
                    "seed": seed,
                }
            )
        return rows
