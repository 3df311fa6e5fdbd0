"""Dataset files: generate rows from an environment, prepare (validate) JSONL, blend several.

The farm's dataset is NeMo Gym's JSONL: one object per line with `responses_create_params`
(`input`: a string or a list of messages; optional `tools`), an `agent_ref`
{type: responses_api_agents, name} that routes the row to a task stream, and the ground
truth at the top level. Rows exported by NeMo Gym load unchanged; fields this module does
not know (`_ng_task_index`, `verifier_metadata`, ...) travel through untouched.

`farm data generate|prepare|blend` call the run_* functions below. A bad file is caught
here, with the line number of every bad row, rather than as a stream of `malformed` rollouts
in the middle of a training run. Files are read line by line, so preparing or blending a
file larger than memory works; every output is written to a temporary file beside its
destination and renamed into place, so a failure never leaves a half-written dataset.

Checking a row is envs/data_rows.py.

    DataError(ConfigError)    a file with invalid rows (`.errors`: LineError with line numbers),
                              or inputs or an output that cannot be used: bad input, so the
                              command exits 2 (usage), never 1 (a crash)

An environment whose generator writes bad rows is a bug, not bad input: a plain FarmError (exit 1).
"""

from __future__ import annotations

import array
import json
import os
import random
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Collection, Iterator, Optional

from envs.data_rows import (
    AGENT_TYPE,
    LineError,
    RowTypeOf,
    check_row,
    check_type,
    decode_line,
    decoded_lines,
    row_types,
)
from farm.errors import ConfigError, FarmError, UnknownAgent
from farm.rows import normalize_row

__all__ = [
    "AGENT_TYPE",
    "DataError",
    "LineError",
    "Summary",
    "check_row",
    "decoded_lines",
    "row_types",
    "run_blend",
    "run_generate",
    "run_prepare",
]

MAX_REPORTED = 20  # errors listed in a DataError message; all are counted
HARBOR = "harbor"  # the environment whose rows come from a suite of task directories (--tasks DIR)


class DataError(ConfigError):
    """Input the command cannot use, as given: the user fixes the file or the option (exit 2)."""

    def __init__(self, message: str, errors: Optional[list[LineError]] = None, total: Optional[int] = None):
        self.summary = message  # the message without the listed lines (`farm data prepare` prints each on its own)
        self.errors = errors or []
        self.total = total or len(self.errors)
        shown = "".join(f"\n  {e}" for e in self.errors[:MAX_REPORTED])
        more = self.total - min(len(self.errors), MAX_REPORTED)
        super().__init__(message + shown + (f"\n  ... and {more} more" if more > 0 else ""))


@dataclass
class Summary:
    """What a run_* function did; printed to stderr (stdout may be the data itself)."""

    output: str
    rows: int = 0
    agent_refs_added: int = 0
    dropped: int = 0
    per_agent: dict[str, int] = field(default_factory=dict)
    per_input: dict[str, int] = field(default_factory=dict)
    errors: list[LineError] = field(default_factory=list)

    def render(self, verb: str) -> str:
        parts = [f"{verb} {_rows(self.rows)} -> {self.output}"]
        if self.agent_refs_added:
            parts.append(f"agent_ref added to {self.agent_refs_added}")
        if self.dropped:
            parts.append(f"{_rows(self.dropped)} dropped as invalid")
        lines = ["; ".join(parts)]
        lines += [f"  {name}: {n}" for name, n in sorted(self.per_agent.items())]
        lines += [f"  from {name}: {n}" for name, n in self.per_input.items()]
        lines += [f"  dropped {e}" for e in self.errors[:MAX_REPORTED]]
        return "\n".join(lines)


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


# -- writing -------------------------------------------------------------------------------
@contextmanager
def atomic_output(output: str | Path) -> Iterator[IO[str]]:
    """A text file that replaces `output` only when the block succeeds ("-" is stdout)."""
    if str(output) == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    target = Path(output)
    if not target.parent.is_dir():
        raise DataError(f"cannot write {output}: the directory {target.parent} does not exist")
    if target.is_dir():
        raise DataError(f"cannot write {output}: it is a directory; give a file name")
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def _dump(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False) + "\n"


def _report(summary: Summary, verb: str) -> Summary:
    print(summary.render(verb), file=sys.stderr)
    return summary


# -- commands ------------------------------------------------------------------------------
def run_generate(
    env_name: str,
    size: Optional[int],
    seed: int,
    output: str | Path,
    *,
    agent: Optional[str] = None,
    options: Optional[dict] = None,
    tasks: Optional[str | Path] = None,
) -> Summary:
    """`size` rows from environment `env_name`'s generator, as JSONL, the same for the same seed.

    Every row is routed to `agent` (default: the environment's name); any agent_ref the
    generator wrote is replaced, so `--agent weather` retargets a whole file. `harbor` makes
    one row per task of the suite at `tasks` (default: the project's own), all of them unless
    `size` is given.
    """
    from envs.sdk import load_env

    if size is not None and size < 0:
        raise DataError(f"size must be >= 0, got {size}")
    harbor = tasks is not None or env_name == HARBOR
    if harbor:
        rows, row_type = _harbor_rows(env_name, tasks, size, seed, agent, options)
    elif size is None:
        raise DataError(f"give the number of rows (--size N) for {env_name}")
    else:
        env = load_env(env_name, options)
    ref = {"type": AGENT_TYPE, "name": agent or env_name}
    summary = Summary(output=str(output))
    with atomic_output(output) as f:  # a bad output path fails before the rows are generated
        if not harbor:
            rows, row_type = env.generate(size, seed), env.row_type
            if len(rows) != size:
                raise FarmError(f"environment {env_name} generated {len(rows)} rows, not {size}")
        for i, row in enumerate(rows, 1):
            row = {**row, "agent_ref": dict(ref)}
            problems = check_row(row) or check_type(row, row_type)
            if problems:
                bad = "; ".join(str(LineError(i, p)) for p in problems)
                raise FarmError(f"environment {env_name} generated an invalid row: {bad}")
            f.write(_dump(row))
            summary.rows += 1
    summary.per_agent[ref["name"]] = summary.rows
    return _report(summary, "generated")


def _harbor_rows(
    env_name: str, tasks: Optional[str | Path], size: Optional[int], seed: int, agent: Optional[str], options
) -> tuple[list[dict], type]:
    """A Harbor suite's rows (envs/harbor/rows.py); each broken task on a line of its own on stderr."""
    from envs.harbor.rows import HarborRow, suite_rows
    from envs.harbor.task import SUITE_DIR, SuiteError, TaskError

    if env_name != HARBOR:
        raise DataError(f"--tasks DIR is for the {HARBOR} environment, not {env_name}")
    if options:
        raise DataError(f"{HARBOR} takes no --option; its tasks come from --tasks DIR")
    try:
        return suite_rows(tasks or SUITE_DIR, agent=agent, size=size, seed=seed), HarborRow
    except SuiteError as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        raise DataError(f"{exc}; nothing written") from None
    except (TaskError, ValueError) as exc:
        raise DataError(str(exc)) from None


def run_prepare(
    path: str | Path,
    agent: Optional[str] = None,
    output: Optional[str | Path] = None,
    *,
    strict: bool = True,
    agents: Optional[Collection[str]] = None,
    replace_agent: bool = False,
    row_type_of: Optional[RowTypeOf] = None,
) -> Summary:
    """Validate every row of a JSONL file and write it back ready for the farm.

    A row in TRL's dataset shape (`prompt` plus columns) is written as a farm row, every column
    kept (farm.rows.normalize_row). A row without `agent_ref` gets {type: responses_api_agents, name: agent}; with
    `replace_agent`, every row is retargeted to `agent` (e.g. rows exported by NeMo Gym
    for `math_with_judge_simple_agent`, served here by `math`). `agents`, when given, is
    the set of names an agent_ref may use; `row_type_of` (see row_types) checks each row
    against its environment's Row. Rows are otherwise written unchanged.

    strict (default): any invalid row raises DataError listing the bad lines, and the
    output is not touched. Not strict: invalid rows are dropped and listed in the summary.
    The output defaults to `path` itself, replaced atomically.
    """
    if replace_agent and not agent:
        raise DataError("--replace-agent needs the agent to route every row to: give --agent NAME")
    if agent and agents is not None and agent not in agents:
        raise UnknownAgent(f"unknown agent {agent!r}; known: {', '.join(sorted(agents)) or 'none'}")
    source = Path(path)
    if not source.is_file():
        raise DataError(f"no such file: {source}")
    summary = Summary(output=str(output or source))
    errors: list[LineError] = []
    n_errors = 0
    with atomic_output(output or source) as f:
        for line, row in decoded_lines(source):
            if isinstance(row, LineError):
                problems = [row.message]
            else:
                row = normalize_row(row)  # a row in TRL's shape (prompt + columns) as a farm row
                if isinstance(row, dict) and agent and (replace_agent or row.get("agent_ref") is None):
                    summary.agent_refs_added += row.get("agent_ref") is None
                    row = {**row, "agent_ref": {"type": AGENT_TYPE, "name": agent}}
                problems = check_row(row, agents=agents, row_type_of=row_type_of)
            if problems:
                n_errors += 1
                if len(errors) < MAX_REPORTED:
                    errors.append(LineError(line, "; ".join(problems)))
                continue
            if n_errors and strict:
                continue  # the file fails anyway; keep reading to report every bad line
            ref = row["agent_ref"]
            if "type" not in ref:
                row = {**row, "agent_ref": {"type": AGENT_TYPE, **ref}}
            f.write(_dump(row))
            summary.rows += 1
            summary.per_agent[ref["name"]] = summary.per_agent.get(ref["name"], 0) + 1
        if n_errors and strict:
            raise DataError(f"{source}: {_rows(n_errors)} invalid; nothing written", errors, n_errors)
        if summary.rows == 0:
            raise DataError(f"{source}: no valid rows" if n_errors else f"{source}: no rows", errors, n_errors)
    summary.dropped = n_errors
    summary.errors = errors
    return _report(summary, "prepared")


def run_blend(inputs: list[str | Path], output: str | Path, balance: bool = True, seed: int = 0) -> Summary:
    """An even, shuffled mix of several prepared JSONL files, the same for the same seed.

    balance (default): the same number of rows from each input, as many as the smallest
    has, sampled from each with the seed. Not balanced: every row of every input. The
    order is then shuffled with the seed. Every row must carry a valid agent_ref (that is
    what routes a mixed batch); run `farm data prepare --agent NAME` on a file without.
    Only line offsets are held in memory; rows are copied byte for byte.
    """
    if not inputs:
        raise DataError("blend needs at least one input")
    paths = [Path(p) for p in inputs]
    if len(set(paths)) != len(paths):
        raise DataError("the same input is given twice")
    offsets: list[array.array] = []
    for p in paths:
        if not p.is_file():
            raise DataError(f"no such file: {p}")
        offsets.append(_row_offsets(p))
    counts = [len(o) for o in offsets]
    if min(counts) == 0:
        raise DataError(f"{paths[counts.index(0)]} has no rows")
    rng = random.Random(seed)
    take = [min(counts)] * len(paths) if balance else counts
    picks: list[tuple[int, int]] = []
    for i, (n, k) in enumerate(zip(counts, take)):
        chosen = sorted(rng.sample(range(n), k)) if k < n else range(n)
        picks += [(i, j) for j in chosen]
    rng.shuffle(picks)
    summary = Summary(output=str(output), per_input={str(p): k for p, k in zip(paths, take)})
    handles = [open(p, "rb") for p in paths]
    try:
        with atomic_output(output) as f:
            for i, j in picks:
                handles[i].seek(offsets[i][j])
                line = handles[i].readline().decode("utf-8").rstrip("\r\n")
                f.write(line + "\n")
                summary.rows += 1
    finally:
        for h in handles:
            h.close()
    return _report(summary, "blended")


def _row_offsets(path: Path) -> array.array:
    """Byte offsets of the rows of `path`, after checking each one (line-numbered errors)."""
    offsets = array.array("q")
    errors: list[LineError] = []
    n_errors = 0
    pos = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            start, pos = pos, pos + len(raw)
            row = decode_line(n, raw, path)
            if row is None:
                continue
            problems = [row.message] if isinstance(row, LineError) else check_row(row)
            if problems:
                n_errors += 1
                if len(errors) < MAX_REPORTED:
                    errors.append(LineError(n, "; ".join(problems)))
                continue
            offsets.append(start)
    if n_errors:
        raise DataError(f"{path}: {_rows(n_errors)} invalid; nothing written", errors, n_errors)
    return offsets
