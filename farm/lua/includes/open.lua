--[[
  The open tasks (farm.cancel): a task leaves the open-tasks zset and its run's count in the
  open-runs hash once it is settled or drained; a run with none left is forgotten.
]]

-- n tasks fewer open in `run`.
local function open_runs_less(open_runs, run, n)
  if redis.call('HINCRBY', open_runs, run, -n) <= 0 then redis.call('HDEL', open_runs, run) end
end
