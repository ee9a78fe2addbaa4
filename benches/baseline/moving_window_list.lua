-- Benchmark peer (benches/quota): a moving window on a Redis list, the
-- algorithm the Python `limits` library documents for its moving-window
-- strategy, written here from that description (not from its code).
--
-- The list holds the timestamps of the last `limit` hits, newest first. A
-- hit of weight `amount` is allowed when the entry at index limit - amount
-- is missing or older than the window; then `amount` timestamps are pushed
-- and the list is trimmed to `limit`. One list entry per unit, like the
-- naive log; no request ids, no exact weighted retry-after.
--
-- KEYS  1 the list
-- ARGV  1 limit   2 window, ms   3 amount (>= 1)
-- Returns {allowed}

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local limit, window, amount = tonumber(ARGV[1]), tonumber(ARGV[2]) / 1000, tonumber(ARGV[3])
if amount > limit then
  return { 0 }
end
local edge = redis.call('LINDEX', KEYS[1], limit - amount)
if edge and tonumber(edge) >= now - window then
  return { 0 }
end
local stamps = {}
for i = 1, amount do
  stamps[i] = now
end
redis.call('LPUSH', KEYS[1], unpack(stamps))
redis.call('LTRIM', KEYS[1], 0, limit - 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return { 1 }
