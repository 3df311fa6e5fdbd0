"""Every Redis key the farm uses, built in one place under a namespace.

{ns}:tasks:{agent}      stream of Tasks, consumer group GROUP
{ns}:delayed:{agent}    zset of retries waiting out their backoff (score = due time)
{ns}:dead:{agent}       stream of dead letters (entry + reason)
{ns}:stats:{agent}      hash of counters: done, failed, retried, dead
{ns}:results:{run}      stream of Rollouts for one run (a task's reply_to; nothing else may be)
{ns}:dead-results       stream of result entries a consumer could not decode (entry + reason)
{ns}:hist:{agent}:{min} hash of one minute's history of an agent (farm.history; expires)
{ns}:samples:{agent}    capped stream of sampled rollouts, for the dashboard's rollout viewer
{ns}:cancel:tasks       zset of cancelled task ids (score = when the cancel expires; farm.cancel)
{ns}:cancel:runs        zset of cancelled run ids (likewise)
{ns}:cancel_events      pub/sub channel: `task ID ...` or `run ID ...` when a client cancels
{ns}:interrupt:tasks    zset of interrupted task ids (score = when the interrupt expires; farm.cancel)
{ns}:interrupt:runs     zset of `RUN AT` run interrupts (AT: when; tasks created before it; likewise)
{ns}:open               zset of open task ids, scored by submit time (written at submit, removed at settle)
{ns}:open_runs          hash of open tasks per run id (likewise)
{ns}:agents             set of agent names that ever had tasks
{ns}:queue:{agent}:{run} list of one run's tasks queued for an agent, first in first out (farm.fairness)
{ns}:fair:{agent}       zset of the runs with tasks queued for the agent (score 0; farm.fairness)
{ns}:runs:{agent}       hash of the agent's runs: share:R, cap:R, flight:R (farm.fairness)
{ns}:backlog:{agent}    list holding one byte per queued task, a length KEDA's list scaler reads
{ns}:worker:{id}        heartbeat of a live worker (JSON, expires)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

GROUP = "workers"
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


def check_name(value: str, what: str) -> str:
    """Agent names, run ids and namespaces become parts of key names: keep them plain."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(f"{what} {value!r} must be 1-128 characters of letters, digits, '_', '.', '-'")
    return value


@dataclass(frozen=True)
class Keys:
    ns: str = "farm"

    def __post_init__(self) -> None:
        check_name(self.ns, "namespace")

    def tasks(self, agent: str) -> str:
        return f"{self.ns}:tasks:{check_name(agent, 'agent name')}"

    def delayed(self, agent: str) -> str:
        return f"{self.ns}:delayed:{check_name(agent, 'agent name')}"

    def dead(self, agent: str) -> str:
        return f"{self.ns}:dead:{check_name(agent, 'agent name')}"

    def stats(self, agent: str) -> str:
        return f"{self.ns}:stats:{check_name(agent, 'agent name')}"

    def results(self, run_id: str) -> str:
        return f"{self.ns}:results:{check_name(run_id, 'run id')}"

    def results_prefix(self) -> str:
        return f"{self.ns}:results:"

    def is_result_stream(self, key: object) -> bool:
        """Whether `key` may be a task's reply_to: a result stream of this namespace, nothing else."""
        prefix = self.results_prefix()
        return isinstance(key, str) and key.startswith(prefix) and _NAME.match(key[len(prefix) :]) is not None

    def history(self, agent: str, minute: int) -> str:
        return f"{self.ns}:hist:{check_name(agent, 'agent name')}:{int(minute)}"

    def samples(self, agent: str) -> str:
        return f"{self.ns}:samples:{check_name(agent, 'agent name')}"

    def dead_results(self) -> str:
        return f"{self.ns}:dead-results"

    def agents(self) -> str:
        return f"{self.ns}:agents"

    def cancel_tasks(self) -> str:
        """Cancelled task ids, scored by when the cancel expires (farm.cancel)."""
        return f"{self.ns}:cancel:tasks"

    def cancel_runs(self) -> str:
        """Cancelled run ids, scored by when the cancel expires (farm.cancel)."""
        return f"{self.ns}:cancel:runs"

    def interrupt_tasks(self) -> str:
        """Interrupted task ids, scored by when the interrupt expires (farm.cancel)."""
        return f"{self.ns}:interrupt:tasks"

    def interrupt_runs(self) -> str:
        """`RUN AT` per run interrupt (its tasks created before AT), scored by when it expires (farm.cancel)."""
        return f"{self.ns}:interrupt:runs"

    def cancel_events(self) -> str:
        """Pub/sub channel: `task ID ...` or `run ID ...` as a client cancels (farm.cancel)."""
        return f"{self.ns}:cancel_events"

    def open_tasks(self) -> str:
        """Task ids submitted and not yet settled, scored by submit time (a cancel says which are not open)."""
        return f"{self.ns}:open"

    def open_runs(self) -> str:
        """How many tasks of each run are submitted and not yet settled."""
        return f"{self.ns}:open_runs"

    def queue(self, agent: str, run_id: str) -> str:
        """One run's tasks queued for an agent, in submit order (farm.fairness)."""
        return self.queue_prefix(agent) + check_name(run_id, "run id")

    def queue_prefix(self, agent: str) -> str:
        return f"{self.ns}:queue:{check_name(agent, 'agent name')}:"

    def fair(self, agent: str) -> str:
        """The runs with tasks queued for an agent (farm.fairness chooses among them)."""
        return f"{self.ns}:fair:{check_name(agent, 'agent name')}"

    def runs(self, agent: str) -> str:
        """Each run's share, cap and tasks in flight on an agent (farm.fairness)."""
        return f"{self.ns}:runs:{check_name(agent, 'agent name')}"

    def backlog(self, agent: str) -> str:
        """A list as long as the agent's queued tasks (one byte each), for KEDA's Redis list scaler."""
        return f"{self.ns}:backlog:{check_name(agent, 'agent name')}"

    def worker(self, worker_id: str) -> str:
        return f"{self.ns}:worker:{worker_id}"

    def worker_pattern(self) -> str:
        return f"{self.ns}:worker:*"

    def policy_version(self) -> str:
        """The policy version the servers serve (an integer the trainer bumps after each weight sync)."""
        return f"{self.ns}:policy_version"

    def policy_next(self) -> str:
        """The version being loaded while a weight sync runs (absent otherwise)."""
        return f"{self.ns}:policy_next"

    def policy_events(self) -> str:
        """Pub/sub channel: `loading N` before a sync, `live N` once every server serves version N."""
        return f"{self.ns}:policy_events"


def text(value: Any) -> str:
    """A Redis reply or field (bytes: clients run with decode_responses off) as text; bad UTF-8 replaced."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
