--[[
  Cancel a run's queued tasks at once (farm.fairness.drain): each task still at the head of the
  run's queue is taken out and answered with the `cancelled` rollout the client built for it; one
  already moved to the stream is left to the worker that reads it (it settles as cancelled there).

  KEYS[1]    fair        the agent's fair zset
  KEYS[2]    runs        the agent's runs hash
  KEYS[3]    queue       the run's queue for the agent
  KEYS[4]    backlog     the agent's backlog list
  KEYS[5]    open_tasks  the open-tasks zset (farm.cancel)
  KEYS[6]    open_runs   the open-runs hash (farm.cancel)
  KEYS[7]    stats       the agent's stats hash
  KEYS[8..]  replies     the reply streams of the tasks, each once

  ARGV[1]    run         the run id
  ARGV[2]    prefix      the namespace's result-stream prefix
  ARGV[3..]  tasks       per task: the queued item, the position in KEYS of its reply stream, its
                         task id, the rollout's schema version and body

  Returns how many were cancelled; -1 a reply stream is not one of the namespace's result streams,
  -2 one holds a value that is not a stream (nothing done, as in settle.lua).
]]
-- #include checks
-- #include flight
-- #include backlog
-- #include open

local fair, runs, queue, backlog = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local open_tasks, open_runs, stats = KEYS[5], KEYS[6], KEYS[7]
local run, prefix = ARGV[1], ARGV[2]
local replies, tasks = 8, 3 -- where KEYS' and ARGV's tails start

for k = replies, #KEYS do
  if outside_results(KEYS[k], prefix) then return -1 end
  if holds_other(KEYS[k], 'stream') then return -2 end
end
local n = 0
for a = tasks, #ARGV, 5 do
  local item, reply, task_id, version, body = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  if redis.call('LINDEX', queue, 0) == item then
    redis.call('LPOP', queue)
    redis.call('XADD', KEYS[reply], '*', 'v', version, 'd', body)
    redis.call('ZREM', open_tasks, task_id)
    n = n + 1
  end
end
if n > 0 then
  backlog_take(backlog, n)
  open_runs_less(open_runs, run, n)
  redis.call('HINCRBY', stats, 'cancelled', n)
end
if redis.call('LLEN', queue) == 0 then
  redis.call('ZREM', fair, run)
  forget_idle_run(fair, runs, run)
end
return n
