-- Benchmark peer (benches/peers): two windows in one call, the common
-- dual-window sliding log (a short and a long limit, say 5 s and 60 s):
-- one sorted set per window, one member per hit, ZREMRANGEBYSCORE + ZCARD
-- on both, then ZADD to both when both have room. Cost 1 only; no request
-- ids beyond the member, no weighted retry-after, no settle.
--
-- KEYS  1 the short window's zset   2 the long window's
-- ARGV  1 member (unique per hit)   2 limit 1   3 period 1, ms   4 limit 2   5 period 2, ms
-- Returns {allowed}

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for w = 1, 2 do
  redis.call('ZREMRANGEBYSCORE', KEYS[w], '-inf', now - tonumber(ARGV[1 + 2 * w]))
  if redis.call('ZCARD', KEYS[w]) >= tonumber(ARGV[2 * w]) then
    return { 0 }
  end
end
for w = 1, 2 do
  redis.call('ZADD', KEYS[w], now, ARGV[1])
  redis.call('PEXPIRE', KEYS[w], ARGV[1 + 2 * w])
end
return { 1 }
