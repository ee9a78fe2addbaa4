-- A bucket window (leaky bucket, GCRA): admits while its level plus the
-- cost fits its units; the level drains continuously at units/period. Its
-- level is the one value admission reads (L in the counters, in units x
-- quanta of `q` µs, exact below 2^53; lt its time, D the drift within it).
-- Its id log and stream (log.lua) remember request ids for max(period,
-- 60 s), only so that retries are not charged twice and settles find their
-- spend; they never decide an admission.

function Bucket.proto(units, per)
  local q = 1
  while units * (per / q) >= MAXPOS and q < 1000 do
    q = q * 10
  end
  if units * (per / q) >= MAXPOS then
    return nil, 'is too large (units x period in ms must stay below 2^53)'
  end
  return { units = units, per = per, hold = max(per, 60000000), q = q, perq = per / q }
end

Bucket.open = Log.open

function Bucket.load(w, c)
  Log.load(w, c)
  -- The level drains `units` per quantum of `q` µs, whole quanta only (the
  -- remainder carries over, so nothing is lost or gained).
  local now = c.now
  local e = floor((now - w.lt) / w.q)
  if w.L <= 0 or e >= w.perq then
    w.L, w.D, w.lt = 0, 0, now
  else
    local d = e * w.units
    w.L, w.D = max(w.L - d, 0), max(w.D - d, 0)
    w.lt = (w.L == 0) and now or (w.lt + e * w.q)
  end
  w.used = ceil(w.L / w.perq)
  w.drift = min(ceil(w.D / w.perq), w.used)
  if w.rd ~= 0 then
    count_reset_drift(w, now, true)
  end
end

Bucket.holds, Bucket.record, Bucket.unrecord = Log.holds, Log.record, Log.unrecord
Bucket.keeps = Sliding.keeps

function Bucket.admit(w, c)
  if not Log.append(w, c, c.cost, 0) then
    return false
  end
  w.L = w.L + c.cost * w.perq
  return true
end

-- When the level has drained to `target`.
function Bucket.frees(w, c, target)
  if w.used - w.xr <= target then
    return 0
  end
  local excess = w.L - target * w.perq
  if excess <= 0 then
    return 0
  end
  return max(w.lt + ceil(excess / w.units) * w.q - c.now, 1)
end

-- As the upstream's own bucket does: the difference is given back (or
-- charged) at once.
function Bucket.settle(w, c)
  local change = Log.settle(w, c)
  if change then
    w.L = max(w.L + change * w.perq, 0)
    w.D = min(w.D, w.L)
    w.dirty = true
  end
  return change, false
end

-- Drift: until the upstream's reset, beside the level; without one, in it.
function Bucket.sync(w, c, drift, reset_ms)
  if reset_ms then
    add_reset_drift(w, c, drift, reset_ms)
  else
    w.L = w.L + drift * w.perq
    w.D = w.D + drift * w.perq
  end
  w.dirty = true
  return drift
end

-- The level's drift share leaves it.
function Bucket.undrift(w)
  local forgotten = w.drift
  w.L, w.D = max(w.L - w.D, 0), 0
  w.rd, w.rdt, w.dirty = 0, 0, true
  return forgotten
end

Bucket.leases = Sliding.leases
Bucket.save = Log.save
