--[[
  Settle one task: write what it produced (its rollout, a sampled copy, a dead letter), then
  acknowledge it, in one step, so a task is never acknowledged unless what it produced was
  written. A write that fails (out of memory) leaves the task pending, to be delivered again.
  A task no longer pending (a replay, or another worker reclaimed and settled it) is left alone.

  KEYS[1]    stream      the agent's task stream
  KEYS[2]    stats       the agent's stats hash
  KEYS[3]    open_tasks  the open-tasks zset (farm.cancel)
  KEYS[4]    open_runs   the open-runs hash (farm.cancel)
  KEYS[5]    fair        the agent's fair zset (farm.fairness)
  KEYS[6]    runs        the agent's runs hash (farm.fairness)
  KEYS[7..]  appended    one stream per appended entry

  ARGV[1]    group       the consumer group
  ARGV[2]    entry_id    the task's entry in the stream
  ARGV[3]    stat        the stats field that counts the outcome
  ARGV[4]    prefix      the namespace's result-stream prefix
  ARGV[5]    reply       the position in KEYS of the reply stream, checked against prefix (0: none)
  ARGV[6]    task_id     the task, no longer open once settled ('': unknown)
  ARGV[7]    run_id      its run, one open task fewer ('': unknown)
  ARGV[8]    flight      the run whose in-flight count the entry holds (its `r`; '': none)
  ARGV[9..]  appends     per appended stream: n, maxlen (0: uncapped), the stats field that counts
                         trimmed entries ('': not counted), then n (field, value) pairs

  Returns 1 settled; 0 not pending; -1 the reply stream is not one of the namespace's result
  streams; -2 an appended key holds a value that is not a stream. On -1 and -2 nothing is written
  or acknowledged; a failed XADD is returned as its error, with nothing acknowledged.
]]
-- #include pending
-- #include checks
-- #include flight
-- #include open

local stream, stats, open_tasks, open_runs, fair, runs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local group, entry_id, stat, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local reply, task_id, run_id, flight = tonumber(ARGV[5]), ARGV[6], ARGV[7], ARGV[8]
local appended, appends = 7, 9 -- where KEYS' and ARGV's tails start

if not pending_owner(stream, group, entry_id) then return 0 end
if reply > 0 and outside_results(KEYS[reply], prefix) then return -1 end
for k = appended, #KEYS do
  if holds_other(KEYS[k], 'stream') then return -2 end
end
local a = appends
for k = appended, #KEYS do
  local n, maxlen, dropstat = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), ARGV[a + 2]
  a = a + 3
  local fields = {}
  for j = 1, 2 * n do fields[j] = ARGV[a]; a = a + 1 end
  local ok = redis.pcall('XADD', KEYS[k], '*', unpack(fields))
  if type(ok) == 'table' and ok['err'] then return ok end
  if maxlen > 0 then
    local dropped = redis.call('XTRIM', KEYS[k], 'MAXLEN', maxlen)
    if dropped > 0 and dropstat ~= '' then redis.call('HINCRBY', stats, dropstat, dropped) end
  end
end
ack(stream, group, entry_id)
redis.call('HINCRBY', stats, stat, 1)
if task_id ~= '' and redis.call('TYPE', open_tasks)['ok'] == 'zset' then redis.call('ZREM', open_tasks, task_id) end
if run_id ~= '' and redis.call('TYPE', open_runs)['ok'] == 'hash' then open_runs_less(open_runs, run_id, 1) end
unflight(fair, runs, flight)
return 1
