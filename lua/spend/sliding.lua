-- A sliding window: at most `units` spent in any trailing `per`. Its state
-- is the id log and stream (log.lua): used = the stream's live units, less
-- settled adjustments and forgiven drift, plus reset-bound drift.

function Sliding.proto(units, per)
  return { units = units, per = per, hold = per }
end

Sliding.open = Log.open

function Sliding.load(w, c)
  Log.load(w, c)
  -- Drift forgiven (undrift) counts no more while its entries live: the
  -- drift recorded between base and the mark.
  local dbase = w.dbase
  local forgiven = w.fd - dbase
  if forgiven < 0 then
    forgiven = 0
  end
  local sused = (w.total - w.B) - (w.htot - w.hbase)
  w.sused, w.used, w.drift = sused, sused - forgiven, w.dtot - dbase - forgiven
  if w.rd ~= 0 then
    count_reset_drift(w, c.now, true)
  end
end

Sliding.holds, Sliding.record, Sliding.unrecord = Log.holds, Log.record, Log.unrecord

-- The window a spend's id is asked of when it is refused (ops.lua): the one
-- that remembers ids longest.
function Sliding.keeps(w)
  return 1e15 + w.hold
end

function Sliding.admit(w, c)
  return Log.append(w, c, c.cost, 0)
end

function Sliding.frees(w, c, target)
  if w.used - w.xr <= target then
    return 0
  end
  return Log.frees(w, c, target)
end

function Sliding.settle(w, c)
  return Log.settle(w, c), false
end

-- Drift: until the upstream's reset, beside the counters; without one, an
-- entry of its own, spent now (nil: the positions ran out).
function Sliding.sync(w, c, drift, reset_ms)
  if reset_ms then
    add_reset_drift(w, c, drift, reset_ms)
    w.dirty = true
    return drift
  end
  return Log.append(w, c, drift, drift) and drift or nil
end

-- The drift entries recorded so far count no more (see "Drift").
function Sliding.undrift(w)
  local forgotten = w.drift
  w.fd = w.dtot
  w.rd, w.rdt, w.dirty = 0, 0, true
  return forgotten
end

function Sliding.leases()
  return 0
end

Sliding.save = Log.save
