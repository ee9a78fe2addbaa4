-- quota-worker: lease due backlog tasks for handing to apalis-redis.
--
-- Keeps apalis's scheduled set + active list + tasks in transit under a cap,
-- so its fetch never promotes more than it can unpack. A leased task stays in
-- the backlog until the feeder confirms the push (lua/fed.lua); if the feeder
-- dies first, the lease expires and another feeder pushes it again — apalis
-- ignores a second push of the same task id (HSETNX), so nothing runs twice.
--
-- KEYS
--   1  <prefix>:backlog           zset: task id -> run at (ms)
--   2  <prefix>:backlog:data      hash: task id -> payload
--   3  <prefix>:backlog:feeding   zset: task id -> lease end (ms)
--   4  apalis scheduled set       (<prefix>:queue:scheduled)
--   5  apalis active list         (<prefix>:queue:active)
--
-- ARGV
--   1  cap: most tasks allowed in apalis + in transit
--   2  lease, ms
--   3  most tasks to lease in this call
--
-- Returns: {id1, payload1, id2, payload2, ...} leased now (possibly empty).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Leases that ran out: their feeder died; the tasks are due again.
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)

local in_transit = redis.call('ZCARD', KEYS[3])
local room = tonumber(ARGV[1]) - redis.call('ZCARD', KEYS[4]) - redis.call('LLEN', KEYS[5]) - in_transit
local n = math.min(room, tonumber(ARGV[3]))
if n <= 0 then
  return {}
end

-- Leased tasks are the oldest due ones, so skipping them reads at most
-- in_transit extra entries.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, n + in_transit)
local out = {}
local lease_end = now + tonumber(ARGV[2])
for _, id in ipairs(due) do
  if not redis.call('ZSCORE', KEYS[3], id) then
    local payload = redis.call('HGET', KEYS[2], id)
    if payload then
      redis.call('ZADD', KEYS[3], lease_end, id)
      out[#out + 1] = id
      out[#out + 1] = payload
    else
      -- A payload-less entry cannot run; drop it rather than loop on it.
      redis.call('ZREM', KEYS[1], id)
    end
    if #out >= 2 * n then
      break
    end
  end
end
return out
