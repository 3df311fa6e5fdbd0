--[[
  The agent's backlog list holds one byte per task queued in any of its runs, so that its length
  is the agent's queued total (KEDA's Redis list scaler and `farm status` read it): enqueue.lua
  adds, feed.lua and drain.lua take away.
]]

local function backlog_add(backlog, n)
  local ones = {}
  for i = 1, math.min(n, 1000) do ones[i] = '1' end
  for i = 1, n, 1000 do redis.call('RPUSH', backlog, unpack(ones, 1, math.min(1000, n - i + 1))) end
end

local function backlog_take(backlog, n)
  redis.call('LTRIM', backlog, n, -1)
end
