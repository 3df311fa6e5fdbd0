"""The Lua scripts that make each delivery step atomic, and the one way to call each.

Every script that settles a task first checks that the entry is still pending and does nothing
when it is not: the task was already settled (by this worker before a retried call, or by
another worker that reclaimed it), so running a script twice never duplicates a rollout. It
then writes the rollout (or retry, or dead letter) and acknowledges the task only once that
write succeeded: a write that fails (out of memory, a key of the wrong type) leaves the task
pending, to be delivered again, never lost. Keys touched are all passed in KEYS, as Redis requires.

Each script is one file, `farm/lua/NAME.lua`, that opens with the table of its KEYS and ARGV and
names them as locals before it uses them. What several scripts share (the pending check, the
in-flight counts, the reply-stream check, the queues and backlog) is written once in
`farm/lua/includes/` and spliced into each script that names it (`-- #include flight`) when this
module is imported, so what Redis runs is still one self-contained source per script, with one
SHA; comments are dropped from it (the files are for readers, the wire carries code).

The function named after a script (`settle`, `feed`, ...) is the only place that knows its
argument order: it takes named values and returns a `Call`, which the caller runs (`await
call.run(r)`, reloading the scripts once if Redis lost them), queues in a pipeline
(`call.queue(pipe)`, the caller reloads on NOSCRIPT) or, from a client that never loads scripts,
sends as source (`call.queue_source(pipe)`, `await call.run_source(r)`).

A settle travels as a SettleOp: a Call (SETTLE or RETRY) together with the outcome it stands
for, built in one place (farm.streams.AgentStream), which the Settler counts only once the
script has answered that it settled the task.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Iterable, Literal, Mapping, Optional

import msgspec
from redis.exceptions import NoScriptError

_LUA = resources.files("farm").joinpath("lua")
_INCLUDE = re.compile(r"^-- #include (\w+)\n", re.M)
_HEADER = re.compile(r"\A--\[\[\n(.*?)\n\]\]\n", re.S)
_ROW = re.compile(r"^ *(KEYS|ARGV)\[(\d+)(\.\.)?\] +(\w+)", re.M)
_COMMENTS = re.compile(r"^--\[\[\n.*?\n\]\]\n|^ *--[^\n]*\n|^\s*\n", re.S | re.M)


@dataclass(frozen=True)
class Script:
    """One script as loaded: its source as Redis runs it, and its KEYS/ARGV table (the named
    positions in order, and the name of the variable tail that follows them, '' when none)."""

    name: str
    source: str
    sha: str
    keys: tuple[str, ...]
    argv: tuple[str, ...]
    keys_tail: str
    argv_tail: str


def _read(path: str) -> str:
    return _LUA.joinpath(path).read_text(encoding="utf-8")


def _splice(text: str, seen: set[str]) -> str:
    """Replace each `-- #include NAME` by includes/NAME.lua (itself spliced), each name once."""

    def include(m: re.Match) -> str:
        if m[1] in seen:
            return ""
        seen.add(m[1])
        return _splice(_read(f"includes/{m[1]}.lua"), seen) + "\n"

    return _INCLUDE.sub(include, text)


def _load(name: str) -> Script:
    text = _read(f"{name}.lua")
    header = _HEADER.match(text)
    if header is None:
        raise ValueError(f"farm/lua/{name}.lua does not open with its --[[ KEYS/ARGV ]] table")
    rows: dict[str, list[str]] = {"KEYS": [], "ARGV": []}
    tails = {"KEYS": "", "ARGV": ""}
    for kind, pos, tail, label in _ROW.findall(header[1]):
        if tails[kind] or int(pos) != len(rows[kind]) + 1:
            raise ValueError(f"farm/lua/{name}.lua: {kind}[{pos}] is out of order in its table")
        if tail:
            tails[kind] = label
        else:
            rows[kind].append(label)
    source = _COMMENTS.sub("", _splice(text, set()))
    sha = hashlib.sha1(source.encode()).hexdigest()
    return Script(name, source, sha, tuple(rows["KEYS"]), tuple(rows["ARGV"]), tails["KEYS"], tails["ARGV"])


SCRIPTS: dict[str, Script] = {
    name: _load(name) for name in sorted(p.name.removesuffix(".lua") for p in _LUA.iterdir() if p.name.endswith(".lua"))
}
SOURCES = {name: s.source for name, s in SCRIPTS.items()}
SHAS = {name: s.sha for name, s in SCRIPTS.items()}

# settle.lua's and retry.lua's answers, besides settle.lua's refused reply streams (-1, -2).
SETTLED, NOT_PENDING = 1, 0


async def load_scripts(r: Any) -> None:
    """Load every script into Redis's cache (a worker at start, and after NOSCRIPT: Redis restarted)."""
    for name, src in SOURCES.items():
        sha = await r.script_load(src)
        assert sha == SHAS[name], f"script {name} hashed differently by Redis"


class Call(msgspec.Struct, frozen=True, kw_only=True):
    """One script with its KEYS and ARGV, laid out by the script's function below."""

    script: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]

    def queue(self, pipe: Any) -> None:
        """Add it to a pipeline by SHA; the caller reloads the scripts when the pipeline meets NOSCRIPT."""
        pipe.evalsha(SHAS[self.script], len(self.keys), *self.keys, *self.args)

    def queue_source(self, pipe: Any) -> None:
        """Add it to a pipeline as source: for clients, which never load scripts nor meet NOSCRIPT."""
        pipe.eval(SOURCES[self.script], len(self.keys), *self.keys, *self.args)

    async def run(self, r: Any) -> Any:
        try:
            return await r.evalsha(SHAS[self.script], len(self.keys), *self.keys, *self.args)
        except NoScriptError:
            await load_scripts(r)
            return await r.evalsha(SHAS[self.script], len(self.keys), *self.keys, *self.args)

    async def run_source(self, r: Any) -> Any:
        return await r.eval(SOURCES[self.script], len(self.keys), *self.keys, *self.args)

    def run_sync(self, r: Any) -> Any:
        """`run` on a blocking connection."""
        try:
            return r.evalsha(SHAS[self.script], len(self.keys), *self.keys, *self.args)
        except NoScriptError:
            r.script_load(SOURCES[self.script])
            return r.evalsha(SHAS[self.script], len(self.keys), *self.keys, *self.args)


# -- one function per script: the only place its argument order is written ---------------------


def settle(
    *,
    stream: str,
    stats: str,
    open_tasks: str,
    open_runs: str,
    fair: str,
    runs: str,
    group: str,
    entry_id: str,
    stat: str,
    prefix: str,
    check_reply: bool,
    task_id: str,
    run_id: str,
    flight: str,
    appends: Iterable[tuple],
) -> Call:
    """settle.lua. `appends`: (stream, fields) or (stream, fields, maxlen, dropped-stat), in the
    order written; with `check_reply`, the first is the reply stream, checked against `prefix`."""
    keys = [stream, stats, open_tasks, open_runs, fair, runs]
    reply = len(keys) + 1 if check_reply else 0
    args: list = [group, entry_id, stat, prefix, reply, task_id, run_id, flight]
    for key, fields, *cap in appends:
        maxlen, dropstat = cap if cap else (0, "")
        keys.append(key)
        args += [len(fields), maxlen, dropstat]
        for k, v in fields.items():
            args += [k, v]
    return Call(script="settle", keys=tuple(keys), args=tuple(args))


def retry(
    *,
    stream: str,
    delayed: str,
    stats: str,
    fair: str,
    runs: str,
    group: str,
    entry_id: str,
    due: float,
    body: bytes,
    flight: str,
) -> Call:
    """retry.lua."""
    return Call(script="retry", keys=(stream, delayed, stats, fair, runs), args=(group, entry_id, due, body, flight))


def promote(*, delayed: str, stream: str, fair: str, runs: str, now: float, limit: int, version: int) -> Call:
    """promote.lua."""
    return Call(script="promote", keys=(delayed, stream, fair, runs), args=(now, limit, version))


def enqueue(
    *, fair: str, runs: str, queue: str, backlog: str, run: str, share: float, cap: int, items: Iterable[bytes]
) -> Call:
    """enqueue.lua; `items` each `VERSION|BODY` (farm.fairness.item)."""
    return Call(script="enqueue", keys=(fair, runs, queue, backlog), args=(run, repr(share), cap, *items))


def feed(*, fair: str, runs: str, stream: str, backlog: str, group: str, want: int, queue_prefix: str) -> Call:
    """feed.lua."""
    return Call(script="feed", keys=(fair, runs, stream, backlog), args=(group, want, queue_prefix))


def drain(
    *,
    fair: str,
    runs: str,
    queue: str,
    backlog: str,
    open_tasks: str,
    open_runs: str,
    stats: str,
    run: str,
    prefix: str,
    tasks: Iterable[tuple[bytes, str, str, Any, Any]],
) -> Call:
    """drain.lua. `tasks`: (queued item, reply stream, task id, rollout version, rollout body)."""
    keys = [fair, runs, queue, backlog, open_tasks, open_runs, stats]
    replies: dict[str, int] = {}
    args: list = [run, prefix]
    for item, reply_to, task_id, version, body in tasks:
        index = replies.setdefault(reply_to, len(keys) + 1 + len(replies))
        args += [item, index, task_id, version, body]
    return Call(script="drain", keys=(*keys, *replies), args=tuple(args))


def renew(*, stream: str, group: str, consumer: str, ids: Iterable[str]) -> Call:
    """renew.lua."""
    return Call(script="renew", keys=(stream,), args=(group, consumer, *ids))


def release(*, stream: str, group: str, consumer: str, idle_ms: int, ids: Iterable[str]) -> Call:
    """release.lua."""
    return Call(script="release", keys=(stream,), args=(group, consumer, idle_ms, *ids))


def prune(*, stream: str, group: str, idle_ms: int, keep: str) -> Call:
    """prune.lua."""
    return Call(script="prune", keys=(stream,), args=(group, idle_ms, keep))


def bucket(*, bucket: str, stream: str, backlog: str, ttl_s: int, counts: Mapping[str, float]) -> Call:
    """bucket.lua; a float count is written with a '.', which is how the script tells it from an int."""
    args: list = [ttl_s]
    for k, v in counts.items():
        args += [k, v if type(v) is int else f"{v:.9f}"]
    return Call(script="bucket", keys=(bucket, stream, backlog), args=tuple(args))


def requeue(*, dead: str, stream: str, letters: Iterable[tuple[Any, Any, Any]]) -> Call:
    """requeue.lua. `letters`: (letter id, schema version, task body)."""
    return Call(script="requeue", keys=(dead, stream), args=tuple(a for letter in letters for a in letter))


# -- a settle, as the Settler runs and counts it -----------------------------------------------

# What a settle makes of its task once the script settled it: the stats field the script
# increments, and the worker counter of the same name the Settler moves.
Outcome = Literal["done", "failed", "dead", "retried", "cancelled", "interrupted"]


class HistoryCount(msgspec.Struct, frozen=True, kw_only=True):
    """A settle's increments to its minute's history bucket (farm.history), added once it acknowledged."""

    bucket: str  # the bucket's key
    stream: str  # the task stream and the agent's backlog list (farm.fairness): their lengths
    backlog: str  # added are the bucket's depth, every task not yet settled
    ttl_s: int
    increments: dict[str, float]


class SettleOp(Call, frozen=True, kw_only=True):
    """One task's settle step: its Call (settle or retry) and what it stands for, read by name by
    the Settler once Redis has answered. A Struct, not a dataclass: one is built per task, and a
    frozen Struct costs a tenth as much."""

    entry_id: str
    agent: str
    outcome: Outcome
    kind: str  # why the task failed (the ErrorKind of a failed rollout, retry or dead letter); '' when it did not
    history: Optional[HistoryCount] = None

    @classmethod
    def of(
        cls,
        call: Call,
        *,
        entry_id: str,
        agent: str,
        outcome: Outcome,
        kind: str,
        history: Optional[HistoryCount] = None,
    ) -> SettleOp:
        return cls(
            script=call.script,
            keys=call.keys,
            args=call.args,
            entry_id=entry_id,
            agent=agent,
            outcome=outcome,
            kind=kind,
            history=history,
        )
