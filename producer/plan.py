"""What `farm collect` does before its first task: the options, the plan (a first pass that
checks every line and counts the work per agent) and the output files (resume, overwrite).

Everything here may refuse the run (InputError, ConfigError) while nothing is enqueued yet.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from farm.errors import ConfigError, UnknownAgent
from farm.schema import Sampling
from farm.settings import Settings
from producer.output import BadLine, InputError, Paths, done_keys, read_json, read_rows, start_output, write_json

log = logging.getLogger("farm.collect")


@dataclass
class CollectOptions:
    input: Path
    output: Path
    agent: Optional[str] = None  # overrides every row's agent_ref.name
    num_repeats: dict[str, int] = field(default_factory=lambda: {"default": 1})
    limit: Optional[int] = None
    concurrency: int = 256  # most tasks outstanding in Redis at once
    share: float = 1.0  # this run's share of the workers while other runs have a backlog too (farm.fairness)
    max_in_flight: int = 0  # most of this run's tasks in flight per agent (0: no cap)
    timeout_s: Optional[float] = None  # per task, from submission
    run_id: Optional[str] = None
    strict: bool = False
    resume: bool = False
    overwrite: bool = False
    format: str = "jsonl"  # or "parquet"
    embedded: bool = False
    worker_processes: int = 1  # per agent, with --embedded
    worker_concurrency: Optional[int] = None  # per worker process, with --embedded
    sampling: Sampling = field(default_factory=Sampling)
    pass_threshold: float = 1.0
    progress: bool = True
    progress_every_s: float = 5.0  # a plain progress line this often when not on a terminal
    max_bad_lines_shown: int = 20

    def repeats_for(self, agent: str) -> int:
        return self.num_repeats.get(agent, self.num_repeats.get("default", 1))


def parse_repeats(text: str) -> dict[str, int]:
    """`4` or `math=8,default=4` -> {"math": 8, "default": 4}."""
    out: dict[str, int] = {"default": 1}
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        name, _, value = part.rpartition("=")
        try:
            k = int(value)
        except ValueError:
            raise ConfigError(f"--num-repeats: {part!r} is not NAME=K or K") from None
        if k < 1:
            raise ConfigError(f"--num-repeats: {part!r} must be >= 1")
        out[name or "default"] = k
    return out


# -- planning: the first pass over the input -----------------------------------------------


@dataclass
class Plan:
    rows: int = 0
    pairs: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # agent -> (row, repeat) pairs
    bad: list[BadLine] = field(default_factory=list)
    bad_count: int = 0


def plan(options: CollectOptions, settings: Settings, out=None) -> Plan:
    """Check every line and count the work; raises InputError before anything is enqueued."""
    out = out or sys.stderr
    target = Path(options.output)
    if target.is_dir():
        raise InputError(f"cannot write {target}: it is a directory; give a file name")
    if not target.parent.is_dir():
        raise InputError(f"cannot write {target}: the directory {target.parent} does not exist")
    p = Plan()
    for item in read_rows(options.input, options.agent, options.limit):
        if isinstance(item, BadLine):
            p.bad_count += 1
            if len(p.bad) < options.max_bad_lines_shown:
                p.bad.append(item)
            continue
        p.rows += 1
        p.pairs[item.agent] += options.repeats_for(item.agent)
    for b in p.bad:
        print(f"{options.input}:{b.line}: skipped: {b.reason}", file=out)
    if p.bad_count > len(p.bad):
        print(f"... and {p.bad_count - len(p.bad)} more malformed lines", file=out)
    if p.bad_count and options.strict:
        raise InputError(
            f"{p.bad_count} malformed line(s) in {options.input} (first: line {p.bad[0].line}); "
            "nothing was enqueued (--strict)"
        )
    if p.rows == 0:
        raise InputError(
            f"no valid row in {options.input}"
            + (f" ({p.bad_count} malformed line(s))" if p.bad_count else " (the file is empty)")
            + "; nothing was enqueued"
        )
    from workers.loops.agent import known_agents

    known = known_agents(settings)
    unknown = sorted(set(p.pairs) - known)
    if unknown:
        raise UnknownAgent(
            f"unknown agent(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}. Nothing was enqueued"
        )
    for name in options.num_repeats:
        if name != "default" and name not in p.pairs:
            log.warning("--num-repeats names agent %r, which no row uses", name)
    return p


def prepare_files(options: CollectOptions, paths: Paths) -> tuple[str, set[tuple[int, int]]]:
    """The run id and the pairs already written; cuts torn lines, refuses to clobber (start_output)."""
    start_output(paths, options.resume, options.overwrite)
    run_id = options.run_id
    recorded = read_json(paths.run).get("run_id") if options.resume and paths.run.exists() else None
    if recorded and run_id and recorded != run_id:
        log.warning("--run-id %s differs from the recorded run id %s; using %s", run_id, recorded, run_id)
    run_id = run_id or recorded or f"collect-{uuid.uuid4().hex[:12]}"
    done: set[tuple[int, int]] = set()
    if options.resume:
        done = done_keys(paths.journal, paths.failures)
    write_json(
        paths.run,
        {
            "run_id": run_id,
            "input": str(options.input),
            "format": options.format,
            "agent": options.agent,
            "num_repeats": options.num_repeats,
            "limit": options.limit,
            "started_at": time.time(),
        },
    )
    return run_id, done
