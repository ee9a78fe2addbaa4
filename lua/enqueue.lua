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
--
-- ARGV
--   1..  triples: task id, delay ms, payload
--
-- Returns: tasks added (ids already in the backlog are left alone).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local added = 0
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('HSETNX', KEYS[2], id, ARGV[i + 2]) == 1 then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[i + 1]), id)
    added = added + 1
  end
end
return added
