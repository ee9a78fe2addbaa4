-- quota-worker: where a tick's fan-out starts serving its items (fair rotation).
--
-- A tick's items are queued in rotated order: position p is item
-- (offset + p) mod n, and workers take them in that order. When the quota
-- says no part-way, the tick's tasks record the first position that ended
-- on a "no" (lua/finish.lua, field `first`); the job's next tick starts
-- there, so the items starved last time go first and no item starves tick
-- after tick. Each tick also gets the job's next turn number, which
-- `starved_ticks` counts in.
--
-- Idempotent per tick: every caller for one tick (the daemon that wins the
-- claim, the ones that lose it, a retry, whoever takes a dead enqueuer's
-- fan-out over) gets the same offset and turn, kept in KEYS[2] for as long
-- as the tick's claim. A tick older than the job's latest one
-- (begun late) gets the latest rotation and turn and moves nothing.
--
-- KEYS
--   1  <prefix>:fair:<job>                      hash: tick, turn, offset, n, first
--   2  <prefix>:tick:<job>:<tick_ms>:rotation   hash: offset, turn
--
-- ARGV
--   1  the tick, ms
--   2  its item count (n)
--   3  TTL of KEYS[1], ms (refreshed by every tick)
--   4  TTL of KEYS[2], ms (the tick's claim's)
--
-- Returns {offset, turn}.

local tick, n = tonumber(ARGV[1]), tonumber(ARGV[2])

local kept = redis.call('HMGET', KEYS[2], 'offset', 'turn')
if kept[1] and kept[2] then
  return { tonumber(kept[1]), tonumber(kept[2]) }
end

local f = redis.call('HMGET', KEYS[1], 'tick', 'turn', 'offset', 'n', 'first')
local last, turn = tonumber(f[1]), tonumber(f[2] or '0')
local offset, was_n, first = tonumber(f[3] or '0'), tonumber(f[4] or '0'), tonumber(f[5])

if last and tick < last then
  -- Begun after a newer tick: serve in the newer one's order, move nothing.
  offset = (n > 0) and (offset % n) or 0
else
  if first and was_n > 0 then
    offset = (offset + first) % was_n
  end
  offset = (n > 0) and (offset % n) or 0
  turn = turn + 1
  redis.call('HSET', KEYS[1], 'tick', tick, 'turn', turn, 'offset', offset, 'n', n)
  redis.call('HDEL', KEYS[1], 'first')
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])

redis.call('HSET', KEYS[2], 'offset', offset, 'turn', turn)
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return { offset, turn }
