--[[
  Hand back entries this consumer holds by making them look idle for `idle` ms, so live workers
  reclaim them at once instead of after a full visibility timeout.

  KEYS[1]    stream    the agent's task stream

  ARGV[1]    group     the consumer group
  ARGV[2]    consumer  this worker's consumer
  ARGV[3]    idle      the idle time to give them, ms
  ARGV[4..]  ids       the entries to hand back

  Returns how many were handed back.
]]
-- #include pending

local stream = KEYS[1]
local group, consumer, idle = ARGV[1], ARGV[2], ARGV[3]
local ids = 4 -- where ARGV's tail starts

local n = 0
for i = ids, #ARGV do
  if pending_owner(stream, group, ARGV[i]) == consumer then
    redis.call('XCLAIM', stream, group, consumer, 0, ARGV[i], 'IDLE', idle, 'JUSTID')
    n = n + 1
  end
end
return n
