--[[
  Remove the consumers of workers that are gone: no pending entries and idle past `idle` ms (a live
  worker touches the group every block_ms). Atomic, so an entry delivered to a consumer between
  the check and the delete cannot be lost with it.

  KEYS[1]  stream  the agent's task stream

  ARGV[1]  group   the consumer group
  ARGV[2]  idle    how long a consumer must have been idle, ms
  ARGV[3]  keep    the caller's own consumer, never removed

  Returns how many were removed.
]]

local stream = KEYS[1]
local group, idle, keep = ARGV[1], tonumber(ARGV[2]), ARGV[3]

local n = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', stream, group)) do
  local info = {}
  for j = 1, #c, 2 do info[c[j]] = c[j + 1] end
  if info['pending'] == 0 and info['idle'] > idle and info['name'] ~= keep then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, info['name'])
    n = n + 1
  end
end
return n
