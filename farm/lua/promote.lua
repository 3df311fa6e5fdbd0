--[[
  Move the retries that are due from the delayed zset back into the task stream; one that holds
  its run (retry.lua) goes back with it and counts in flight again.

  KEYS[1]  delayed  the agent's delayed zset
  KEYS[2]  stream   the agent's task stream
  KEYS[3]  fair     the agent's fair zset (declared with the runs hash; not touched here)
  KEYS[4]  runs     the agent's runs hash (farm.fairness)

  ARGV[1]  now      the current time (Unix seconds): members scored at or below it are due
  ARGV[2]  limit    the most to move in one call
  ARGV[3]  version  the schema version the entries are written with

  Returns how many were moved.
]]
-- #include flight
-- #include delayed
-- #include queues

local delayed, stream, fair, runs = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, limit, version = ARGV[1], tonumber(ARGV[2]), ARGV[3]

local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, limit)
for _, member in ipairs(due) do
  local run, body = from_delayed(member)
  add_task(stream, version, body, run)
  if run then enflight(runs, run, 1) end
  redis.call('ZREM', delayed, member)
end
return #due
