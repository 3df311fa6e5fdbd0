--[[
  A run's tasks in flight on one agent (farm.fairness): `flight:RUN` in the agent's runs hash,
  which feed.lua reads to choose the next run. It counts up when an entry carrying its run enters
  the task stream (feed.lua, promote.lua) and down when the entry leaves it (settle.lua,
  retry.lua). A run with nothing queued (no member of the fair zset) and nothing in flight is
  forgotten, its share and cap with it. Each call is O(1): a settle does no more.
]]

local function enflight(runs, run, n)
  redis.call('HINCRBY', runs, 'flight:' .. run, n)
end

local function forget_idle_run(fair, runs, run)
  if not redis.call('ZSCORE', fair, run) and redis.call('HEXISTS', runs, 'flight:' .. run) == 0 then
    redis.call('HDEL', runs, 'share:' .. run, 'cap:' .. run)
  end
end

-- One task of `run` left the stream ('': it counted for no run).
local function unflight(fair, runs, run)
  if run == '' then return end
  if redis.call('HINCRBY', runs, 'flight:' .. run, -1) <= 0 then
    redis.call('HDEL', runs, 'flight:' .. run)
    forget_idle_run(fair, runs, run)
  end
end
