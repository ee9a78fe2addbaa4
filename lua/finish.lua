-- quota-worker: record how a task ended, in one round trip.
--
-- The done marker makes a redelivered copy of the task do nothing; the tick's
-- outcome hash is what `quota-worker trigger --wait` reads. For a task that
-- ended on the quota's (or the upstream's) "no", the hash also keeps the
-- earliest moment any of the tick's tasks may retry, on Redis's clock (so
-- daemons on hosts with skewed clocks agree), for the summary's "retry after".
--
-- Fairness (lua/rotate.lua): a task of the job's latest tick that ended on
-- a "no" lowers the tick's first such position (`first`), where the next
-- tick starts serving. And the job's starved items are kept (KEYS[4]: item
-- -> the turn its starvation began), so each outcome says how many ticks
-- in a row its item was starved: a task starved (a "no" before any page)
-- adds its item if absent; a task served (a spend admitted) removes it.
--
-- KEYS
--   1  <prefix>:done:<task root>                 string: the outcome
--   2  <prefix>:tick:<job>:<tick_ms>:outcomes    hash: outcome field -> count,
--                                                "#items", "#retry_at_ms"
--   3  <prefix>:fair:<job>                       hash: tick, turn, offset, n, first
--   4  <prefix>:starved:<job>                    hash: item key -> turn starved since
--
-- ARGV
--   1  the outcome ("done", "quota_exhausted", ...), stored in KEYS[1]
--   2  the hash field to count it in (the outcome, or "~retrying", "~deferred")
--   3  TTL of both keys, seconds
--   4  retry-after, ms, of an outcome that ended on a quota; "" for none
--   5  for fairness: "starved" (a "no" before any page), "cut" (a "no" after
--      pages), "served" (a spend admitted), "" (neither: superseded, ...)
--   6  the task's tick, ms
--   7  the task's item index in its tick
--   8  the task's turn ("": a task queued without rotation; no fairness)
--   9  the item key
--  10  TTL of KEYS[4], ms
--  11  most items KEYS[4] keeps
--
-- Returns: the item's starved ticks in a row (this one included when it
-- starved; the run this one ended when served), or -1 (no fairness).

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

-- Callers without the fairness arguments (other languages, older tools)
-- record the outcome only.
local class, item = ARGV[5] or '', ARGV[9]
local turn = ARGV[8] and tonumber(ARGV[8])
if class == '' or turn == nil or #KEYS < 4 then
  return -1
end

if class ~= 'served' then
  local f = redis.call('HMGET', KEYS[3], 'tick', 'offset', 'n', 'first')
  local n = tonumber(f[3] or '0')
  if tonumber(f[1]) == tonumber(ARGV[6]) and n > 0 then
    local p = (tonumber(ARGV[7]) - tonumber(f[2] or '0')) % n
    local first = tonumber(f[4])
    if first == nil or p < first then
      redis.call('HSET', KEYS[3], 'first', p)
    end
  end
end

local since = tonumber(redis.call('HGET', KEYS[4], item))
if class == 'starved' then
  if since == nil then
    since = turn
    if redis.call('HLEN', KEYS[4]) < tonumber(ARGV[11]) then
      redis.call('HSET', KEYS[4], item, turn)
    end
  end
  redis.call('PEXPIRE', KEYS[4], ARGV[10])
  -- A task of an older tick ending late counts its own tick at least.
  return math.max(turn - since + 1, 1)
end
if since == nil then
  return 0
end
redis.call('HDEL', KEYS[4], item)
return math.max(turn - since, 0)
