--[[
  Move dead letters back to the agent's task stream (farm.deadletters), each only if it is still a
  dead letter, so a letter requeued twice at once goes back once.

  KEYS[1]    dead     the agent's dead-letter stream
  KEYS[2]    stream   the agent's task stream

  ARGV[1..]  letters  per letter: its id, the schema version and the task body to run (its
                      attempts started over)

  Returns how many were requeued.
]]
-- #include queues

local dead, stream = KEYS[1], KEYS[2]
local letters = 1 -- where ARGV's tail starts

local n = 0
for i = letters, #ARGV, 3 do
  local id, version, body = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if #redis.call('XRANGE', dead, id, id) == 1 then
    add_task(stream, version, body, nil)
    redis.call('XDEL', dead, id)
    n = n + 1
  end
end
return n
