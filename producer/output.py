"""Files of a collection: the input rows, the journal of rollouts, the sidecars, parquet.

The input is streamed line by line, never loaded whole: a first pass checks every line and
counts the work (so bad lines and unknown agents are reported before anything is enqueued),
a second pass feeds the queue. Row indices count the valid rows, so they are the same on
every pass and every re-run over the same file.

Rollouts are appended to the output as whole lines: each batch of lines goes to the file in
one `os.write` on an O_APPEND descriptor, with SIGINT turned into a flag by the collector,
so Ctrl-C cannot tear a line. A crash (SIGKILL, power loss) can still leave a partial last
line; `repair_tail` cuts it off before a resumed run appends. Rollouts without an answer
(failed, or cancelled by a client) go to the `*_failures.jsonl` sidecar in the same line
format, with the reason, so resuming and metrics read both files the same way:
`(row_index, repeat_index)` is the identity of a line (producer.metrics tells the two apart by
status).
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import msgspec

from farm.errors import ConfigError
from farm.keys import check_name
from farm.rows import normalize_row
from farm.schema import Rollout, Task, TokenTrace

_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()

log = logging.getLogger("farm.output")


class InputError(ConfigError):
    """The input cannot be collected as asked (bad lines under --strict, unknown agents, no valid row)."""


@dataclass(frozen=True)
class Paths:
    """Where a collection writes. `journal` is the JSONL the rollouts are appended to."""

    output: Path
    journal: Path
    failures: Path
    metrics: Path
    run: Path

    @classmethod
    def for_output(cls, output: Path, fmt: str = "jsonl") -> "Paths":
        output = Path(output)
        stem = output.with_suffix("") if output.suffix in (".jsonl", ".json", ".parquet") else output
        # Parquet cannot be appended to: collect into a JSONL journal, convert at the end.
        journal = output if fmt == "jsonl" else Path(f"{output}.journal.jsonl")
        return cls(
            output=output,
            journal=journal,
            failures=Path(f"{stem}_failures.jsonl"),
            metrics=Path(f"{stem}_metrics.json"),
            run=Path(f"{stem}_run.json"),
        )


# -- input ---------------------------------------------------------------------------------


@dataclass
class InputRow:
    index: int  # among the valid rows of the file, from 0
    line: int  # 1-based line number in the file
    agent: str
    row: dict


@dataclass
class BadLine:
    line: int
    reason: str


def read_rows(
    path: Path, agent_override: Optional[str] = None, limit: Optional[int] = None
) -> Iterator[InputRow | BadLine]:
    """Valid rows and bad lines of a JSONL file, in file order, one line in memory at a time."""
    index = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if limit is not None and index >= limit:
                return
            if not raw.strip():
                continue
            item = _parse(raw, number, index, agent_override)
            if isinstance(item, InputRow):
                index += 1
            yield item


def _parse(raw: bytes, number: int, index: int, agent_override: Optional[str]) -> InputRow | BadLine:
    try:
        row = _decode.decode(raw)
    except msgspec.DecodeError as exc:
        return BadLine(number, f"not valid JSON ({exc})")
    except UnicodeDecodeError as exc:
        return BadLine(number, f"not UTF-8 text ({exc.reason} at byte {exc.start})")
    if not isinstance(row, dict):
        return BadLine(number, f"a row must be a JSON object, got {type(row).__name__}")
    row = normalize_row(row)  # a row in TRL's shape (prompt + columns) as a farm row
    params = row.get("responses_create_params")
    if not isinstance(params, dict) or "input" not in params:
        return BadLine(number, "missing `responses_create_params.input`")
    name = agent_override
    if name is None:
        ref = row.get("agent_ref")
        name = ref.get("name") if isinstance(ref, dict) else None
        if not isinstance(name, str):
            return BadLine(number, "no `agent_ref.name` (pass --agent to set one for every row)")
    try:
        check_name(name, "agent name")
    except ValueError as exc:
        return BadLine(number, str(exc))
    return InputRow(index=index, line=number, agent=name, row=row)


# -- output lines --------------------------------------------------------------------------


def trace_record(trace: TokenTrace) -> dict[str, Any]:
    """A token trace as plain JSON types: lists, not packed bytes (the wire's little-endian arrays)."""
    return {
        "prompt_ids": trace.prompt().tolist(),
        "completion_ids": trace.completion().tolist(),
        "logprobs": trace.completion_logprobs().tolist(),
        "env_mask": trace.mask(),
        "turns": [list(t) for t in trace.turns],
    }


def rollout_record(rollout: Rollout) -> dict[str, Any]:
    """The rollout as plain JSON types: the token trace and each further segment as lists, in one encoding."""
    out = msgspec.to_builtins(msgspec.structs.replace(rollout, trace=None, segments=[]))
    out["trace"] = None if rollout.trace is None else trace_record(rollout.trace)
    out["segments"] = [trace_record(segment) for segment in rollout.segments]
    return out


def line_for(
    task: Task, rollout: Rollout, *, row_index: int, repeat_index: int, num_repeats: int, line: int, submitted_at: float
) -> bytes:
    record = {
        "row_index": row_index,
        "repeat_index": repeat_index,
        "num_repeats": num_repeats,
        "line": line,
        "agent": task.agent_ref.name,
        "run_id": task.run_id,
        "task_id": task.task_id,
        "submitted_at": submitted_at,
        "row": task.row,
        "rollout": rollout_record(rollout),
    }
    if rollout.error is not None:
        record["reason"] = f"{rollout.error.kind}: {rollout.error.message}"
    return _encode.encode(record) + b"\n"


class Journal:
    """Appends whole lines with one write per batch; nothing is buffered in the process."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, lines: list[bytes]) -> None:
        if not lines:
            return
        view = memoryview(b"".join(lines))
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def close(self) -> None:
        if self.fd >= 0:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1


def open_journals(paths: Paths, stack: ExitStack) -> tuple[Journal, Journal]:
    """The rollouts' journal and the failures', closed when `stack` closes."""
    ok = stack.enter_context(closing(Journal(paths.journal)))
    failures = stack.enter_context(closing(Journal(paths.failures)))
    return ok, failures


def start_output(paths: Paths, resume: bool, overwrite: bool) -> None:
    """A run's output files as `farm collect` and `farm reverify` both take them: refused when they
    already hold rollouts (unless --resume or --overwrite), cleared with --overwrite, and with
    --resume their torn last lines cut."""
    existing = [p for p in (paths.journal, paths.failures) if p.exists() and p.stat().st_size]
    if paths.output != paths.journal and paths.output.exists() and not overwrite:
        existing.insert(0, paths.output)
    if existing and not (resume or overwrite):
        raise InputError(
            f"{existing[0]} already holds rollouts: pass --resume to complete it, or --overwrite to start again"
        )
    if overwrite and not resume:
        for p in (paths.journal, paths.failures, paths.metrics, paths.run, paths.output):
            p.unlink(missing_ok=True)
    if resume:
        for p in (paths.journal, paths.failures):
            cut = repair_tail(p)
            if cut:
                log.warning("%s: dropped a partial last line (%d bytes) left by an interrupted run", p, cut)


def written_per_agent(paths: Paths, agent: Optional[str] = None) -> dict[str, int]:
    """The lines already written (rollouts and failures) per agent; all `agent`'s when one is given."""
    counts: dict[str, int] = defaultdict(int)
    for p in (paths.journal, paths.failures):
        for rec in read_records(p):
            counts[rec["agent"] if agent is None else agent] += 1
    return counts


def repair_tail(path: Path) -> int:
    """Cut a partial last line left by a crash; returns the bytes dropped."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        keep = size
        step = 1 << 16
        while keep > 0:
            start = max(0, keep - step)
            f.seek(start)
            chunk = f.read(keep - start)
            if keep == size and chunk.endswith(b"\n"):
                return 0
            at = chunk.rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            keep = start
        f.truncate(keep)
        return size - keep


def read_records(path: Path) -> Iterator[dict]:
    """The records of a journal or failures file (after repair_tail), one at a time."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if raw.strip():
                try:
                    yield _decode.decode(raw)
                except msgspec.DecodeError as exc:
                    raise InputError(
                        f"{path}:{number}: unreadable output line ({exc}); move the file aside or fix the line"
                    ) from None


def done_keys(*paths: Path) -> set[tuple[int, int]]:
    """(row_index, repeat_index) of every line already written."""
    done: set[tuple[int, int]] = set()
    for path in paths:
        for rec in read_records(path):
            done.add((rec["row_index"], rec["repeat_index"]))
    return done


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


# -- parquet -------------------------------------------------------------------------------


def to_parquet(journal: Path, out: Path, batch: int = 4096) -> int:
    """Convert the journal to parquet in batches (bounded memory); returns the rows written.

    Flat, fixed columns so files from any mix of environments share one schema: token traces
    as typed lists (ready for training), a harness rollout's further segments as a list of
    structs of the same lists, the free-form parts (row, output items, metrics) as JSON strings.
    Loads with `datasets.load_dataset("parquet", data_files=...)`.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    segment = pa.struct(
        [
            ("prompt_ids", pa.list_(pa.int32())),
            ("completion_ids", pa.list_(pa.int32())),
            ("logprobs", pa.list_(pa.float32())),
            ("env_mask", pa.list_(pa.int8())),
            ("turns", pa.list_(pa.list_(pa.int32()))),
        ]
    )

    schema = pa.schema(
        [
            ("row_index", pa.int64()),
            ("repeat_index", pa.int32()),
            ("num_repeats", pa.int32()),
            ("agent", pa.string()),
            ("run_id", pa.string()),
            ("task_id", pa.string()),
            ("status", pa.string()),
            ("reward", pa.float64()),
            ("reward_components", pa.string()),
            ("metrics", pa.string()),
            ("row", pa.string()),
            ("output", pa.string()),
            ("prompt_ids", pa.list_(pa.int32())),
            ("completion_ids", pa.list_(pa.int32())),
            ("logprobs", pa.list_(pa.float32())),
            ("env_mask", pa.list_(pa.int8())),
            ("segments", pa.list_(segment)),
            ("latency_s", pa.float64()),
            ("worker_id", pa.string()),
            ("policy_version", pa.int64()),
            ("policy_version_end", pa.int64()),
        ]
    )
    dumps = lambda v: json.dumps(v, ensure_ascii=False)  # noqa: E731
    written = 0
    tmp = Path(f"{out}.tmp")
    with pq.ParquetWriter(tmp, schema) as writer:
        cols: dict[str, list] = {name: [] for name in schema.names}

        def flush() -> None:
            nonlocal written
            if cols["row_index"]:
                writer.write_table(pa.table(cols, schema=schema))
                written += len(cols["row_index"])
                for v in cols.values():
                    v.clear()

        for rec in read_records(journal):
            r = rec["rollout"]
            trace = r.get("trace") or {}
            for name, value in (
                ("row_index", rec["row_index"]),
                ("repeat_index", rec["repeat_index"]),
                ("num_repeats", rec["num_repeats"]),
                ("agent", rec["agent"]),
                ("run_id", rec["run_id"]),
                ("task_id", rec["task_id"]),
                ("status", r["status"]),
                ("reward", r.get("reward")),
                ("reward_components", dumps(r.get("reward_components") or {})),
                ("metrics", dumps(r.get("metrics") or {})),
                ("row", dumps(rec["row"])),
                ("output", dumps(r.get("output") or [])),
                ("prompt_ids", trace.get("prompt_ids", [])),
                ("completion_ids", trace.get("completion_ids", [])),
                ("logprobs", trace.get("logprobs", [])),
                ("env_mask", trace.get("env_mask", [])),
                ("segments", r.get("segments") or []),
                ("latency_s", (r.get("timings") or {}).get("total_s")),
                ("worker_id", r.get("worker_id", "")),
                ("policy_version", r.get("policy_version", 0)),
                ("policy_version_end", r.get("policy_version_end")),
            ):
                cols[name].append(value)
            if len(cols["row_index"]) >= batch:
                flush()
        flush()
    os.replace(tmp, out)
    return written
