-- quota-worker: queue one chunk of a tick's tasks, under the tick's claim.
--
-- A tick's fan-out is a series of calls, each a bounded chunk (so no call
-- holds Redis for long), each idempotent: the tick's progress hash says how
-- many tasks are queued (`next`), and a chunk is applied only at exactly
-- that position. A call whose reply was lost can be sent again (it finds
-- its chunk applied and changes nothing); an enqueuer that dies leaves the
-- progress hash with a lease that runs out, and whoever takes it over
-- (lua/fan_out_take.lua) goes on at `next`. No task id is queued twice.
--
-- The first chunk claims the tick (SET NX: with several daemons exactly one
-- fans each tick out). A fan-out that fits one chunk is claimed, queued and
-- finished in one call and never leaves a progress hash.
--
-- KEYS
--   1  <prefix>:backlog                          zset: task id -> run at (ms)
--   2  <prefix>:backlog:data                     hash: task id -> payload
--   3  <prefix>:tick:<job>:<tick_ms>             string: who claimed the tick
--   4  <prefix>:tick:<job>:<tick_ms>:outcomes    hash: "#items" when all are queued
--   5  <prefix>:tick:<job>:<tick_ms>:fan_out     hash: owner, lease (ms), next, origin
--   6  <prefix>:fanning                          zset: "<job>:<tick_ms>" -> lease end (ms)
--   7  <prefix>:wake                             stream: told when the backlog's first
--                                                task is now due sooner (lua/feed.lua),
--                                                or when apalis got tasks to fetch
--   8  apalis task data hash                     (<prefix>:queue:data)
--   9  apalis active list                        (<prefix>:queue:active)
--  10  apalis scheduled set                      (<prefix>:queue:scheduled)
--
-- ARGV
--   1  who is calling (the claim's value, the progress owner)
--   2  index of this chunk's first task
--   3  1 when this chunk is the fan-out's last, else 0
--   4  lease, ms: how long the caller may be silent before another takes over
--   5  TTL of the claim, outcome and progress keys, ms
--   6  this fan-out's member in KEYS[6] ("<job>:<tick_ms>")
--   7  the tasks' origin ("tick", "trigger"), kept for whoever resumes
--   8  cap: most tasks allowed in apalis's scheduled set + active list, as
--      lua/feed.lua counts them (0: every task goes through the backlog)
--   9  apalis task metadata prefix (<prefix>:queue:meta)
--  10..  triples: task id, delay ms, payload
--
-- Returns {status, n, owner}:
--    0  chunk queued (or found queued by an earlier call); n = tasks queued so far
--    1  the fan-out is complete; n = its tasks ("#items")
--   -1  the tick is someone else's (claimed, or taken over after this
--       caller's lease ran out): n = tasks queued so far (-1: all), owner = who
--   -2  the claim is gone (expired) though chunks were queued: stop
--   -3  this chunk does not start at n (the caller lost track): go on at n

local who, start, last = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local lease, ttl, member = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local claim = redis.call('GET', KEYS[3])
if not claim then
  if start ~= 0 then
    return { -2, 0, '' }
  end
  redis.call('SET', KEYS[3], who, 'PX', ttl)
  if not last then
    redis.call('HSET', KEYS[5], 'owner', who, 'next', 0, 'origin', ARGV[7])
  end
else
  local owner = redis.call('HGET', KEYS[5], 'owner')
  if not owner then
    -- Finished: by this caller (a call whose reply was lost), or by another.
    local items = tonumber(redis.call('HGET', KEYS[4], '#items') or '-1')
    if claim == who then
      return { 1, items, who }
    end
    return { -1, -1, claim }
  end
  if owner ~= who then
    return { -1, tonumber(redis.call('HGET', KEYS[5], 'next')), owner }
  end
end

local next = tonumber(redis.call('HGET', KEYS[5], 'next') or '0')
if start < next then
  -- Queued by an earlier call whose reply was lost.
  return { 0, next, who }
end
if start > next then
  -- Would leave a gap: the caller lost track of the progress.
  return { -3, next, who }
end

-- The backlog's first task before this chunk: the idle daemons wait for
-- it; they are told only when a task of this chunk is due sooner.
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')

-- Tasks due now go straight into apalis (its data hash, metadata and
-- active list, as lua/feed.lua moves them: lua/apalis_push.lua) while it holds fewer than the
-- cap and no backlog task is due before them (issue 28: through the
-- backlog a task cost a HSETNX and a ZADD here and a HSETNX and a HSET in
-- the feed; straight in, the HSETNX and the HSET). The rest wait in the
-- backlog for the feeder, as before (apalis pitfall 4). apalis's HSETNX
-- keeps a task id once (pitfall 3).
local room = 0
local cap = tonumber(ARGV[8])
if cap > 0 and (first[2] == nil or tonumber(first[2]) > now) then
  room = cap - redis.call('ZCARD', KEYS[10]) - redis.call('LLEN', KEYS[9])
end
local soonest = nil
local pushed = {}
for i = 10, #ARGV, 3 do
  local id, delay = ARGV[i], tonumber(ARGV[i + 1])
  if delay <= 0 and #pushed < room then
    if apalis_write(KEYS[8], ARGV[9], id, ARGV[i + 2]) then
      pushed[#pushed + 1] = id
    end
  elseif redis.call('HSETNX', KEYS[2], id, ARGV[i + 2]) == 1 then
    local at = now + delay
    redis.call('ZADD', KEYS[1], at, id)
    if soonest == nil or at < soonest then
      soonest = at
    end
  end
end
apalis_announce(KEYS[9], KEYS[7], pushed)
if soonest and (first[2] == nil or soonest < tonumber(first[2])) then
  redis.call('XADD', KEYS[7], 'MAXLEN', 16, '*', 'at', soonest)
end
next = start + (#ARGV - 9) / 3

if last then
  redis.call('HSET', KEYS[4], '#items', next)
  redis.call('PEXPIRE', KEYS[4], ttl)
  redis.call('DEL', KEYS[5])
  redis.call('ZREM', KEYS[6], member)
  return { 1, next, who }
end
redis.call('HSET', KEYS[5], 'next', next, 'lease', now + lease)
redis.call('PEXPIRE', KEYS[5], ttl)
redis.call('ZADD', KEYS[6], now + lease, member)
redis.call('PEXPIRE', KEYS[6], ttl)
return { 0, next, who }
