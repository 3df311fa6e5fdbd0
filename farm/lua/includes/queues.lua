--[[
  Tasks on their way to the agent's task stream.

  A task entry is `v` (schema version), `d` (body) and, when it counts in a run's in-flight total,
  `r` (the run; add_task's run nil: none). A run's queue holds each task as `VERSION|BODY`.
]]

local function add_task(stream, version, body, run)
  if run then
    redis.call('XADD', stream, '*', 'v', version, 'd', body, 'r', run)
  else
    redis.call('XADD', stream, '*', 'v', version, 'd', body)
  end
end

-- The version and body of a queued `VERSION|BODY` item (no '|': no version).
local function split_item(item)
  local sep = string.find(item, '|', 1, true)
  if sep then return string.sub(item, 1, sep - 1), string.sub(item, sep + 1) end
  return '', item
end
