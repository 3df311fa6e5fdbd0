--[[
  What a script checks before it writes anything, so that a bad key refuses the whole step.
]]

-- A reply stream must be one of the namespace's result streams (its key starts with `prefix`).
local function outside_results(key, prefix)
  return #key <= #prefix or string.sub(key, 1, #prefix) ~= prefix
end

-- A key that exists and holds a value of another type than `kind` ('stream', 'hash').
local function holds_other(key, kind)
  local t = redis.call('TYPE', key)['ok']
  return t ~= 'none' and t ~= kind
end
