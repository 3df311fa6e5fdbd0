--[[
  The consumer group's pending entries: who holds an entry, and letting it go.

  A settle (settle.lua, retry.lua) acts only on an entry still pending, so running it twice (a
  retried call, or another worker that reclaimed and settled the task) never settles it twice.
]]

-- The consumer that holds `id` in `group`, or false when the entry is not pending.
local function pending_owner(stream, group, id)
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  if #p == 1 then return p[1][2] end
  return false
end

-- Acknowledge the entry and delete it from the stream: the task is done with.
local function ack(stream, group, id)
  redis.call('XACK', stream, group, id)
  redis.call('XDEL', stream, id)
end
