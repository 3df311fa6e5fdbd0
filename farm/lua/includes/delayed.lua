--[[
  A retry waiting out its backoff (retry.lua) is not in flight: its member in the agent's delayed
  zset is `r:RUN\nBODY` (a bare BODY when it counts for no run), so promote.lua can count it in
  flight again when it goes back to the stream.
]]

local function delayed_member(run, body)
  if run == '' then return body end
  return 'r:' .. run .. '\n' .. body
end

-- The run (nil: none) and the task body of a delayed member.
local function from_delayed(member)
  local nl = string.find(member, '\n', 1, true)
  if string.sub(member, 1, 2) == 'r:' and nl then
    return string.sub(member, 3, nl - 1), string.sub(member, nl + 1)
  end
  return nil, member
end
