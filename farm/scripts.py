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

# Shared by the scripts that take a task out of its run's in-flight count (farm.fairness): the
# runs hash's `flight:RUN`, which FEED reads to choose the next run. A run with nothing queued
# (not in the fair zset) and nothing in flight is forgotten. O(1): a settle does no more.
FAIR_FUNCTIONS = """
local function unflight(fair, runs, run)
  if run == '' then return end
  if redis.call('HINCRBY', runs, 'flight:' .. run, -1) <= 0 then
    redis.call('HDEL', runs, 'flight:' .. run)
    if not redis.call('ZSCORE', fair, run) then redis.call('HDEL', runs, 'share:' .. run, 'cap:' .. run) end
  end
end
"""

# Settle one task: write what it produced, then acknowledge it, in one script, so a task is
# never acknowledged unless its rollout (or dead letter) was written.
# KEYS: tasks stream, stats hash, open-tasks zset, open-runs hash (farm.cancel), the agent's fair
# zset and runs hash (farm.fairness), then one stream per appended entry.
# ARGV: group, entry id, stats field, result-stream prefix, index in KEYS of the reply stream
# (0: none), task id and run id ('': unknown; the task is no longer open once settled), the run
# whose in-flight count the entry holds (its `r` field, set by FEED; '': none), then for each
# appended stream: n, maxlen (0: uncapped), the stats field that counts trimmed entries ('': not
# counted), field1, value1, ... (n pairs).
# Returns 1 settled; 0 already settled (not pending: a replay, or another worker's reclaim);
# -1 the reply stream is outside the namespace's result streams; -2 an appended key holds a
# value that is not a stream. On -1/-2 nothing is written or acknowledged.
SETTLE = (
    FAIR_FUNCTIONS
    + """
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then return 0 end
local reply = tonumber(ARGV[5])
if reply > 0 then
  local key, prefix = KEYS[reply], ARGV[4]
  if #key <= #prefix or string.sub(key, 1, #prefix) ~= prefix then return -1 end
end
for k = 7, #KEYS do
  local t = redis.call('TYPE', KEYS[k])['ok']
  if t ~= 'none' and t ~= 'stream' then return -2 end
end
local a = 9
for k = 7, #KEYS do
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
unflight(KEYS[5], KEYS[6], ARGV[8])
return 1
"""
)

# Add a batch of settled rollouts to a minute's history bucket (farm.history), note there the
# tasks not yet settled (the task stream's length plus the agent's backlog list), and keep the
# bucket for ARGV[1] seconds. KEYS: bucket hash, tasks stream, backlog list. ARGV: TTL seconds,
# then (field, increment) pairs: an increment written without a '.' is an integer (HINCRBY),
# one with a '.' a float (HINCRBYFLOAT). A bucket key of another type is left alone (0).
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
redis.call('HSET', KEYS[1], 'depth', redis.call('XLEN', KEYS[2]) + redis.call('LLEN', KEYS[3]))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
"""

# KEYS: tasks stream, delayed zset, stats hash, fair zset, runs hash. ARGV: group, entry id, due
# time, task body, the run whose in-flight count the entry holds ('': none). The retry is written
# before the task is acknowledged, as in SETTLE. A retry waiting out its backoff is not in flight:
# its member in the delayed set is `r:RUN\nBODY`, so PROMOTE counts it again for its run.
RETRY = (
    FAIR_FUNCTIONS
    + """
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then return 0 end
local member = ARGV[4]
if ARGV[5] ~= '' then member = 'r:' .. ARGV[5] .. '\\n' .. ARGV[4] end
local ok = redis.pcall('ZADD', KEYS[2], ARGV[3], member)
if type(ok) == 'table' and ok['err'] then return ok end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('HINCRBY', KEYS[3], 'retried', 1)
unflight(KEYS[4], KEYS[5], ARGV[5])
return 1
"""
)

# KEYS: delayed zset, tasks stream, fair zset, runs hash. ARGV: now, limit, schema version.
# A member `r:RUN\nBODY` (RETRY) goes back with its run and counts in flight again.
PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local nl = string.find(member, '\\n', 1, true)
  if string.sub(member, 1, 2) == 'r:' and nl then
    local run = string.sub(member, 3, nl - 1)
    redis.call('XADD', KEYS[2], '*', 'v', ARGV[3], 'd', string.sub(member, nl + 1), 'r', run)
    redis.call('HINCRBY', KEYS[4], 'flight:' .. run, 1)
  else
    redis.call('XADD', KEYS[2], '*', 'v', ARGV[3], 'd', member)
  end
  redis.call('ZREM', KEYS[1], member)
end
return #due
"""

# Queue a chunk of one run's tasks for an agent (farm.fairness). KEYS: fair zset, runs hash, the
# run's queue, the agent's backlog list. ARGV: run, share, cap (0: none), then the tasks, each
# `VERSION|BODY`. Returns how many were queued.
ENQUEUE = """
local run, n = ARGV[1], #ARGV - 3
for i = 4, #ARGV, 1000 do redis.call('RPUSH', KEYS[3], unpack(ARGV, i, math.min(i + 999, #ARGV))) end
local ones = {}
for i = 1, math.min(n, 1000) do ones[i] = '1' end
for i = 1, n, 1000 do redis.call('RPUSH', KEYS[4], unpack(ones, 1, math.min(1000, n - i + 1))) end
redis.call('HSET', KEYS[2], 'share:' .. run, ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('HSET', KEYS[2], 'cap:' .. run, ARGV[3])
else redis.call('HDEL', KEYS[2], 'cap:' .. run) end
redis.call('ZADD', KEYS[1], 0, run)
return n
"""

# Move queued tasks into the agent's stream until it holds n tasks no worker has read (its length
# less the group's pending entries). The next task comes from the run with the lowest
# (in flight + 1) / share among the runs in the fair zset (those with tasks queued) that are
# under their cap, so an agent's slots are shared in proportion to shares (D'Hondt's rule). A
# run takes tasks while its score stays at or below the next run's, so one run alone moves in
# one LPOP; the runs' state is read once per call, so a settle never has to rescore. Each entry
# carries its run (`r`), whose in-flight count grows by what moved. KEYS: fair zset, runs hash,
# tasks stream, backlog list. ARGV: group, n, the agent's queue-key prefix. Returns how many moved.
FEED = """
local fair, runs, stream = KEYS[1], KEYS[2], KEYS[3]
local want = tonumber(ARGV[2])
local len = redis.call('XLEN', stream)
if len > 0 then
  local p = redis.pcall('XPENDING', stream, ARGV[1])
  if type(p) == 'table' and p['err'] == nil then len = len - tonumber(p[1]) end
end
want = want - len
if want <= 0 then return 0 end
local names = redis.call('ZRANGE', fair, 0, -1)
local flight, share, cap = {}, {}, {}
for i, run in ipairs(names) do
  local h = redis.call('HMGET', runs, 'flight:' .. run, 'share:' .. run, 'cap:' .. run)
  flight[i], share[i], cap[i] = tonumber(h[1]) or 0, tonumber(h[2]) or 1, tonumber(h[3]) or 0
end
local moved = 0
while moved < want do
  local best, s1, s2 = nil, math.huge, math.huge
  for i = 1, #names do
    if names[i] and (cap[i] == 0 or flight[i] < cap[i]) then
      local s = (flight[i] + 1) / share[i]
      if s < s1 then best, s1, s2 = i, s, s1 elseif s < s2 then s2 = s end
    end
  end
  if not best then break end
  local run = names[best]
  local k = want - moved
  if s2 < math.huge then k = math.min(k, math.max(1, math.floor(s2 * share[best] + 1e-9) - flight[best])) end
  if cap[best] > 0 then k = math.min(k, cap[best] - flight[best]) end
  local q = ARGV[3] .. run
  local items = redis.call('LPOP', q, k)
  if items then
    for _, item in ipairs(items) do
      local sep = string.find(item, '|', 1, true)
      if sep then
        redis.call('XADD', stream, '*', 'v', string.sub(item, 1, sep - 1), 'd', string.sub(item, sep + 1), 'r', run)
      else
        redis.call('XADD', stream, '*', 'v', '', 'd', item, 'r', run)
      end
    end
    moved = moved + #items
    flight[best] = flight[best] + #items
    redis.call('HINCRBY', runs, 'flight:' .. run, #items)
    redis.call('LTRIM', KEYS[4], #items, -1)
  end
  if not items or redis.call('LLEN', q) == 0 then
    redis.call('ZREM', fair, run)
    names[best] = false
  end
end
return moved
"""

# Cancel a run's queued tasks at once (farm.fairness.drain): each task still at the head of the
# run's queue is taken out and answered with the `cancelled` rollout the client built for it; one
# already moved to the stream is left to the worker that reads it (it settles as cancelled there).
# KEYS: fair zset, runs hash, the run's queue, backlog list, open-tasks zset, open-runs hash,
# stats hash, then the reply streams. ARGV: run, result-stream prefix, then per task: the queued
# item, the index in KEYS of its reply stream, task id, the rollout's version and body.
# Returns how many were cancelled; -1/-2 as SETTLE (a bad reply stream: nothing done).
DRAIN = """
local run, prefix = ARGV[1], ARGV[2]
for k = 8, #KEYS do
  local key = KEYS[k]
  if #key <= #prefix or string.sub(key, 1, #prefix) ~= prefix then return -1 end
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= 'stream' then return -2 end
end
local n = 0
for a = 3, #ARGV, 5 do
  if redis.call('LINDEX', KEYS[3], 0) == ARGV[a] then
    redis.call('LPOP', KEYS[3])
    redis.call('XADD', KEYS[tonumber(ARGV[a + 1])], '*', 'v', ARGV[a + 3], 'd', ARGV[a + 4])
    redis.call('ZREM', KEYS[5], ARGV[a + 2])
    n = n + 1
  end
end
if n > 0 then
  redis.call('LTRIM', KEYS[4], n, -1)
  if redis.call('HINCRBY', KEYS[6], run, -n) <= 0 then redis.call('HDEL', KEYS[6], run) end
  redis.call('HINCRBY', KEYS[7], 'cancelled', n)
end
if redis.call('LLEN', KEYS[3]) == 0 then
  redis.call('ZREM', KEYS[1], run)
  if not redis.call('HGET', KEYS[2], 'flight:' .. run) then
    redis.call('HDEL', KEYS[2], 'share:' .. run, 'cap:' .. run)
  end
end
return n
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
    "enqueue": ENQUEUE,
    "feed": FEED,
    "drain": DRAIN,
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
    stream: str  # the task stream and the agent's backlog list (farm.fairness): their lengths
    backlog: str  # added are the bucket's depth, every task not yet settled
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
