--[[
  Add a batch of settled rollouts to a minute's history bucket (farm.history), note there the
  tasks not yet settled (the task stream's length plus the agent's backlog), and keep the bucket
  for `ttl` seconds. A bucket key of another type is left alone.

  KEYS[1]    bucket   the minute's history hash
  KEYS[2]    stream   the agent's task stream
  KEYS[3]    backlog  the agent's backlog list

  ARGV[1]    ttl      seconds to keep the bucket
  ARGV[2..]  counts   (field, increment) pairs: an increment written without a '.' is an integer
                      (HINCRBY), one with a '.' a float (HINCRBYFLOAT)

  Returns 1; 0 when the bucket key holds another type.
]]
-- #include checks

local bucket, stream, backlog = KEYS[1], KEYS[2], KEYS[3]
local ttl = tonumber(ARGV[1])
local counts = 2 -- where ARGV's tail starts

if holds_other(bucket, 'hash') then return 0 end
for i = counts, #ARGV, 2 do
  if string.find(ARGV[i + 1], '.', 1, true) then
    redis.call('HINCRBYFLOAT', bucket, ARGV[i], ARGV[i + 1])
  else
    redis.call('HINCRBY', bucket, ARGV[i], ARGV[i + 1])
  end
end
redis.call('HSET', bucket, 'depth', redis.call('XLEN', stream) + redis.call('LLEN', backlog))
redis.call('EXPIRE', bucket, ttl)
return 1
