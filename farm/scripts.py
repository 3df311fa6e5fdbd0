"""The Lua scripts that make each delivery step atomic.

Every script that settles a task first checks that the entry is still pending and does nothing
when it is not: the task was already settled (by this worker before a retried call, or by
another worker that reclaimed it), so running a script twice never duplicates a rollout. It
then writes the rollout (or retry, or dead letter) and acknowledges the task only once that
write succeeded: a write that fails (out of memory, a key of the wrong type) leaves the task
pending, to be delivered again, never lost. Keys touched are all passed in KEYS, as Redis requires.

A settle travels as a SettleOp: the script's keys and args in the layout documented beside it,
built in one place (farm.streams.AgentStream), together with the outcome they stand for, which
the Settler counts only once the script has answered that it settled the task.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal, Optional

import msgspec

# Settle one task: write what it produced, then acknowledge it, in one script, so a task is
# never acknowledged unless its rollout (or dead letter) was written.
# KEYS: tasks stream, stats hash, open-tasks zset, open-runs hash (farm.cancel), then one stream
# per appended entry.
# ARGV: group, entry id, stats field, result-stream prefix, index in KEYS of the reply stream
# (0: none), task id and run id ('': unknown; the task is no longer open once settled), then
# for each appended stream: n, maxlen (0: uncapped), the stats field that counts trimmed entries
# ('': not counted), field1, value1, ... (n pairs).
# Returns 1 settled; 0 already settled (not pending: a replay, or another worker's reclaim);
# -1 the reply stream is outside the namespace's result streams; -2 an appended key holds a
# value that is not a stream. On -1/-2 nothing is written or acknowledged.
SETTLE = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then return 0 end
local reply = tonumber(ARGV[5])
if reply > 0 then
  local key, prefix = KEYS[reply], ARGV[4]
  if #key <= #prefix or string.sub(key, 1, #prefix) ~= prefix then return -1 end
end
for k = 5, #KEYS do
  local t = redis.call('TYPE', KEYS[k])['ok']
  if t ~= 'none' and t ~= 'stream' then return -2 end
end
local a = 8
for k = 5, #KEYS do
  local n, maxlen, dropstat = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), ARGV[a + 2]
  a = a + 3
  local fields = {}
  for j = 1, 2 * n do fields[j] = ARGV[a]; a = a + 1 end
  local ok = redis.pcall('XADD', KEYS[k], '*', unpack(fields))
  if type(ok) == 'table' and ok['err'] then return ok end
  if maxlen > 0 then
    local dropped = redis.call('XTRIM', KEYS[k], 'MAXLEN', maxlen)
    if dropped > 0 and dropstat ~= '' then redis.call('HINCRBY', KEYS[2], dropstat, dropped) end
  end
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
if ARGV[6] ~= '' and redis.call('TYPE', KEYS[3])['ok'] == 'zset' then redis.call('ZREM', KEYS[3], ARGV[6]) end
if ARGV[7] ~= '' and redis.call('TYPE', KEYS[4])['ok'] == 'hash' then
  if redis.call('HINCRBY', KEYS[4], ARGV[7], -1) <= 0 then redis.call('HDEL', KEYS[4], ARGV[7]) end
end
return 1
"""

# Add a batch of settled rollouts to a minute's history bucket (farm.history), note the task
# stream's length there, and keep the bucket for ARGV[1] seconds. KEYS: bucket hash, tasks
# stream. ARGV: TTL seconds, then (field, increment) pairs: an increment written without a '.'
# is an integer (HINCRBY), one with a '.' a float (HINCRBYFLOAT). A bucket key of another type
# is left alone (0).
BUCKET = """
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'hash' then return 0 end
for i = 2, #ARGV, 2 do
  if string.find(ARGV[i + 1], '.', 1, true) then
    redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
  else
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('HSET', KEYS[1], 'depth', redis.call('XLEN', KEYS[2]))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
"""

# KEYS: tasks stream, delayed zset, stats hash. ARGV: group, entry id, due time, task body.
# The retry is written before the task is acknowledged, as in SETTLE.
RETRY = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then return 0 end
local ok = redis.pcall('ZADD', KEYS[2], ARGV[3], ARGV[4])
if type(ok) == 'table' and ok['err'] then return ok end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('HINCRBY', KEYS[3], 'retried', 1)
return 1
"""

# KEYS: delayed zset, tasks stream. ARGV: now, limit, schema version.
PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, body in ipairs(due) do
  redis.call('XADD', KEYS[2], '*', 'v', ARGV[3], 'd', body)
  redis.call('ZREM', KEYS[1], body)
end
return #due
"""

# Reset the idle time of entries this consumer still owns; return the ids another consumer
# took over (entries no longer pending were settled in the meantime and are skipped).
# KEYS: tasks stream. ARGV: group, consumer, ids...
RENEW = """
local lost = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p == 1 then
    if p[1][2] == ARGV[2] then
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    else
      lost[#lost + 1] = ARGV[i]
    end
  end
end
return lost
"""

# Hand back entries this consumer owns by making them look idle for `idle` ms, so live
# workers reclaim them at once instead of after a full visibility timeout.
# KEYS: tasks stream. ARGV: group, consumer, idle ms, ids...
RELEASE = """
local n = 0
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'JUSTID')
    n = n + 1
  end
end
return n
"""

# Remove the consumers of workers that are gone: no pending entries and idle past ARGV[2] ms
# (a live worker touches the group every block_ms). Atomic, so an entry delivered to a consumer
# between the check and the delete cannot be lost with it. KEYS: tasks stream. ARGV: group,
# idle ms, the caller's own consumer (never removed). Returns how many were removed.
PRUNE = """
local n = 0
local idle = tonumber(ARGV[2])
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for j = 1, #c, 2 do info[c[j]] = c[j + 1] end
  if info['pending'] == 0 and info['idle'] > idle and info['name'] ~= ARGV[3] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    n = n + 1
  end
end
return n
"""

SOURCES = {
    "bucket": BUCKET,
    "prune": PRUNE,
    "settle": SETTLE,
    "retry": RETRY,
    "promote": PROMOTE,
    "renew": RENEW,
    "release": RELEASE,
}
SHAS = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in SOURCES.items()}

# SETTLE's and RETRY's answers besides SETTLE's refused reply streams (-1, -2).
SETTLED, NOT_PENDING = 1, 0


# What a settle makes of its task once the script settled it: the stats field the script
# increments, and the worker counter of the same name the Settler moves.
Outcome = Literal["done", "failed", "dead", "retried", "cancelled"]


class HistoryCount(msgspec.Struct, frozen=True, kw_only=True):
    """A settle's increments to its minute's history bucket (farm.history), added once it acknowledged."""

    bucket: str  # the bucket's key
    stream: str  # the task stream, whose length the bucket notes
    ttl_s: int
    increments: dict[str, float]


class SettleOp(msgspec.Struct, frozen=True, kw_only=True):
    """One task's settle step: the script to run with its keys and args (laid out as its comment
    above says), and what it stands for, read by name by the Settler once Redis has answered. A
    Struct, not a dataclass: one is built per task, and a frozen Struct costs a tenth as much."""

    script: Literal["settle", "retry"]
    keys: tuple[str, ...]
    args: tuple[Any, ...]
    entry_id: str
    agent: str
    outcome: Outcome
    kind: str  # why the task failed (the ErrorKind of a failed rollout, retry or dead letter); '' when it did not
    history: Optional[HistoryCount] = None
