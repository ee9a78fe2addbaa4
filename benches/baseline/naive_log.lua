-- Benchmark baseline (benches/quota): the naive sliding log.
--
-- One zset member per UNIT, so a spend of cost N adds N members: memory is
-- O(cost) per call. Counting is ZREMRANGEBYSCORE (drop what has expired) +
-- ZCARD. Exact, like lua/spend.lua, and as simple as a sliding log gets.
--
-- KEYS  one zset per window: "<request id>:<i>" -> spend time (µs), i = 1..cost
-- ARGV  1  request id   2  cost (>= 1)   then per window: limit (units), period (ms)
-- Returns {allowed, remaining, retry_after_ms}: all windows or none, like spend.lua

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local id = ARGV[1]
local cost = tonumber(ARGV[2])

local remaining, retry = nil, 0
local used = {}
for w = 1, #KEYS do
  local key = KEYS[w]
  local limit = tonumber(ARGV[1 + 2 * w])
  local per = tonumber(ARGV[2 + 2 * w]) * 1000
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - per)
  used[w] = redis.call('ZCARD', key)
  if remaining == nil or limit - used[w] < remaining then
    remaining = limit - used[w]
  end
  if used[w] + cost > limit then
    -- Units free oldest first, one per member: the member at rank
    -- (used + cost - limit - 1) is the last one that must expire.
    local need = used[w] + cost - limit
    local row = redis.call('ZRANGE', key, need - 1, need - 1, 'WITHSCORES')
    if #row == 2 then
      retry = math.max(retry, tonumber(row[2]) + per - now)
    end
  end
end
if retry > 0 then
  return { 0, math.max(remaining, 0), math.ceil(retry / 1000) }
end

for w = 1, #KEYS do
  local key = KEYS[w]
  -- One ZADD per unit, as the textbook log (and the seed write-ups) do it.
  -- naive_log_batched.lua is the same with the members batched into a few
  -- ZADDs: a fairer naive, reported alongside.
  for i = 1, cost do
    redis.call('ZADD', key, now, id .. ':' .. i)
  end
  redis.call('PEXPIRE', key, tonumber(ARGV[2 + 2 * w]) + 1000)
end
return { 1, remaining - cost, 0 }
