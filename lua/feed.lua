-- quota-worker: move due backlog tasks into apalis-redis's queue, in one call.
--
-- Keeps apalis's scheduled set + active list under a cap (apalis pitfall 4:
-- its fetch promotes every due task of the scheduled set in one `unpack`,
-- which fails past ~8,000; tasks pushed here go to the active list, which
-- its fetch reads one at a time, but the cap also bounds the per-task
-- metadata apalis keeps). Each task is written as apalis-redis's own push
-- writes an immediate one (lua/apalis_push.lua, which this script starts
-- with), in backlog order (due time, then id: a tick's tasks in serving
-- order). Moving and removing happen in the same call, so
-- a feeder that dies mid-way loses nothing and no lease is needed.
--
-- Then it says what is next, for the daemon's waiter (src/daemon/feeder.rs):
-- when the backlog's (or apalis's scheduled set's) next task is due, and
-- how many tasks apalis holds ready to fetch. When it moved tasks, it adds
-- an entry to the wake stream, so that every daemon's idle worker fetches
-- (its waiter blocks on the stream with XREAD).
--
-- KEYS
--   1  <prefix>:backlog           zset: task id -> run at (ms)
--   2  <prefix>:backlog:data      hash: task id -> payload
--   3  apalis task data hash      (<prefix>:queue:data)
--   4  apalis active list         (<prefix>:queue:active)
--   5  apalis scheduled set       (<prefix>:queue:scheduled; score: run at, s)
--   6  <prefix>:wake              stream, one field `at`: 0 when apalis got
--                                 tasks to fetch (this script), else when a
--                                 task added to the backlog is due, ms
--                                 (lua/fan_out.lua, lua/enqueue.lua); the
--                                 newest 16 entries are kept (a reader that
--                                 gets 16 may have missed some, and looks)
--
-- ARGV
--   1  cap: most tasks allowed in apalis's scheduled set + active list
--   2  most tasks moved by this call
--   3  apalis task metadata prefix (<prefix>:queue:meta; a task's is <prefix>:<id>)
--
-- Returns {moved, now_ms, next_ms, ready}: tasks moved now; Redis's clock
-- (ms); when the next task of the backlog or of apalis's scheduled set is
-- due (ms; -1: none; <= now_ms: due already, waiting for room); tasks in
-- apalis ready to fetch (active list + due scheduled ones).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = tonumber(t[1])

local queued = redis.call('ZCARD', KEYS[5]) + redis.call('LLEN', KEYS[4])
local n = math.min(tonumber(ARGV[1]) - queued, tonumber(ARGV[2]))
local moved = 0
if n > 0 then
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, n)
  if #due > 0 then
    local payloads = redis.call('HMGET', KEYS[2], unpack(due))
    local pushed = {}
    for i, id in ipairs(due) do
      -- A payload-less entry cannot run: it just leaves the backlog.
      local payload = payloads[i]
      if payload and apalis_write(KEYS[3], ARGV[3], id, payload) then
        pushed[#pushed + 1] = id
      end
    end
    apalis_announce(KEYS[4], KEYS[6], pushed)
    redis.call('ZREM', KEYS[1], unpack(due))
    redis.call('HDEL', KEYS[2], unpack(due))
    moved = #pushed
    queued = queued + moved
  end
end

-- What comes next: the backlog's first task, and apalis's own retries
-- (scheduled at whole seconds; a task this call pushed is in the list).
local next_ms = -1
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  next_ms = tonumber(first[2])
end
local ready = redis.call('LLEN', KEYS[4])
if ready < queued then
  local sched = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
  if sched[2] then
    local at = tonumber(sched[2]) * 1000
    if at <= now then
      ready = ready + redis.call('ZCOUNT', KEYS[5], '-inf', now_s)
    end
    if next_ms < 0 or at < next_ms then
      next_ms = at
    end
  end
end
return { moved, now, next_ms, ready }
