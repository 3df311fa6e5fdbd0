"""Finding what the farm keeps: sampled rollouts and dead letters, by id, by filter, by group.

Two streams per agent hold what a person can look at later: the capped sample stream
({ns}:samples:{agent}: `sample_keep` rollouts of the groups `sample_every` chose, whole groups,
farm.streams.AgentStream.reply_op) and the dead-letter stream ({ns}:dead:{agent}). Everything here
reads them newest first, at most SCAN entries of each, CHUNK at a time, and says how many it read.
A search skips an entry whose raw body does not hold the id before decoding it (msgpack keeps a
string as its UTF-8 bytes: an id in the body is in its bytes). Cost: the streams' caps and SCAN,
never the number of tasks the farm has run. No web framework here, like farm.dashboard.data.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

import msgspec
import redis

from farm import schema, state
from farm.dashboard.data import rollout_summary
from farm.errors import ErrorKind, SchemaError
from farm.keys import Keys, text

SCAN = 2000  # entries of one stream one search, list or page reads at most (newest first)
CHUNK = 200  # entries per XREVRANGE
PER_PAGE, MAX_PER_PAGE = 50, 200
MAX_HITS = 500  # hits of one kind a search lists (it counts them all)
MAX_QUERY = 1000  # characters of a search
STATUSES = tuple(s.value for s in schema.Status)
KINDS = tuple(k.value for k in ErrorKind)


def iso(at: Any) -> str:
    try:
        return dt.datetime.fromtimestamp(float(at), dt.timezone.utc).isoformat(timespec="seconds")
    except (TypeError, ValueError, OverflowError, OSError):
        return ""


def entries(r: redis.Redis, key: str, limit: int = SCAN) -> Iterator[tuple[str, dict]]:
    """The stream's entries, newest first, at most `limit` of them, read CHUNK at a time."""
    end, seen = "+", 0
    while seen < limit:
        want = min(CHUNK, limit - seen)
        batch: Any = r.xrevrange(key, max=end, min="-", count=want)
        for entry_id, fields in batch:
            yield text(entry_id), fields
        seen += len(batch)
        if len(batch) < want:
            return
        end = "(" + text(batch[-1][0])


def _body(fields: dict) -> bytes:
    body = fields.get(b"d", b"")
    return body if isinstance(body, bytes) else b""


def _history(items: Iterable[schema.Attempt]) -> list[dict[str, Any]]:
    return [{**msgspec.to_builtins(a), "at_iso": iso(a.at)} for a in items]


def rollout_row(agent: str, entry_id: str, ro: schema.Rollout) -> dict[str, Any]:
    """One sampled rollout as the lists, the task page and the group view show it."""
    trace = ro.trace
    return {
        **rollout_summary(entry_id, ro),
        "agent": agent,
        "run_id": ro.run_id,
        "group_id": ro.group_id,
        "sample_index": ro.sample_index,
        "finished_iso": iso(ro.finished_at),
        "worker": ro.worker_id,
        "attempt": ro.attempt,
        "completion_tokens": sum(trace.mask()) if trace else ro.metrics.get("completion_tokens"),
        "history": _history(ro.history),
    }


def letter_row(agent: str, entry_id: str, fields: dict, max_entry_bytes: int, decode: bool = True) -> dict[str, Any]:
    """One dead letter: why it died (read as it is) and, decoded, which task it holds."""
    out: dict[str, Any] = {"agent": agent, "id": entry_id, "status": "dead"}
    for key in ("kind", "reason", "attempts", "worker", "at"):
        out[key] = text(fields.get(key.encode(), b""))
    out["at_iso"] = iso(out["at"])
    out.update(task_id="", run_id="", group_id="", sample_index=None, history=[])
    if decode:
        try:
            task = schema.decode_task({b"v": fields.get(b"v", b""), b"d": _body(fields)}, max_entry_bytes)
        except SchemaError as exc:
            out["task_error"] = str(exc)
        else:
            out.update(
                task_id=task.task_id,
                run_id=task.run_id,
                group_id=task.group_id,
                sample_index=task.sample_index,
                history=_history(task.history),
            )
    return out


def _sampled(r: redis.Redis, keys: Keys, agent: str, max_entry_bytes: int, needle: bytes = b"") -> Iterator[dict]:
    """The agent's sampled rollouts as rows, newest first (an unreadable one as {id, error}); with
    `needle`, one whose raw body does not hold it is not decoded and comes as {skipped}."""
    for entry_id, fields in entries(r, keys.samples(agent)):
        if needle and needle not in _body(fields):
            yield {"skipped": True}
            continue
        try:
            ro = schema.decode_rollout(fields, max_entry_bytes)
        except SchemaError as exc:
            yield {"agent": agent, "id": entry_id, "error": f"unreadable: {exc}"}
            continue
        yield rollout_row(agent, entry_id, ro)


def _dead(r: redis.Redis, keys: Keys, agent: str, max_entry_bytes: int, needle: bytes = b"") -> Iterator[dict]:
    for entry_id, fields in entries(r, keys.dead(agent)):
        if needle and needle not in _body(fields):
            yield {"skipped": True}
            continue
        yield letter_row(agent, entry_id, fields, max_entry_bytes)


@dataclass
class Scan:
    """What one search read: agents, sampled rollouts, dead letters, and dead letters left unread past SCAN."""

    agents: int = 0
    samples: int = 0
    dead: int = 0
    dead_unread: int = 0


def _search(
    r: redis.Redis, keys: Keys, q: str, wanted: Callable[[dict], bool], max_entry_bytes: int
) -> tuple[list[dict], list[dict], Scan]:
    """Every kept rollout and dead letter of every agent that `wanted` picks among those holding `q`."""
    needle = q.encode()
    rollouts: list[dict] = []
    letters: list[dict] = []
    scan = Scan()
    for agent in state.agents(r, keys):
        scan.agents += 1
        for row in _sampled(r, keys, agent, max_entry_bytes, needle):
            scan.samples += 1
            if "error" not in row and not row.get("skipped") and wanted(row):
                rollouts.append(row)
        read = 0
        for row in _dead(r, keys, agent, max_entry_bytes, needle):
            read += 1
            if not row.get("skipped") and wanted(row):
                letters.append(row)
        scan.dead += read
        scan.dead_unread += max(0, int(r.xlen(keys.dead(agent))) - read)
    return rollouts, letters, scan


def matched(row: dict, q: str) -> list[str]:
    """Which of the row's ids equal `q`: task, run, group."""
    return [name for name in ("task", "run", "group") if row.get(f"{name}_id") == q]


def find(r: redis.Redis, keys: Keys, q: str, *, max_entry_bytes: int) -> dict[str, Any]:
    """Rollouts and dead letters whose task id, run id or group id is `q` (exactly), at most MAX_HITS
    of each listed; the groups they belong to; how much was searched."""
    rollouts, letters, scan = _search(r, keys, q, lambda row: bool(matched(row, q)), max_entry_bytes)
    for row in rollouts + letters:
        row["matched"] = matched(row, q)
    groups: dict[str, int] = {}
    for row in rollouts + letters:
        if row["group_id"]:
            groups[row["group_id"]] = groups.get(row["group_id"], 0) + 1
    return {
        "q": q,
        "rollouts": rollouts[:MAX_HITS],
        "letters": letters[:MAX_HITS],
        "counts": {"rollouts": len(rollouts), "letters": len(letters)},
        "groups": sorted(groups.items()),
        "scan": scan,
    }


def task(r: redis.Redis, keys: Keys, task_id: str, *, max_entry_bytes: int) -> dict[str, Any]:
    """A task: its sampled rollout(s), its dead letter(s), and every attempt they record, oldest first
    (each failed attempt from the histories, then each rollout's own attempt as `final`)."""
    rollouts, letters, scan = _search(r, keys, task_id, lambda row: row["task_id"] == task_id, max_entry_bytes)
    seen: dict[tuple, dict] = {}
    for row in rollouts + letters:
        for a in row["history"]:
            seen.setdefault((a["attempt"], a["worker"], a["at"]), {**a, "final": False})
    attempts = sorted(seen.values(), key=lambda a: (a["at"], a["attempt"]))
    for row in sorted(rollouts, key=lambda x: x["finished_at"]):
        attempts.append(
            {
                "attempt": row["attempt"],
                "worker": row["worker"],
                "at": row["finished_at"],
                "at_iso": row["finished_iso"],
                "kind": row["failure_kind"] or row["status"],
                "error": row["failure"] or "",
                "final": True,
            }
        )
    first = (rollouts + letters)[0] if rollouts or letters else {}
    return {
        "task_id": task_id,
        "agent": first.get("agent", ""),
        "run_id": first.get("run_id", ""),
        "group_id": first.get("group_id", ""),
        "rollouts": rollouts,
        "letters": letters,
        "attempts": attempts,
        "scan": scan,
    }


def advantages(rows: list[dict]) -> dict[str, Any]:
    """GRPO's advantage of each row with a reward (ok or truncated): (reward - mean) / std over the
    group's rewarded rows, the population std as the farm's trainer computes it (numpy's default);
    reward - mean (every one 0) when std is 0. Rows without a reward get None."""
    rewards = [x["reward"] for x in rows if x["status"] in ("ok", "truncated") and x["reward"] is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    std = math.sqrt(sum((v - mean) ** 2 for v in rewards) / len(rewards)) if mean is not None else None
    for x in rows:
        rewarded = x["status"] in ("ok", "truncated") and x["reward"] is not None
        if not rewarded or mean is None or std is None:
            x["advantage"] = None
        else:
            x["advantage"] = (x["reward"] - mean) / std if std > 0 else x["reward"] - mean
    return {"n": len(rewards), "mean": mean, "std": std}


def group(r: redis.Redis, keys: Keys, group_id: str, *, max_entry_bytes: int) -> dict[str, Any]:
    """A group's kept rollouts side by side, by sample index, with GRPO's advantages; a member that
    ended as a dead letter (and has no kept rollout) shows as `dead`."""
    rollouts, letters, scan = _search(r, keys, group_id, lambda row: row["group_id"] == group_id, max_entry_bytes)
    have = {x["task_id"] for x in rollouts}
    rows = rollouts + [
        {**x, "reward": None, "completion_tokens": None, "attempt": x["attempts"]}
        for x in letters
        if x["task_id"] not in have
    ]
    rows.sort(key=lambda x: (x["sample_index"] if x["sample_index"] is not None else -1, x["id"]))
    stats = advantages(rows)
    return {"group_id": group_id, "rows": rows, "stats": stats, "scan": scan}


# -- the lists of one agent, with filters and pages ------------------------------------------


@dataclass(frozen=True)
class Filters:
    """What a list is narrowed to: status and reward apply to rollouts (a dead letter has neither);
    kind is a rollout's failure kind or a letter's; run is the task's run id."""

    status: str = ""
    kind: str = ""
    run: str = ""
    reward_min: Optional[float] = None
    reward_max: Optional[float] = None

    @classmethod
    def parse(
        cls, status: str = "", kind: str = "", run: str = "", reward_min: str = "", reward_max: str = ""
    ) -> Filters:
        """From query values (empty: not filtered); a ValueError names the bad one."""
        if status and status not in STATUSES:
            raise ValueError(f"status {status[:64]!r} is none of {', '.join(STATUSES)}")
        if kind and kind not in KINDS:
            raise ValueError(f"failure kind {kind[:64]!r} is none of {', '.join(KINDS)}")
        return cls(status, kind, run.strip(), _number("reward_min", reward_min), _number("reward_max", reward_max))

    def active(self) -> bool:
        return any((self.status, self.kind, self.run, self.reward_min is not None, self.reward_max is not None))

    def query(self) -> dict[str, str]:
        """The filters as query values, for the links to other pages."""
        pairs = {"status": self.status, "kind": self.kind, "run": self.run}
        pairs.update(
            {
                k: f"{v:g}"
                for k, v in (("reward_min", self.reward_min), ("reward_max", self.reward_max))
                if v is not None
            }
        )
        return {k: v for k, v in pairs.items() if v}

    def take(self, row: dict) -> bool:
        if "error" in row:
            return not self.active()
        failed_kind = row.get("failure_kind") if row["status"] != "dead" else row.get("kind")
        if (self.status and row["status"] != self.status) or (self.kind and failed_kind != self.kind):
            return False
        if self.run and row["run_id"] != self.run:
            return False
        reward = row.get("reward")
        if self.reward_min is not None and (reward is None or reward < self.reward_min):
            return False
        return not (self.reward_max is not None and (reward is None or reward > self.reward_max))


def _number(name: str, value: str) -> Optional[float]:
    if not value.strip():
        return None
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{name} {value[:64]!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, not {value[:64]!r}")
    return number


def pages(page: int, per_page: int) -> tuple[int, int]:
    """`?page=` from 1, `?per_page=` within 1..MAX_PER_PAGE."""
    return max(1, page), max(1, min(per_page, MAX_PER_PAGE))


def _paged(rows: Iterable[dict], take: Callable[[dict], bool], page: int, per_page: int) -> dict[str, Any]:
    start = (page - 1) * per_page
    items: list[dict] = []
    matching = read = 0
    for row in rows:
        read += 1
        if take(row):
            if start <= matching < start + per_page:
                items.append(row)
            matching += 1
    last = max(1, math.ceil(matching / per_page))
    return {"items": items, "matching": matching, "read": read, "page": page, "per_page": per_page, "pages": last}


def rollout_list(
    r: redis.Redis, keys: Keys, agent: str, filters: Filters, page: int, per_page: int, *, max_entry_bytes: int
) -> dict[str, Any]:
    """One page of the agent's sampled rollouts that pass `filters`, newest first, and how many match."""
    found = _paged(_sampled(r, keys, agent, max_entry_bytes), filters.take, page, per_page)
    return {**found, "kept": int(r.xlen(keys.samples(agent)))}


def dead_list(
    r: redis.Redis, keys: Keys, agent: str, filters: Filters, page: int, per_page: int, *, max_entry_bytes: int
) -> dict[str, Any]:
    """One page of the agent's dead letters that pass `filters` (kind, run; a letter has no status or
    reward), newest first. Unfiltered, it reads only up to the page; the kind is read from the letter
    as it is, and a task is decoded only for the page's letters or, with a run, a letter holding it."""
    key = keys.dead(agent)
    total = int(r.xlen(key))
    needle = filters.run.encode()

    def rows(limit: int) -> Iterator[dict]:
        for entry_id, fields in entries(r, key, limit):
            if filters.kind and text(fields.get(b"kind", b"")) != filters.kind:
                yield {}
            elif needle and needle not in _body(fields):
                yield {}
            elif needle:  # decoded, to compare the run
                yield letter_row(agent, entry_id, fields, max_entry_bytes)
            else:  # decoded only if it is on the page
                yield {"entry_id": entry_id, "fields": fields}

    def take(row: dict) -> bool:
        return bool(row) and ("fields" in row or row["run_id"] == filters.run)

    if filters.kind or needle:
        found = _paged(rows(SCAN), take, page, per_page)
    else:  # every letter matches: read no further than the page
        found = _paged(rows(min(SCAN, page * per_page)), take, page, per_page)
        found["matching"] = min(total, SCAN)
        found["pages"] = max(1, math.ceil(found["matching"] / per_page))
    items = found["items"]
    found["items"] = [
        letter_row(agent, x["entry_id"], x["fields"], max_entry_bytes) if "fields" in x else x for x in items
    ]
    return {**found, "total": total}
