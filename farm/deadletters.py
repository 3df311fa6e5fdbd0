"""Dead letters: list, show, requeue and purge an agent's dead-letter stream.

A dead letter (farm.streams.AgentStream.dead_op) holds the task's entry as it was written
(`v`, `d`) and why it died (`kind`, `reason`, `attempts`, `worker`, `at`). Requeueing writes the
entry back to the agent's task stream and deletes the letter, in one script per letter, so a
letter is never both requeued and kept, nor requeued twice; the task starts over with its
attempts. `farm dead ...` and the dashboard's dead-letter browser both use these functions.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Optional

import msgspec
import redis

from farm import schema, scripts
from farm.errors import SchemaError
from farm.keys import Keys, text


def _iso(at: Any) -> str:
    try:
        return dt.datetime.fromtimestamp(float(at), dt.timezone.utc).isoformat(timespec="seconds")
    except (ValueError, OverflowError, OSError):
        return ""


def _letter(entry_id: Any, fields: dict, max_entry_bytes: int, with_task: bool) -> dict[str, Any]:
    """The letter's fields; with its task, also `task` (plain types) and `history`: every attempt the
    task records (schema.Attempt, the last one included), each with `at_iso`."""
    out: dict[str, Any] = {"id": text(entry_id)}
    for key in ("kind", "reason", "agent", "attempts", "worker", "at", "entry_id"):
        out[key] = text(fields.get(key.encode(), b""))
    out["at_iso"] = _iso(out["at"])
    try:
        task = schema.decode_task({b"v": fields.get(b"v", b""), b"d": fields.get(b"d", b"")}, max_entry_bytes)
        out["task_id"], out["run_id"] = task.task_id, task.run_id
        if with_task:
            out["task"] = msgspec.to_builtins(task)
            out["history"] = [{**msgspec.to_builtins(a), "at_iso": _iso(a.at)} for a in task.history]
    except SchemaError as exc:
        out["task_id"], out["run_id"] = "", ""
        if with_task:
            out["task"] = None
            out["task_error"] = str(exc)
            out["history"] = []
    return out


def list_dead(r: redis.Redis, keys: Keys, agent: str, count: int = 50, *, max_entry_bytes: int) -> list[dict]:
    """The newest `count` dead letters of `agent`, newest first."""
    entries: Any = r.xrevrange(keys.dead(agent), count=count)
    return [_letter(i, f, max_entry_bytes, with_task=False) for i, f in entries]


STREAM_ID = re.compile(r"^\d{1,20}-\d{1,20}$")


def show_dead(r: redis.Redis, keys: Keys, agent: str, letter_id: str, *, max_entry_bytes: int) -> Optional[dict]:
    """One dead letter with its task, or None when there is none by that id (or it is no stream id)."""
    if not STREAM_ID.match(letter_id):
        return None
    entries: Any = r.xrange(keys.dead(agent), letter_id, letter_id)
    return _letter(entries[0][0], entries[0][1], max_entry_bytes, with_task=True) if entries else None


def count_dead(r: redis.Redis, keys: Keys, agent: str) -> int:
    return int(r.xlen(keys.dead(agent)))


def _ids(r: redis.Redis, keys: Keys, agent: str, ids: Optional[list[str]]) -> list[str]:
    if ids is not None:
        return list(ids)
    entries: Any = r.xrange(keys.dead(agent))
    return [text(i) for i, _ in entries]


def requeue(r: redis.Redis, keys: Keys, agent: str, ids: Optional[list[str]] = None, batch: int = 500) -> int:
    """Put dead letters back on the agent's task stream (all when `ids` is None); how many went back.

    A requeued task starts over: its body goes back with `attempt` 1, so it gets max_attempts
    attempts again (the letter holds the attempt it died on, which would dead-letter it again at
    once). A letter whose task cannot be decoded goes back as it is, to end as a dead letter again
    with the decoding error as its reason."""
    wanted = _ids(r, keys, agent, ids)
    done = 0
    for start in range(0, len(wanted), batch):
        chunk = wanted[start : start + batch]
        pipe = r.pipeline(transaction=False)
        for entry_id in chunk:
            pipe.xrange(keys.dead(agent), entry_id, entry_id)
        letters = []
        for entry_id, found in zip(chunk, pipe.execute()):
            if not found:
                continue
            fields = found[0][1]
            version, body = fields.get(b"v"), fields.get(b"d")
            if not version or not body:
                continue
            try:
                task = schema.decode_task({b"v": version, b"d": body})
            except SchemaError:
                pass
            else:
                version, body = schema.entry(msgspec.structs.replace(task, attempt=1)).values()
            letters.append((entry_id, version, body))
        if letters:
            done += int(scripts.requeue(dead=keys.dead(agent), stream=keys.tasks(agent), letters=letters).run_sync(r))
    if done:
        r.sadd(keys.agents(), agent)
    return done


def purge(r: redis.Redis, keys: Keys, agent: str, ids: Optional[list[str]] = None) -> int:
    """Delete dead letters (all when `ids` is None); how many were deleted."""
    if ids is None:
        n = int(r.xlen(keys.dead(agent)))
        r.delete(keys.dead(agent))
        return n
    return int(r.xdel(keys.dead(agent), *ids)) if ids else 0
