-- quota-worker: record how a task ended, in one round trip.
--
-- The done marker makes a redelivered copy of the task do nothing; the tick's
-- outcome hash is what `quota-worker trigger --wait` reads. For a task that
-- ended on the quota's (or the upstream's) "no", the hash also keeps the
-- earliest moment any of the tick's tasks may retry, on Redis's clock (so
-- daemons on hosts with skewed clocks agree), for the summary's "retry after".
--
-- KEYS
--   1  <prefix>:done:<task root>                 string: the outcome
--   2  <prefix>:tick:<job>:<tick_ms>:outcomes    hash: outcome field -> count,
--                                                "#items", "#retry_at_ms"
--
-- ARGV
--   1  the outcome ("done", "quota_exhausted", ...), stored in KEYS[1]
--   2  the hash field to count it in (the outcome, or "~retrying", "~deferred")
--   3  TTL of both keys, seconds
--   4  retry-after, ms, of an outcome that ended on a quota; "" for none
--
-- Returns: 1

redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
if ARGV[4] ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local at = now + tonumber(ARGV[4])
  local earliest = tonumber(redis.call('HGET', KEYS[2], '#retry_at_ms'))
  if earliest == nil or at < earliest then
    redis.call('HSET', KEYS[2], '#retry_at_ms', string.format('%d', at))
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
