--[[
  Put a task's next attempt into the delayed zset until it is due, then acknowledge the entry, in
  one step (the retry is written before the task is acknowledged, as in settle.lua). A task no
  longer pending is left alone. While it waits out its backoff the task is not in flight: its
  member remembers its run, so promote.lua counts it again.

  KEYS[1]  stream    the agent's task stream
  KEYS[2]  delayed   the agent's delayed zset
  KEYS[3]  stats     the agent's stats hash
  KEYS[4]  fair      the agent's fair zset (farm.fairness)
  KEYS[5]  runs      the agent's runs hash (farm.fairness)

  ARGV[1]  group     the consumer group
  ARGV[2]  entry_id  the task's entry in the stream
  ARGV[3]  due       when the retry is due (the zset score, Unix seconds)
  ARGV[4]  body      the task of the next attempt, encoded
  ARGV[5]  flight    the run whose in-flight count the entry holds ('': none)

  Returns 1 retried; 0 not pending; a failed ZADD is returned as its error, with nothing acknowledged.
]]
-- #include pending
-- #include flight
-- #include delayed

local stream, delayed, stats, fair, runs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, entry_id, due, body, flight = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if not pending_owner(stream, group, entry_id) then return 0 end
local ok = redis.pcall('ZADD', delayed, due, delayed_member(flight, body))
if type(ok) == 'table' and ok['err'] then return ok end
ack(stream, group, entry_id)
redis.call('HINCRBY', stats, 'retried', 1)
unflight(fair, runs, flight)
return 1
