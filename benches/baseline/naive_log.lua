-- Benchmark baseline (benches/quota): the naive sliding log.
--
-- One zset member per UNIT, so a spend of cost N adds N members: memory is
-- O(cost) per call. Counting is ZREMRANGEBYSCORE (drop what has expired) +
-- ZCARD. Exact, like lua/spend.lua, and as simple as a sliding log gets.
--
-- KEYS  1  zset: "<request id>:<i>" -> spend time (µs), i = 1..cost
-- ARGV  1  request id   2  cost (>= 1)   3  limit (units)   4  period (ms)
-- Returns {allowed, remaining, retry_after_ms}

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local id = ARGV[1]
local cost = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local per = tonumber(ARGV[4]) * 1000

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - per)
local used = redis.call('ZCARD', KEYS[1])

if used + cost > limit then
  -- Units free oldest first, one per member: the member at rank
  -- (used + cost - limit - 1) is the last one that must expire.
  local need = used + cost - limit
  local row = redis.call('ZRANGE', KEYS[1], need - 1, need - 1, 'WITHSCORES')
  local retry = 0
  if #row == 2 then
    retry = tonumber(row[2]) + per - now
  end
  return { 0, math.max(limit - used, 0), math.ceil(retry / 1000) }
end

-- One ZADD per unit, as the textbook log (and the seed write-ups) do it.
-- benches/baseline/naive_log_batched.lua is the same with the members
-- batched into a few ZADDs: a fairer naive, reported alongside.
for i = 1, cost do
  redis.call('ZADD', KEYS[1], now, id .. ':' .. i)
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]) + 1000)
return { 1, limit - used - cost, 0 }
