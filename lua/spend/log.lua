-- The id log and stream that sliding and bucket windows keep (every path
-- O(log n), n = live entries).
--
-- Each spend gets a *position*: the window's running total of units after
-- it. The log maps request id -> position (idempotency, settle); the stream
-- holds one entry per spend, id "<position>-<time µs>", so it is ordered by
-- position and by time at once (times are recorded never earlier than the
-- window's newest, so both orders agree). "When have `need` units expired"
-- is one XRANGE from position base + need; used = total - base (- settled
-- adjustments); eviction finds the last expired entry by its stream id
-- (bisection on positions after an idle gap) and moves `base` to it without
-- reading the entries in between. Expired stream entries and log members are
-- dropped lazily, at most CLEAN log members per call, so no call holds Redis
-- for long after an idle gap.
--
-- Settle: a settled entry keeps its position; its change d (spent - actual)
-- is an adjustment record in `adj`, scored by the entry's *actual* position
-- (position minus all adjustments up to it) and naming its position and the
-- running adjustment total H. The first entry whose actual position reaches
-- a target is then found with one lookup in `adj` (the last record below the
-- target gives H) and one XRANGE, so retry-after stays exact after refunds.
-- A settle rewrites only the records of entries spent after it that were
-- settled before it (none when requests settle in order).
--
-- The meta string holds, msgpack-encoded: total, base (B), hbase
-- (adjustments up to base), htot (all adjustments), oldest and newest entry
-- time, when the keys expire, the adjustment count, stale entries to drop,
-- the running drift total and its value at base, whether an adjustment is
-- negative, for a bucket its level (L), the level's time (lt) and the drift
-- within the level (D), then the reset-bound drift and when it ends (rd,
-- rdt), the drift total forgotten (fd), and the waiting line's qt, qb, qf,
-- qe, q0 (line.lua). Counters written before reset-bound drift existed end
-- at D, and before the waiting line at fd; trailing zeros are not written
-- (a reader takes what is missing for 0). All are written by one
-- cmsgpack.pack (see core.lua).

-- Takes a sliding or bucket window's four keys.
function Log.open(w, KEYS, k)
  w.meta, w.log, w.ts, w.adj = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  return 4
end

-- A stream entry: its position, time (µs) and the drift total at it.
local function entry(row)
  local c, tt = match(row[1], '^(%d+)%-(%d+)$')
  return tonumber(c), tonumber(tt), tonumber(row[2][2])
end

-- Reads `count` entries from position `from` on: the last one spent at or
-- before `cutoff` (its position and drift total; bC, bD when none), how
-- many were, and the time of the first one after (nil: none read).
local function scan(w, from, count, cutoff, bC, bD)
  local rows = call('XRANGE', w.ts, format('%d', from), '+', 'COUNT', count)
  for j = 1, #rows do
    local row = rows[j]
    local c, tt = match(row[1], '^(%d+)%-(%d+)$')
    tt = tonumber(tt)
    if tt > cutoff then
      return bC, bD, j - 1, tt
    end
    bC, bD = tonumber(c), tonumber(row[2][2])
  end
  return bC, bD, #rows, nil
end

-- The adjustment record of rank `rank`: its entry's position and the
-- running adjustment total at it.
local function adj_at(w, rank)
  local r = call('ZRANGE', w.adj, rank, rank)[1]
  if r then
    local c, h = match(r, '^(%d+):(%-?%d+):')
    return tonumber(c), tonumber(h)
  end
end

-- Moves the base past every entry spent at or before now - hold, without
-- reading them: a few expired cost an XRANGE; after an idle gap the last
-- expired entry is found by bisecting positions.
local function evict(w, now)
  local cutoff = now - w.hold
  w.dirty = true
  if w.oldest ~= 0 and w.last <= cutoff then
    -- All expired (an idle gap): dropped in one step, however big;
    -- UNLINK frees the memory off the main thread. Positions start
    -- again at 0.
    call('UNLINK', w.log, w.ts, w.adj)
    w.total, w.B, w.hbase, w.htot, w.oldest, w.last, w.expires = 0, 0, 0, 0, 0, 0, 0
    w.nadj, w.stale, w.dtot, w.dbase, w.neg, w.fd = 0, 0, 0, 0, 0, 0
    -- No entry from before a waiting line is live any more.
    w.q0 = 0
    return
  end
  if w.oldest ~= 0 and w.oldest <= cutoff then
    -- Under steady traffic about one entry expires between two spends:
    -- two are read first. An XRANGE walks its stream node from the node's
    -- start to the first entry it returns, and each entry returned is a
    -- few Lua tables: reading SCAN at once cost a busy window 3x an admit
    -- (BENCHMARKS.md, "Issue 33").
    local bC, bD, n, fT = scan(w, w.B + 1, 2, cutoff, w.B, w.dbase)
    if not fT and n == 2 then
      local m
      bC, bD, m, fT = scan(w, bC + 1, SCAN, cutoff, bC, bD)
      n = n + m
    end
    if not fT then
      -- More than SCAN expired. Invariant: the first entry at or after
      -- position lo is expired, the first at or after hi is live (the
      -- newest is live).
      local lo, hi = bC, w.total
      fT = w.last
      while hi - lo > 1 do
        local mid = floor((lo + hi) / 2)
        local row = call('XRANGE', w.ts, format('%d', mid), '+', 'COUNT', 1)[1]
        if not row then
          break
        end
        local c, tt, d = entry(row)
        if tt > cutoff then
          hi, fT = mid, tt
        else
          lo, bC, bD = c, c, d
        end
      end
      n = STALE
    end
    w.B, w.dbase, w.oldest = bC, bD, fT
    w.stale = w.stale + n
    if w.nadj > 0 then
      -- Adjustment records at or below base leave `adj`; hbase becomes the
      -- running total at the last of them. They are in position order: a
      -- bisection by rank finds the last one.
      local c, h = adj_at(w, 0)
      if not c then
        w.nadj, w.neg = 0, 0
      elseif c <= w.B then
        local lo, hi, hlast = 0, w.nadj, h
        while hi - lo > 1 do
          local mid = floor((lo + hi) / 2)
          c, h = adj_at(w, mid)
          if c and c <= w.B then
            lo, hlast = mid, h
          else
            hi = mid
          end
        end
        call('ZREMRANGEBYRANK', w.adj, 0, lo)
        w.hbase, w.nadj = hlast, w.nadj - lo - 1
        if w.nadj <= 0 then
          w.nadj, w.neg = 0, 0
        end
      end
    end
  end
  if w.stale >= STALE then
    call('XTRIM', w.ts, 'MINID', w.B + 1)
    local r = call('ZRANGE', w.log, CLEAN - 1, CLEAN - 1, 'WITHSCORES')
    if r[2] and tonumber(r[2]) <= w.B then
      call('ZREMRANGEBYRANK', w.log, 0, CLEAN - 1)
      w.stale = STALE
    else
      call('ZREMRANGEBYSCORE', w.log, '-inf', w.B)
      w.stale = 0
    end
  end
end

-- Reads the counters (c.got; none: a window with nothing live) and evicts
-- what expired. `hold`: how long it remembers a spend (µs).
function Log.load(w, c)
  local raw = c.got[w.mi]
  w.raw = raw or false
  if raw then
    -- Counters from before reset-bound drift end at D, from before the
    -- waiting line at fd: what is missing is 0.
    local total, B, hbase, htot, oldest, last, expires, nadj, stale, dtot, dbase, neg, L, lt, D,
      rd, rdt, fd, qt, qb, qf, qe, q0 = unpackmp(raw)
    w.total, w.B, w.hbase, w.htot, w.oldest, w.last, w.expires, w.nadj, w.stale, w.dtot, w.dbase,
      w.neg, w.L, w.lt, w.D, w.rd, w.rdt, w.fd, w.qt, w.qb, w.qf, w.qe, w.q0 =
      total, B, hbase, htot, oldest, last, expires, nadj, stale, dtot, dbase, neg, L, lt, D,
      rd or 0, rdt or 0, fd or 0, qt or 0, qb or 0, qf or 0, qe or 0, q0 or 0
    local now = c.now
    if (oldest ~= 0 and oldest <= now - w.hold) or stale >= STALE then
      evict(w, now)
    end
    return
  end
  w.total, w.B, w.hbase, w.htot, w.oldest, w.last, w.expires, w.nadj = 0, 0, 0, 0, 0, 0, 0, 0
  w.stale, w.dtot, w.dbase, w.neg, w.L, w.lt, w.D = 0, 0, 0, 0, 0, 0, 0
  w.rd, w.rdt, w.fd, w.qt, w.qb, w.qf, w.qe, w.q0 = 0, 0, 0, 0, 0, 0, 0, 0
  if c.op ~= 'peek' and call('EXISTS', w.log, w.ts, w.adj) > 0 then
    -- Counters gone with entries left (they expired apart): no stray
    -- entry may count.
    call('UNLINK', w.log, w.ts, w.adj)
  end
end

-- Whether it holds request c.id, spent and not expired.
function Log.holds(w, c)
  local C = tonumber(call('ZSCORE', w.log, c.id))
  return C ~= nil and C > w.B
end

-- Records c.id at its position to be; false when it holds it already.
function Log.record(w, c)
  local C = format('%d', w.total + c.cost)
  if call('ZADD', w.log, 'NX', C, c.id) == 1 then
    return true
  end
  if tonumber(call('ZSCORE', w.log, c.id)) <= w.B then
    -- An expired spend's id, not yet dropped: a new spend.
    call('ZADD', w.log, 'XX', C, c.id)
    return true
  end
  return false
end

function Log.unrecord(w, c)
  call('ZREM', w.log, c.id)
end

-- Appends `units` to the stream at max(now, newest), `drift` of them
-- drift. False when the window's positions ran out (2^53 units).
function Log.append(w, c, units, drift)
  local now, at = c.now, w.last
  if now > at then
    at = now
  end
  local C = w.total + units
  if C >= MAXPOS then
    return false
  end
  local d = w.dtot
  if drift ~= 0 then
    d = d + drift
    w.dtot = d
  end
  -- The drift total as text: "0" on almost every spend (a number would be
  -- formatted by Redis with "%.17g" on every call).
  call('XADD', w.ts, format('%d-%d', C, at), 'd', d == 0 and '0' or format('%d', d))
  w.total, w.last, w.dirty = C, at, true
  if w.oldest == 0 then
    w.oldest = at
  end
  local hold = w.hold
  if w.expires < at + hold then
    -- The keys must outlive this entry by a window. Their TTL is set with
    -- some slack (a quarter window, 1 s to 1 h), so most spends skip the
    -- PEXPIREs; idle keys linger at most that much longer.
    w.expires = at + hold + min(max(floor(hold / 4), 1000000), 3600000000)
    w.ttl = true
    local ttl = ceil((w.expires - now) / 1000)
    call('PEXPIRE', w.log, ttl)
    call('PEXPIRE', w.ts, ttl)
    if w.nadj > 0 then
      call('PEXPIRE', w.adj, ttl)
    end
  end
  return true
end

-- µs until the stream's own count (sused) is at most `target`: the first
-- entry whose actual position (position less the adjustments up to it)
-- reaches base + need. Drift forgiven by undrift still has its entries, so
-- the wait is for them too (never shorter than exact).
function Log.frees(w, c, target)
  local now = c.now
  local T = w.B - w.hbase + w.sused - target
  local H = w.hbase
  if w.nadj > 0 then
    local r = call('ZREVRANGEBYSCORE', w.adj, format('(%d', T), '-inf', 'LIMIT', 0, 1)[1]
    if r then
      H = tonumber(match(r, '^%d+:(%-?%d+):'))
    end
  end
  local eC, eT = MAXPOS, nil
  local row = call('XRANGE', w.ts, format('%d', T + H), '+', 'COUNT', 1)[1]
  if row then
    local cc, tt = match(row[1], '^(%d+)%-(%d+)$')
    eC, eT = tonumber(cc), tonumber(tt)
  end
  if w.neg > 0 then
    -- A raised cost moves later entries' actual positions up: the next
    -- adjusted entry may reach the target before the entry found above.
    local r = call('ZRANGEBYSCORE', w.adj, T, '+inf', 'LIMIT', 0, 1)[1]
    local cc = r and tonumber(match(r, '^(%d+):'))
    if cc and cc < eC then
      local row2 = call('XRANGE', w.ts, cc, cc, 'COUNT', 1)[1]
      if row2 then
        eT = tonumber(match(row2[1], '%-(%d+)$'))
      end
    end
  end
  if not eT then
    return w.hold
  end
  return max(eT + w.hold - now, 1)
end

-- Writes the counters back, expiring with the keys: at `expires`, and
-- later while a bucket's level, reset-bound drift or a waiting line lasts.
function Log.save(w, c)
  if not w.dirty then
    return
  end
  local now = c.now
  local until_, moved = w.expires, w.ttl
  local L, rd, qe = w.L, w.rd, w.qe
  if L > 0 then
    -- Until the level has drained (1 s slack): usually well before
    -- `expires` (a bucket's keys outlive each entry by at least 60 s).
    local drained = w.lt + ceil(L / w.units) * w.q + 1000000
    if drained > until_ then
      until_, moved = drained, true
    end
  end
  if rd > 0 and w.rdt > until_ then
    until_, moved = w.rdt, true
  end
  if qe > until_ then
    until_, moved = qe, true
  end
  if until_ <= now or (w.oldest == 0 and w.nadj == 0 and L <= 0 and rd <= 0 and qe <= now) then
    -- Nothing live: the next spend starts from position 0.
    call('DEL', w.meta)
    return
  end
  local packed
  if qe ~= 0 or w.qt ~= 0 or w.qb ~= 0 or w.qf ~= 0 or w.q0 ~= 0 then
    packed = packmp(w.total, w.B, w.hbase, w.htot, w.oldest, w.last, w.expires, w.nadj, w.stale,
      w.dtot, w.dbase, w.neg, L, w.lt, w.D, rd, w.rdt, w.fd, w.qt, w.qb, w.qf, qe, w.q0)
  elseif rd ~= 0 or w.rdt ~= 0 or w.fd ~= 0 then
    packed = packmp(w.total, w.B, w.hbase, w.htot, w.oldest, w.last, w.expires, w.nadj, w.stale,
      w.dtot, w.dbase, w.neg, L, w.lt, w.D, rd, w.rdt, w.fd)
  else
    packed = packmp(w.total, w.B, w.hbase, w.htot, w.oldest, w.last, w.expires, w.nadj, w.stale,
      w.dtot, w.dbase, w.neg, L, w.lt, w.D)
  end
  if moved or not w.raw then
    call('SET', w.meta, packed, 'PX', ceil((until_ - now) / 1000))
  else
    -- Unmoved, the counters keep the TTL they have (never shorter than
    -- `until_`), which saves formatting a number on most spends.
    call('SET', w.meta, packed, 'KEEPTTL')
  end
end
