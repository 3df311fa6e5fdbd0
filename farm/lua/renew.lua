--[[
  Reset the idle time of the entries this consumer still holds, so a worker with long rollouts is
  not robbed by XAUTOCLAIM; entries no longer pending were settled in the meantime and are skipped.

  KEYS[1]    stream    the agent's task stream

  ARGV[1]    group     the consumer group
  ARGV[2]    consumer  this worker's consumer
  ARGV[3..]  ids       the entries to renew

  Returns the ids another consumer took over.
]]
-- #include pending

local stream = KEYS[1]
local group, consumer = ARGV[1], ARGV[2]
local ids = 3 -- where ARGV's tail starts

local lost = {}
for i = ids, #ARGV do
  local owner = pending_owner(stream, group, ARGV[i])
  if owner then
    if owner == consumer then
      redis.call('XCLAIM', stream, group, consumer, 0, ARGV[i], 'JUSTID')
    else
      lost[#lost + 1] = ARGV[i]
    end
  end
end
return lost
