--[[
  Move queued tasks into the agent's stream until it holds `want` tasks no worker has read (its
  length less the group's pending entries). The next task comes from the run with the lowest
  (in flight + 1) / share among the runs in the fair zset (those with tasks queued) that are under
  their cap, so an agent's slots are shared in proportion to shares (D'Hondt's rule). A run takes
  tasks while its score stays at or below the next run's, so one run alone moves in one LPOP; the
  runs' state is read once per call, so a settle never has to rescore. Each entry carries its run
  (`r`), whose in-flight count grows by what moved.

  KEYS[1]  fair          the agent's fair zset
  KEYS[2]  runs          the agent's runs hash
  KEYS[3]  stream        the agent's task stream
  KEYS[4]  backlog       the agent's backlog list

  ARGV[1]  group         the consumer group
  ARGV[2]  want          how many unread tasks the stream should hold
  ARGV[3]  queue_prefix  the agent's queue keys less the run id

  Returns how many moved.
]]
-- #include flight
-- #include queues
-- #include backlog

local fair, runs, stream, backlog = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, want, queue_prefix = ARGV[1], tonumber(ARGV[2]), ARGV[3]

local len = redis.call('XLEN', stream)
if len > 0 then
  local p = redis.pcall('XPENDING', stream, group)
  if type(p) == 'table' and p['err'] == nil then len = len - tonumber(p[1]) end
end
want = want - len
if want <= 0 then return 0 end
local names = redis.call('ZRANGE', fair, 0, -1)
local flight, share, cap = {}, {}, {}
for i, run in ipairs(names) do
  local h = redis.call('HMGET', runs, 'flight:' .. run, 'share:' .. run, 'cap:' .. run)
  flight[i], share[i], cap[i] = tonumber(h[1]) or 0, tonumber(h[2]) or 1, tonumber(h[3]) or 0
end
local moved = 0
while moved < want do
  local best, s1, s2 = nil, math.huge, math.huge
  for i = 1, #names do
    if names[i] and (cap[i] == 0 or flight[i] < cap[i]) then
      local s = (flight[i] + 1) / share[i]
      if s < s1 then best, s1, s2 = i, s, s1 elseif s < s2 then s2 = s end
    end
  end
  if not best then break end
  local run = names[best]
  local k = want - moved
  if s2 < math.huge then k = math.min(k, math.max(1, math.floor(s2 * share[best] + 1e-9) - flight[best])) end
  if cap[best] > 0 then k = math.min(k, cap[best] - flight[best]) end
  local queue = queue_prefix .. run
  local items = redis.call('LPOP', queue, k)
  if items then
    for _, item in ipairs(items) do
      local version, body = split_item(item)
      add_task(stream, version, body, run)
    end
    moved = moved + #items
    flight[best] = flight[best] + #items
    enflight(runs, run, #items)
    backlog_take(backlog, #items)
  end
  if not items or redis.call('LLEN', queue) == 0 then
    redis.call('ZREM', fair, run)
    names[best] = false
  end
end
return moved
