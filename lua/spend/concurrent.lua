-- A concurrent window: admits while its units in flight plus the cost fit
-- its units. A spend takes a lease of its cost (HSETNX held, ZADD lease with
-- its expiry); the settle of its request id, whatever the cost, returns it
-- (the answer was read, or nothing was sent). A lease not returned (its
-- process died) lapses at its expiry: the meta string keeps a lower bound of
-- the earliest expiry, and only a call at or past it reads the zset,
-- dropping at most LAPSE expired leases (the first ones by score: one
-- ZRANGEBYSCORE, one HMGET, one ZREMRANGEBYRANK), so admit, reject and
-- lapse are O(log n). Its keys outlive the latest lease (a quarter lease of
-- slack) and go when nothing is in flight. It keeps no drift and no waiting
-- line; its refusal is momentary (a lease may be returned any time).

-- `per` is the lease's length.
function Concurrent.proto(units, per)
  if per < 1000 then
    return nil, 'needs a lease of at least 1 ms'
  end
  return { units = units, per = per }
end

-- A refusal waits at most SOON (ops.lua): the caller asks again soon rather
-- than at the lease's end.
Concurrent.momentary = true

function Concurrent.open(w, KEYS, k)
  w.meta, w.lease, w.held = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  return 3
end

-- Drops leases that expired (their process died before it settled them),
-- at most LAPSE a call: the first by score, so one ZRANGEBYSCORE finds them
-- and one ZREMRANGEBYRANK drops them; their units leave the count. `low`
-- becomes the earliest lease left (past now again unless more than LAPSE
-- had expired: the next call drops more).
local function lapse(w, now)
  local ids = call('ZRANGEBYSCORE', w.lease, '-inf', now, 'LIMIT', 0, LAPSE)
  if #ids > 0 then
    local units, freed = call('HMGET', w.held, unpack(ids)), 0
    for j = 1, #units do
      freed = freed + (tonumber(units[j]) or 0)
    end
    call('HDEL', w.held, unpack(ids))
    call('ZREMRANGEBYRANK', w.lease, 0, #ids - 1)
    w.used = max(w.used - freed, 0)
  end
  local first = call('ZRANGE', w.lease, 0, 0, 'WITHSCORES')
  w.low = tonumber(first[2]) or 0
  if w.low == 0 then
    w.used = 0
  end
  w.dirty = true
end

function Concurrent.load(w, c)
  local raw = c.got[w.mi]
  w.raw = raw or false
  w.used, w.low, w.expires = 0, 0, 0
  if raw then
    w.used, w.low, w.expires = unpackmp(raw)
    if w.low ~= 0 and w.low <= c.now then
      lapse(w, c.now)
    end
  elseif c.op ~= 'peek' and call('EXISTS', w.lease, w.held) > 0 then
    -- Counters gone with leases left (they expired apart): no stray lease
    -- may count.
    call('UNLINK', w.lease, w.held)
  end
end

function Concurrent.holds(w, c)
  return call('HEXISTS', w.held, c.id) == 1
end

function Concurrent.record(w, c)
  return call('HSETNX', w.held, c.id, c.cost) == 1
end

function Concurrent.unrecord(w, c)
  call('HDEL', w.held, c.id)
end

-- Asked last for a refused spend's id: it remembers it only while its lease
-- lasts (ops.lua).
function Concurrent.keeps()
  return 0
end

-- The lease: its expiry in the zset (its units are in `held`).
function Concurrent.admit(w, c)
  local now = c.now
  local at = now + w.per
  call('ZADD', w.lease, at, c.id)
  w.used = w.used + c.cost
  if w.low == 0 or at < w.low then
    w.low = at
  end
  if w.expires < at then
    -- The keys outlive every lease, with a quarter lease of slack (1 s to
    -- 1 h), so most spends skip the PEXPIREs.
    w.expires = at + min(max(floor(w.per / 4), 1000000), 3600000000)
    w.ttl = true
    local ttl = ceil((w.expires - now) / 1000)
    call('PEXPIRE', w.lease, ttl)
    call('PEXPIRE', w.held, ttl)
  end
  w.dirty = true
  return true
end

-- Until the earliest lease expires (a settle may free one sooner: nobody
-- can know when).
function Concurrent.frees(w, c, target)
  if w.used - w.xr <= target then
    return 0
  end
  local first = call('ZRANGE', w.lease, 0, 0, 'WITHSCORES')
  return max((tonumber(first[2]) or c.now) - c.now, 1)
end

-- Whatever the cost, a settle ends the lease: the answer was read, or
-- nothing was sent. A lease already returned or lapsed: nothing.
function Concurrent.settle(w, c)
  local held = tonumber(call('HGET', w.held, c.id))
  if not held then
    return nil, true
  end
  call('HDEL', w.held, c.id)
  call('ZREM', w.lease, c.id)
  w.used = max(w.used - held, 0)
  w.dirty = true
  return c.cost - held, true
end

-- Units in flight are no spent units: nothing to resync, nothing to forget.
function Concurrent.sync()
  return 0
end

function Concurrent.undrift()
  return 0
end

function Concurrent.leases(w)
  return call('ZCARD', w.lease)
end

-- Nothing in flight: nothing to remember (the lease zset and held hash are
-- empty, so Redis has dropped them already).
function Concurrent.save(w, c)
  if not w.dirty then
    return
  end
  local now = c.now
  if w.used <= 0 or w.expires <= now then
    call('DEL', w.meta)
  elseif w.ttl or not w.raw then
    call('SET', w.meta, packmp(w.used, w.low, w.expires), 'PX', ceil((w.expires - now) / 1000))
  else
    call('SET', w.meta, packmp(w.used, w.low, w.expires), 'KEEPTTL')
  end
end
