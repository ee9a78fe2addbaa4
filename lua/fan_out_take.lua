-- quota-worker: take over a tick's fan-out whose enqueuer went silent.
--
-- An enqueuer renews its lease with every chunk (lua/fan_out.lua); one that
-- died (SIGKILL, a lost host, a Redis outage longer than its retries) stops
-- renewing it. Once the lease has run out, the first caller here becomes
-- the owner and goes on at `next`; the old owner's next chunk is refused.
--
-- KEYS
--   1  <prefix>:tick:<job>:<tick_ms>:fan_out     hash: owner, lease (ms), next, origin
--   2  <prefix>:fanning                          zset: "<job>:<tick_ms>" -> lease end (ms)
--
-- ARGV
--   1  who takes over
--   2  lease, ms
--   3  the fan-out's member in KEYS[2]
--   4  take it only if its tasks' origin is this ("": any)
--
-- Returns {status, next, origin-or-owner}:
--    1  taken over (or already the caller's): go on at `next`
--    0  its owner's lease still runs: owner named, `next` = progress
--   -1  nothing to take over: the fan-out finished, or its keys expired
--   -2  its origin is not ARGV[4]: left alone (origin named)

local who, lease, member = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then
  redis.call('ZREM', KEYS[2], member)
  return { -1, 0, '' }
end
local next = tonumber(redis.call('HGET', KEYS[1], 'next') or '0')
local origin = redis.call('HGET', KEYS[1], 'origin') or 'tick'
if ARGV[4] ~= '' and origin ~= ARGV[4] then
  return { -2, next, origin }
end
local until_ms = tonumber(redis.call('HGET', KEYS[1], 'lease') or '0')
if owner ~= who and until_ms > now then
  return { 0, next, owner }
end
redis.call('HSET', KEYS[1], 'owner', who, 'lease', now + lease)
redis.call('ZADD', KEYS[2], now + lease, member)
return { 1, next, origin }
