-- A fixed window: at most `units` per calendar period of `per` that starts
-- `reset` after local midnight in its time zone (DST shifts the reset). Its
-- hash holds the period it counts ("#period"), its units ("#used") and drift
-- ("#drift", "#rd", "#rdt"), and each request id's units. A new period
-- starts at 0: its old state is reset on the period's first write.
--
-- Time never runs back into an earlier period: a Redis clock stepped
-- backwards (NTP, failover to a skewed replica) would otherwise put `now`
-- in a period before the one the window counts, which would then restart
-- from 0 and admit more than the limit. So when a fixed window starts a
-- period it writes `now` to the credential's clock key (KEYS[2]), and no
-- call's `now` is earlier than it (core.lua, clock). Sliding windows need no
-- such guard: a clock stepped back makes entries look younger, so they
-- expire later (fewer admitted, never more).

-- The zone's table runs ten years ahead: it is parsed only as far as
-- needed (cover), usually the first few changes, and kept with the spec.
function Fixed.proto(units, per, rest)
  local reset, tz = match(rest, '^(%d+):(.*)$')
  local _, b, off = find(tz or '', '^(%-?%d+)')
  if not b then
    return nil, 'needs "<reset_ms>:<tz>" after its period'
  end
  return { units = units, per = per, reset = tonumber(reset) * 1000, tz = { tonumber(off) * 1000 }, tzspec = tz, tzpos = b + 1 }
end

-- Parses the zone table of p until it holds a change after `upto` (µs), or
-- all of it: tz = { offset, at, offset, at, offset, ... } in µs.
local function cover(p, upto)
  local tz = p.tz
  while p.tzpos and (#tz == 1 or tz[#tz - 1] <= upto) do
    local a, b, at, off = find(p.tzspec, '^|(%-?%d+)|(%-?%d+)', p.tzpos)
    if a then
      tz[#tz + 1] = tonumber(at) * 1000
      tz[#tz + 1] = tonumber(off) * 1000
      p.tzpos = b + 1
    else
      p.tzpos = nil
    end
  end
  return tz
end

-- UTC offset (µs) in effect at UTC instant `at` (µs) in p's zone.
local function offset_at(p, at)
  local tz = cover(p, at)
  local off = tz[1]
  for j = 2, #tz, 2 do
    if at >= tz[j] then
      off = tz[j + 1]
    else
      break
    end
  end
  return off
end

-- The first UTC instant (µs) at which the local wall clock reads `wall`.
-- A wall time a DST jump skips (02:00 on a spring-forward night; midnight
-- where DST starts at 00:00) is first reached at the jump itself: taking
-- either offset there would put it an hour early or an hour late.
local function wall_to_utc(p, wall, hint)
  local off = offset_at(p, wall - offset_at(p, hint))
  local utc = wall - off
  local actual = offset_at(p, utc)
  if actual == off then
    return utc
  end
  local lo, hi = min(utc, wall - actual), max(utc, wall - actual)
  local tz = cover(p, hi)
  for j = 2, #tz, 2 do
    if tz[j] > lo and tz[j] <= hi then
      return tz[j]
    end
  end
  return utc
end

-- The number of the period holding UTC instant `t` (µs), and when period
-- `q` starts (µs): for a waiting line's promises.
function Fixed.period_of(w, t)
  local p = w.p
  return floor((t + offset_at(p, t) - p.reset) / w.per)
end

function Fixed.start(w, q, now)
  local p = w.p
  return wall_to_utc(p, q * w.per + p.reset, now)
end

function Fixed.open(w, KEYS, k)
  w.state = KEYS[k]
  return 1
end

-- Its period (the number of the calendar period holding now, and when it
-- ends) and usage; a new period counts 0.
function Fixed.load(w, c)
  local p, now = w.p, c.now
  local wall = now + offset_at(p, now)
  w.period = floor((wall - p.reset) / w.per)
  w.ends = wall_to_utc(p, (w.period + 1) * w.per + p.reset, now)
  if w.ends <= now then
    w.ends = now + 1000
  end
  local r = call('HMGET', w.state, '#period', '#used', '#drift', '#rd', '#rdt')
  w.fresh_period = tonumber(r[1]) ~= w.period
  if w.fresh_period then
    w.used, w.drift, w.rd, w.rdt = 0, 0, 0, 0
  else
    w.used, w.drift = tonumber(r[2] or '0'), tonumber(r[3] or '0')
    w.rd, w.rdt = tonumber(r[4] or '0'), tonumber(r[5] or '0')
  end
  if w.rd ~= 0 then
    -- Ended reset-bound drift stays in the hash, read as ended.
    count_reset_drift(w, now, false)
  end
end

-- Starts its new period, if it needs one, before a write. Remembers `now`
-- when it does (see the top): from then on no `now` falls before that
-- period's start. Spends within a period need not write it. The clock key
-- lives at least as long as the window's state.
local function start_period(w, c)
  if not w.fresh_period then
    return
  end
  local now = c.now
  if c.seen < now then
    -- The clock lives at least as long as the longest window but concurrent
    -- ones remembers a spend.
    local longest = 1
    for i = 1, c.nwin do
      local u = c.ws[i]
      if u.per > longest and not u.K.momentary then
        longest = u.per
      end
    end
    local ttl = max(ceil(longest / 1000), ceil((w.ends - now) / 1000) + 1000, call('PTTL', c.KEYS[2]))
    call('SET', c.KEYS[2], now, 'PX', ttl)
    c.seen = now
  end
  -- A period's state expires a second after the period ends: set once.
  call('UNLINK', w.state)
  call('HSET', w.state, '#period', w.period, '#used', 0)
  call('PEXPIRE', w.state, ceil((w.ends - now) / 1000) + 1000)
  w.fresh_period = false
end

function Fixed.holds(w, c)
  return not w.fresh_period and call('HEXISTS', w.state, c.id) == 1
end

function Fixed.record(w, c)
  start_period(w, c)
  return call('HSETNX', w.state, c.id, c.cost) == 1
end

function Fixed.unrecord(w, c)
  call('HDEL', w.state, c.id)
end

-- Below sliding and bucket windows, the longest period first (ops.lua).
function Fixed.keeps(w)
  return w.per
end

function Fixed.admit(w, c)
  call('HINCRBY', w.state, '#used', c.cost)
  return true
end

-- At its reset.
function Fixed.frees(w, c, target)
  if w.used - w.xr <= target then
    return 0
  end
  return w.ends - c.now
end

-- A spend in a past period needs no settling.
function Fixed.settle(w, c)
  local old = not w.fresh_period and tonumber(call('HGET', w.state, c.id))
  if not old then
    return nil, false
  end
  if c.cost == 0 then
    call('HDEL', w.state, c.id)
  else
    call('HSET', w.state, c.id, c.cost)
  end
  call('HINCRBY', w.state, '#used', c.cost - old)
  return c.cost - old, false
end

-- Drift: until the upstream's reset, in "#rd" and "#rdt"; without one, as
-- units spent in this period.
function Fixed.sync(w, c, drift, reset_ms)
  start_period(w, c)
  if reset_ms then
    add_reset_drift(w, c, drift, reset_ms)
    call('HSET', w.state, '#rd', w.rd, '#rdt', w.rdt)
  else
    call('HINCRBY', w.state, '#used', drift)
    call('HINCRBY', w.state, '#drift', drift)
  end
  return drift
end

function Fixed.undrift(w)
  if not w.fresh_period then
    call('HINCRBY', w.state, '#used', -(w.drift - w.xr))
    call('HSET', w.state, '#drift', 0)
    call('HDEL', w.state, '#rd', '#rdt')
  end
  return w.drift
end

function Fixed.leases()
  return 0
end

-- It writes as it goes.
function Fixed.save()
end
