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

    DataError(FarmError)      a file with invalid rows (`.errors`: RowError with line numbers),
                              or inputs that cannot be read
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
from typing import IO, Callable, Collection, Iterator, Mapping, Optional

from farm.errors import FarmError

AGENT_TYPE = "responses_api_agents"
ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_REPORTED = 20  # errors listed in a DataError message; all are counted


@dataclass
class RowError:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class DataError(FarmError):
    def __init__(self, message: str, errors: Optional[list[RowError]] = None, total: Optional[int] = None):
        self.errors = errors or []
        shown = "".join(f"\n  {e}" for e in self.errors[:MAX_REPORTED])
        more = (total or len(self.errors)) - min(len(self.errors), MAX_REPORTED)
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
    errors: list[RowError] = field(default_factory=list)

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


# -- validation ----------------------------------------------------------------------------
RowTypeOf = Callable[[str], Optional[type]]


def row_types(agent_envs: Optional[Mapping[str, str]] = None) -> RowTypeOf:
    """agent name -> the Row type of the environment serving it (configured agents through
    `agent_envs`, else the environment of that name); None for agents without one (`noop`).
    Each environment class is looked up once."""
    from envs.sdk import available_envs

    envs = available_envs()
    found: dict[str, Optional[type]] = {}

    def of(agent: str) -> Optional[type]:
        if agent not in found:
            env = (agent_envs or {}).get(agent, agent)
            found[agent] = getattr(envs[env].load(), "row_type", None) if env in envs else None
        return found[agent]

    return of


def check_row(
    row: object,
    *,
    agents: Optional[Collection[str]] = None,
    need_agent_ref: bool = True,
    row_type_of: Optional[RowTypeOf] = None,
) -> list[str]:
    """What is wrong with one decoded row (empty when nothing), phrased for a person. With
    `row_type_of`, the row is also checked against its agent's environment's Row type."""
    if not isinstance(row, dict):
        return [f"a row must be a JSON object, not {type(row).__name__}"]
    problems = []
    params = row.get("responses_create_params")
    if params is None:
        problems.append("missing `responses_create_params`")
    elif not isinstance(params, dict):
        problems.append("`responses_create_params` must be an object")
    else:
        problems += _check_input(params.get("input"))
        problems += _check_tools(params.get("tools"))
    follow = row.get("follow_up_messages")
    if follow is not None and not (isinstance(follow, list) and all(isinstance(m, (str, dict)) for m in follow)):
        problems.append("`follow_up_messages` must be a list of strings or messages")
    ref = row.get("agent_ref")
    if ref is None:
        if need_agent_ref:
            problems.append("missing `agent_ref` (give --agent NAME to add one)")
    elif not isinstance(ref, dict) or not isinstance(ref.get("name"), str) or not ref["name"]:
        problems.append('`agent_ref` must be {"type": "responses_api_agents", "name": "<agent>"}')
    elif ref.get("type", AGENT_TYPE) != AGENT_TYPE:
        problems.append(f"`agent_ref.type` must be {AGENT_TYPE!r}, not {ref.get('type')!r}")
    elif agents is not None and ref["name"] not in agents:
        problems.append(f"unknown agent_ref name {ref['name']!r}; known: {', '.join(sorted(agents)) or 'none'}")
    elif row_type_of is not None and not problems:
        problems += _check_type(row, row_type_of(ref["name"]))
    return problems


def _check_type(row: dict, row_type: Optional[type]) -> list[str]:
    from envs.sdk import RowError, parse_row

    if row_type is None:
        return []
    try:
        parse_row(row, row_type)
    except RowError as exc:
        return [str(exc)]
    return []


def _check_input(items: object) -> list[str]:
    if isinstance(items, str):
        return [] if items.strip() else ["`responses_create_params.input` is an empty string"]
    if not isinstance(items, list):
        return ["`responses_create_params.input` must be a string or a list of messages"]
    if not items:
        return ["`responses_create_params.input` is empty"]
    for i, m in enumerate(items):
        where = f"`responses_create_params.input[{i}]`"
        if not isinstance(m, dict):
            return [f"{where} must be an object"]
        if m.get("role") not in ROLES:
            return [f"{where} has role {m.get('role')!r}; expected one of {', '.join(sorted(ROLES))}"]
        content = m.get("content", "")
        if not isinstance(content, str) and not (
            isinstance(content, list) and all(isinstance(p, dict) for p in content)
        ):
            return [f"{where}.content must be a string or a list of content parts"]
    return []


def _check_tools(tools: object) -> list[str]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        return ["`responses_create_params.tools` must be a list"]
    for i, t in enumerate(tools):
        fn = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return [f"`responses_create_params.tools[{i}]` must be a function tool with a name"]
        if not isinstance(fn.get("parameters", {}), dict):
            return [f"`responses_create_params.tools[{i}].parameters` must be a JSON schema object"]
    return []


def read_rows(path: str | Path) -> Iterator[tuple[int, object]]:
    """(line number, decoded value or a RowError) for every non-blank line, streamed."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield n, RowError(n, f"not UTF-8 text ({exc.reason} at byte {exc.start}) in {path}")
                continue
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as exc:
                yield n, RowError(n, f"invalid JSON: {exc.msg} at column {exc.colno}")


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
    size: int,
    seed: int,
    output: str | Path,
    *,
    agent: Optional[str] = None,
    options: Optional[dict] = None,
) -> Summary:
    """`size` rows from environment `env_name`'s generator, as JSONL, the same for the same seed.

    Every row is routed to `agent` (default: the environment's name); any agent_ref the
    generator wrote is replaced, so `--agent weather` retargets a whole file.
    """
    from envs.sdk import load_env

    if size < 0:
        raise DataError(f"size must be >= 0, got {size}")
    env = load_env(env_name, options)
    rows = env.generate(size, seed)
    if len(rows) != size:
        raise DataError(f"environment {env_name} generated {len(rows)} rows, not {size}")
    ref = {"type": AGENT_TYPE, "name": agent or env_name}
    summary = Summary(output=str(output))
    with atomic_output(output) as f:
        for i, row in enumerate(rows, 1):
            row = {**row, "agent_ref": dict(ref)}
            problems = check_row(row) or _check_type(row, env.row_type)
            if problems:
                raise DataError(f"environment {env_name} generated an invalid row", [RowError(i, p) for p in problems])
            f.write(_dump(row))
            summary.rows += 1
    summary.per_agent[ref["name"]] = summary.rows
    return _report(summary, "generated")


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

    A row without `agent_ref` gets {type: responses_api_agents, name: agent}; with
    `replace_agent`, every row is retargeted to `agent` (e.g. rows exported by NeMo Gym
    for `math_with_judge_simple_agent`, served here by `math`). `agents`, when given, is
    the set of names an agent_ref may use; `row_type_of` (see row_types) checks each row
    against its environment's Row. Rows are otherwise written unchanged.

    strict (default): any invalid row raises DataError listing the bad lines, and the
    output is not touched. Not strict: invalid rows are dropped and listed in the summary.
    The output defaults to `path` itself, replaced atomically.
    """
    if replace_agent and not agent:
        raise DataError("replace_agent needs an agent name")
    if agent and agents is not None and agent not in agents:
        raise DataError(f"unknown agent {agent!r}; known: {', '.join(sorted(agents)) or 'none'}")
    source = Path(path)
    if not source.is_file():
        raise DataError(f"no such file: {source}")
    summary = Summary(output=str(output or source))
    errors: list[RowError] = []
    n_errors = 0
    with atomic_output(output or source) as f:
        for line, row in read_rows(source):
            if isinstance(row, RowError):
                problems = [row.message]
            else:
                if isinstance(row, dict) and agent and (replace_agent or row.get("agent_ref") is None):
                    summary.agent_refs_added += row.get("agent_ref") is None
                    row = {**row, "agent_ref": {"type": AGENT_TYPE, "name": agent}}
                problems = check_row(row, agents=agents, row_type_of=row_type_of)
            if problems:
                n_errors += 1
                if len(errors) < MAX_REPORTED:
                    errors.append(RowError(line, "; ".join(problems)))
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
    errors: list[RowError] = []
    n_errors = 0
    pos = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            start, pos = pos, pos + len(raw)
            if not raw.strip():
                continue
            try:
                problems = check_row(json.loads(raw))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                problems = [f"invalid JSON: {exc}"]
            if problems:
                n_errors += 1
                if len(errors) < MAX_REPORTED:
                    errors.append(RowError(n, "; ".join(problems)))
                continue
            offsets.append(start)
    if n_errors:
        raise DataError(f"{path}: {_rows(n_errors)} invalid; nothing written", errors, n_errors)
    return offsets
