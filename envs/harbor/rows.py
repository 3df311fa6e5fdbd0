"""Dataset rows from a Harbor suite: one row per task (`farm data generate harbor --tasks DIR`).

A row carries what the model is first shown (a short system prompt for a terminal agent and the
task's instruction) and where the task lives; the environment reads the task directory again when
it runs the row, so the row stays small and the instruction, the tests and the image come from one
place. `content_id` pins the directory's content: a row whose task was edited since is detectable.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Optional, Union

from envs.harbor.task import SUITE_DIR, HarborTask, load_suite
from envs.sdk import Row

__all__ = ["AGENT", "HarborRow", "suite_rows", "system_prompt", "task_row"]

AGENT = "harbor"  # the default agent_ref name of every row
AGENT_TYPE = "responses_api_agents"


class HarborRow(Row, kw_only=True):
    """A Harbor row's ground truth: the task directory and what identifies it."""

    task_dir: str
    task_name: str
    tier: str = ""
    content_id: str = ""


def system_prompt(task: HarborTask) -> str:
    workdir = task.config.environment.workdir or "/"
    return (
        "You are an agent in a Linux sandbox with a `bash` tool that runs a command and returns its "
        f"output. Your working directory is {workdir}. Complete the task with the tools; when it is "
        "done, answer with a short summary of what you did and call no more tools."
    )


def task_row(task: HarborTask, agent: str = AGENT) -> dict:
    """The row of one task, routed to `agent`."""
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": system_prompt(task)},
                {"role": "user", "content": task.instruction},
            ]
        },
        "agent_ref": {"type": AGENT_TYPE, "name": agent},
        "task_dir": str(task.path),
        "task_name": task.name,
        "tier": task.tier,
        "content_id": task.content_id,
    }


def suite_rows(
    path: Union[str, Path] = SUITE_DIR,
    agent: Optional[str] = None,
    size: Optional[int] = None,
    seed: int = 0,
) -> list[dict]:
    """One row per task of the suite at `path`, in the suite's order (tier, then name).

    With `size`, that many tasks drawn with `seed`, still in the suite's order. A broken task
    raises SuiteError listing every one (envs.harbor.task).
    """
    tasks = load_suite(path)
    if size is not None:
        if not 0 <= size <= len(tasks):
            raise ValueError(f"{path}: size {size} is not between 0 and the suite's {len(tasks)} tasks")
        keep = set(random.Random(seed).sample(range(len(tasks)), size))
        tasks = [t for i, t in enumerate(tasks) if i in keep]
    return [task_row(t, agent or AGENT) for t in tasks]
