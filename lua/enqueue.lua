-- quota-worker: add tasks to the backlog (retries, deferrals, busy copies;
-- a tick's tasks go through lua/fan_out.lua, under the tick's claim).
--
-- The backlog is ours, not apalis-redis's: apalis promotes every due task of
-- its scheduled set in one `unpack`, which fails past ~8,000 and wedges the
-- queue. So tasks wait here and lua/feed.lua hands them to apalis a bounded
-- number at a time. Run-at times come from Redis TIME (+ a delay), so daemons
-- with skewed clocks agree.
--
-- KEYS
--   1  <prefix>:backlog         zset: task id -> run at (ms)
--   2  <prefix>:backlog:data    hash: task id -> payload (JSON)
--   3  <prefix>:wake            stream: told when the backlog's first task is
--                               now due sooner (lua/feed.lua)
--
-- ARGV
--   1..  triples: task id, delay ms, payload
--
-- Returns: tasks added (ids already in the backlog are left alone).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The backlog's first task before these: the idle daemons wait for it;
-- they are told only when one of these is due sooner.
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local soonest = nil
local added = 0
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('HSETNX', KEYS[2], id, ARGV[i + 2]) == 1 then
    local at = now + tonumber(ARGV[i + 1])
    redis.call('ZADD', KEYS[1], at, id)
    added = added + 1
    if soonest == nil or at < soonest then
      soonest = at
    end
  end
end
if soonest and (first[2] == nil or soonest < tonumber(first[2])) then
  redis.call('XADD', KEYS[3], 'MAXLEN', 16, '*', 'at', soonest)
end
return added
