--[[
  Queue a chunk of one run's tasks for an agent (farm.fairness): the tasks go to the run's queue
  and the backlog grows by as many; the run's share and cap are set (the last submit's hold) and
  the run joins the fair zset, so the next fetch serves it.

  KEYS[1]    fair     the agent's fair zset
  KEYS[2]    runs     the agent's runs hash
  KEYS[3]    queue    the run's queue for the agent
  KEYS[4]    backlog  the agent's backlog list

  ARGV[1]    run      the run id
  ARGV[2]    share    the run's share (a number above 0)
  ARGV[3]    cap      the run's cap on tasks in flight (0: none)
  ARGV[4..]  items    the tasks, each `VERSION|BODY`

  Returns how many were queued.
]]
-- #include backlog

local fair, runs, queue, backlog = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local run, share, cap = ARGV[1], ARGV[2], ARGV[3]
local items = 4 -- where ARGV's tail starts
local n = #ARGV - items + 1

for i = items, #ARGV, 1000 do redis.call('RPUSH', queue, unpack(ARGV, i, math.min(i + 999, #ARGV))) end
backlog_add(backlog, n)
redis.call('HSET', runs, 'share:' .. run, share)
if tonumber(cap) > 0 then redis.call('HSET', runs, 'cap:' .. run, cap)
else redis.call('HDEL', runs, 'cap:' .. run) end
redis.call('ZADD', fair, 0, run)
return n
