-- quota-worker: a task written into apalis-redis's queue, as apalis-redis's
-- own push (lua/batch_push.lua in apalis-redis 1.0) writes an immediate one:
-- its payload into the data hash with HSETNX (a task id already there is not
-- pushed again, so nothing runs twice: apalis pitfall 3), its metadata hash;
-- then the ids pushed, at the tail of the active list in the order given,
-- and a wake-up of every daemon's idle worker (an entry `at` 0 in the wake
-- stream, the newest 16 kept).
--
-- Not a script of its own: lua/fan_out.lua and lua/feed.lua, which both put
-- tasks straight into apalis, start with this text (src/queue/scripts/), so
-- apalis's task layout is written in one place.

-- Writes task `id` with `payload` (KEYS-independent: the caller names the
-- data hash and the metadata prefix); whether it was new.
local function apalis_write(data_hash, meta_prefix, id, payload)
  if redis.call('HSETNX', data_hash, id, payload) == 1 then
    redis.call('HSET', meta_prefix .. ':' .. id, 'attempts', 0, 'max_attempts', 1,
      'status', 'Pending', 'idempotency_key', '')
    return true
  end
  return false
end

-- Queues the written ids `pushed` on apalis's active list and wakes the
-- daemons (nothing when none).
local function apalis_announce(active_list, wake, pushed)
  if #pushed > 0 then
    redis.call('RPUSH', active_list, unpack(pushed))
    redis.call('XADD', wake, 'MAXLEN', 16, '*', 'at', 0)
  end
end

