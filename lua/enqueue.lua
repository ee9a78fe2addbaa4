-- quota-worker: add tasks to the backlog, optionally claiming a cron tick.
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
--   3  claim key (<prefix>:tick:<job>:<tick_ms>), used when ARGV[1] > 0
--   4  the tick's outcome hash, used when ARGV[3] > 0
--
-- ARGV
--   1  claim TTL, ms (0: no claim)
--   2  claim value (who claimed)
--   3  outcome hash TTL, ms (0: none)
--   4  number of tasks in the tick (stored as "#items")
--   5..  triples: task id, delay ms, payload
--
-- Returns: tasks added (ids already in the backlog are left alone), or -1 when
-- the tick was already claimed (nothing added).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if tonumber(ARGV[1]) > 0 then
  if not redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ARGV[1]) then
    return -1
  end
end
if tonumber(ARGV[3]) > 0 then
  redis.call('HSET', KEYS[4], '#items', ARGV[4])
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
end

local added = 0
for i = 5, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('HSETNX', KEYS[2], id, ARGV[i + 2]) == 1 then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[i + 1]), id)
    added = added + 1
  end
end
return added
