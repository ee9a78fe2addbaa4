-- quota-worker: the spend script (layout v2).
--
-- One script for the operations on a credential's quota windows, so the
-- window arithmetic exists exactly once: spend, settle, block, peek, sync.
-- Every key is one credential's and carries its `{credential}` hash tag, so
-- the script runs unchanged on Redis Cluster. The clock is Redis TIME (µs);
-- no caller clock is trusted.
--
-- KEYS
--   1  <prefix>:{<credential>}:blocked   string: blocked-until, µs (upstream 429)
--   2  <prefix>:{<credential>}:clock     string: when a fixed window last started a
--                                        period, µs (keeps time monotonic, see below)
--   then, per window, in the order of ARGV[6..]:
--     sliding, bucket (4 keys) <w>:v2:meta  string: the window's counters (msgpack)
--                              <w>:v2:log   zset: request id -> its position
--                              <w>:v2:ts    stream: one entry per spend, id "<position>-<µs>"
--                              <w>:v2:adj   zset: settled entries (see "Settle")
--     fixed (1 key)            <w>:fixed    hash: "#period", "#used", "#drift", request id -> units
--
-- ARGV
--   1  op: "spend" | "settle" | "block" | "peek" | "sync"
--   2  spend, settle: request id (unique per upstream request; reusing one only
--      retries that same spend and is never charged twice)
--      block: block duration, ms    sync: the window's number (1-based)    peek: ignored
--   3  spend: cost in units (>= 1)   settle: the request's actual cost (>= 0; 0 = refund)
--      sync: the units the upstream says are left     block, peek: ignored
--   4  spend: reserve, a whole percent 0..99: admitted only if every window
--      keeps at least that share of its units free after it ("0": none)
--   5  number of windows, n
--   6 .. 5+n  one window each:
--      "sliding:<units>:<period_ms>"
--      "bucket:<units>:<period_ms>"  (leaky bucket: burst <units>, refilled at units/period)
--      "fixed:<units>:<period_ms>:<reset_ms>:<tz>" where reset_ms is the reset's
--      offset from local midnight and <tz> is "<offset_ms>" or
--      "<offset_ms>|<utc_ms>|<offset_ms>|..." (UTC offsets and the instants they
--      start, ascending) — the time zone's rules, so DST shifts the reset.
--
-- Returns
--   spend:  {allowed, remaining, retry_after_ms, rejecting_window}
--           allowed 1/0; remaining = fewest units this spend could still take
--           across the windows (after it when allowed, as it stands when
--           rejected; a reserve counts as taken); retry_after_ms = when a spend
--           of this cost and reserve would be admitted by every window if nobody
--           else spent (0 when allowed); rejecting_window = 1-based index of the
--           rejecting window that frees last, 0 when allowed or when the
--           credential block is what frees last.
--   settle: {windows_adjusted}
--   block:  {blocked_for_ms}
--   peek:   {blocked_for_ms, used_1, remaining_1, frees_in_ms_1, drift_1, used_2, ...}
--   sync:   {drift_units_recorded}
--
-- Layout of a sliding window (every path O(log n), n = live entries):
--   Each spend gets a *position*: the window's running total of units after
--   it. The log maps request id -> position (idempotency, settle); the stream
--   holds one entry per spend, id "<position>-<time µs>", so it is ordered by
--   position and by time at once (times are recorded never earlier than the
--   window's newest, so both orders agree). "When have `need` units expired"
--   is one XRANGE from position base + need; used = total - base (- settled
--   adjustments); eviction finds the last expired entry by its stream id
--   (bisection on positions after an idle gap) and moves `base` to it without
--   reading the entries in between. Expired stream entries and log members are
--   dropped lazily, at most CLEAN log members per call, so no call holds Redis
--   for long after an idle gap.
--   Settle: a settled entry keeps its position; its change d (spent - actual)
--   is an adjustment record in `adj`, scored by the entry's *actual* position
--   (position minus all adjustments up to it) and naming its position and the
--   running adjustment total H. The first entry whose actual position reaches
--   a target is then found with one lookup in `adj` (the last record below the
--   target gives H) and one XRANGE, so retry-after stays exact after refunds.
--   A settle rewrites only the records of entries spent after it that were
--   settled before it (none when requests settle in order).
--   The meta string holds, msgpack-encoded: total, base, hbase (adjustments up
--   to base), htot (all adjustments), oldest and newest entry time, when the
--   keys expire, the adjustment count, stale entries to drop, the running drift
--   total and its value at base, whether an adjustment is negative, and for a
--   bucket its level, the level's time and the drift within the level.
--
-- A bucket window (GCRA) admits while its level plus the cost fits its units;
-- the level drains continuously at units/period. Its level is the one value
-- admission reads (in the meta string). Its log/stream/adj remember request ids
-- for max(period, 60 s), only so that retries are not charged twice and settles
-- find their spend; they never decide an admission.

local CLEAN = 1024      -- log members dropped per call at most
local SCAN = 16         -- stream entries read before bisecting
local STALE = 64        -- expired entries tolerated before a cleanup
local MAXPOS = 9007199254740992  -- 2^53: positions are exact integers below it
local BUCKET_HOLD = 60000000      -- a bucket remembers request ids at least 60 s

local call = redis.call
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local tonumber, match, format = tonumber, string.match, string.format
local pack, unpackmp = cmsgpack.pack, cmsgpack.unpack

local op = ARGV[1]
local reserve = tonumber(ARGV[4]) or 0
local nwin = tonumber(ARGV[5])

local function int(n)
  return format('%d', n)
end

local function ms(us)
  return ceil(us / 1000)
end

if reserve < 0 or reserve > 99 or reserve ~= floor(reserve) then
  return redis.error_reply('ERR quota-worker: reserve must be a whole percent from 0 to 99 (got ' .. tostring(ARGV[4]) .. ')')
end

-- Server time in µs, never earlier than the start of any period a fixed
-- window of this credential counts: a Redis clock stepped backwards (NTP,
-- failover to a skewed replica) would otherwise put `now` in an earlier
-- period than the one a fixed window counts, which would then restart from 0
-- and admit more than the limit. Sliding windows need no such guard: a clock
-- stepped back makes entries look younger, so they expire later (fewer
-- admitted, never more); new entries are recorded no earlier than the
-- window's newest, which keeps positions and times in the same order.
local windows = {}
local metas = { KEYS[1], KEYS[2] }
local maxper = 1
do
  local k = 3
  for i = 1, nwin do
    local kind, units, per, rest = match(ARGV[5 + i], '^(%a+):(%d+):(%d+):?(.*)$')
    local w = { kind = kind, i = i, units = tonumber(units), per = tonumber(per) * 1000 }
    if not kind then
      return redis.error_reply('ERR quota-worker: bad window spec ' .. tostring(ARGV[5 + i]))
    end
    -- The units a spend may take: all of them less the reserve.
    w.lim = w.units - (floor(w.units / 100) * reserve + ceil((w.units % 100) * reserve / 100))
    if w.per > maxper then
      maxper = w.per
    end
    if kind == 'sliding' or kind == 'bucket' then
      w.meta, w.log, w.ts, w.adj = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
      w.hold = w.per
      metas[#metas + 1] = w.meta
      w.mi = #metas
      k = k + 4
      if kind == 'bucket' then
        -- Levels are kept in units x quanta of `q` µs, exact below 2^53.
        w.hold = max(w.per, BUCKET_HOLD)
        w.q = 1
        while w.units * (w.per / w.q) >= MAXPOS and w.q < 1000 do
          w.q = w.q * 10
        end
        w.perq = w.per / w.q
        if w.units * w.perq >= MAXPOS then
          return redis.error_reply('ERR quota-worker: bucket window ' .. i .. ' is too large (units x period in ms must stay below 2^53)')
        end
      end
    elseif kind == 'fixed' then
      w.state = KEYS[k]
      local reset, tz = match(rest, '^(%d+):(.*)$')
      w.reset = tonumber(reset) * 1000
      -- The zone's table runs ten years ahead; it is parsed only as far as
      -- needed (see cover), usually the first few changes.
      local a, b, off = string.find(tz, '^(%-?%d+)')
      w.tz, w.tzspec, w.tzpos = { tonumber(off) * 1000 }, tz, b + 1
      k = k + 1
    else
      return redis.error_reply('ERR quota-worker: unknown window kind ' .. tostring(kind))
    end
    windows[i] = w
  end
end

local t = call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- The block, the clock and every window's counters in one call.
local got = call('MGET', unpack(metas))
local blocked_until = tonumber(got[1] or '0')
local seen = tonumber(got[2] or '0')
if seen > now then
  now = seen
end

-- ---------------------------------------------------------------- counters

local function fresh(w)
  w.total, w.B, w.hbase, w.htot, w.oldest, w.last, w.expires = 0, 0, 0, 0, 0, 0, 0
  w.nadj, w.stale, w.dtot, w.dbase, w.neg, w.L, w.lt, w.D = 0, 0, 0, 0, 0, 0, 0, 0
end

local function load(w)
  local raw = got[w.mi]
  if raw then
    w.total, w.B, w.hbase, w.htot, w.oldest, w.last, w.expires, w.nadj,
      w.stale, w.dtot, w.dbase, w.neg, w.L, w.lt, w.D = unpackmp(raw)
  else
    fresh(w)
    w.missing = true
  end
end

local function save(w)
  if w.kind == 'sliding' and w.oldest == 0 and w.nadj == 0 then
    -- Nothing live: the next spend starts from position 0.
    call('DEL', w.meta)
    return
  end
  local until_ = w.expires
  if w.kind == 'bucket' and w.L > 0 then
    until_ = max(until_, w.lt + ceil(w.L / w.units) * w.q + 1000000)
  end
  if until_ <= now then
    call('DEL', w.meta)
    return
  end
  call('SET', w.meta, pack(w.total, w.B, w.hbase, w.htot, w.oldest, w.last, w.expires, w.nadj,
    w.stale, w.dtot, w.dbase, w.neg, w.L, w.lt, w.D), 'PX', ms(until_ - now))
end

-- ---------------------------------------------------------------- fixed windows

-- Parses window w's zone table until it holds a change after `upto` (µs),
-- or all of it: tz = { offset, at, offset, at, offset, ... } in µs.
local function cover(w, upto)
  local tz = w.tz
  while w.tzpos and (#tz == 1 or tz[#tz - 1] <= upto) do
    local a, b, at, off = string.find(w.tzspec, '^|(%-?%d+)|(%-?%d+)', w.tzpos)
    if a then
      tz[#tz + 1] = tonumber(at) * 1000
      tz[#tz + 1] = tonumber(off) * 1000
      w.tzpos = b + 1
    else
      w.tzpos = nil
    end
  end
  return tz
end

-- UTC offset (µs) in effect at UTC instant `at` (µs) in window w's zone.
local function offset_at(w, at)
  local tz = cover(w, at)
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
local function wall_to_utc(w, wall, hint)
  local off = offset_at(w, wall - offset_at(w, hint))
  local utc = wall - off
  local actual = offset_at(w, utc)
  if actual == off then
    return utc
  end
  local lo, hi = min(utc, wall - actual), max(utc, wall - actual)
  local tz = cover(w, hi)
  for j = 2, #tz, 2 do
    if tz[j] > lo and tz[j] <= hi then
      return tz[j]
    end
  end
  return utc
end

-- Fixed window: the number of the calendar period holding `now`, and when it ends.
local function period_of(w)
  local wall = now + offset_at(w, now)
  local n = floor((wall - w.reset) / w.per)
  local ends = wall_to_utc(w, (n + 1) * w.per + w.reset, now)
  if ends <= now then
    ends = now + 1000
  end
  return n, ends
end

-- Reads a fixed window's period; a new period starts at 0 (its old state is
-- reset on the next write).
local function fixed_state(w, id)
  w.period, w.ends = period_of(w)
  local r = call('HMGET', w.state, '#period', '#used', '#drift', id or '#used')
  if tonumber(r[1]) ~= w.period then
    w.stale = true
    w.used, w.drift = 0, 0
    return false
  end
  w.used, w.drift = tonumber(r[2] or '0'), tonumber(r[3] or '0')
  return id ~= nil and r[4] ~= false
end

-- Remembers `now` when a fixed window starts a period (see the top): from
-- then on no `now` falls before that period's start, so none can fall in an
-- earlier period. Spends within a period need not write it. It lives at
-- least as long as the window's state.
local function remember_now(w)
  if seen < now then
    local ttl = max(ms(maxper), ms(w.ends - now) + 1000, call('PTTL', KEYS[2]))
    call('SET', KEYS[2], int(now), 'PX', ttl)
    seen = now
  end
end

-- Starts a fixed window's new period, if it needs one, before a write.
local function fixed_open(w)
  if w.stale then
    -- A period's state expires a second after the period ends: set once.
    remember_now(w)
    call('UNLINK', w.state)
    call('HSET', w.state, '#period', w.period, '#used', 0)
    call('PEXPIRE', w.state, ms(w.ends - now) + 1000)
    w.stale = false
  end
end

-- ---------------------------------------------------------------- sliding windows

local function entry(row)
  local c, tt = match(row[1], '^(%d+)%-(%d+)$')
  return tonumber(c), tonumber(tt), tonumber(row[2][2])
end

local function adj_parse(m)
  local c, h, d = match(m, '^(%d+):(%-?%d+):(%-?%d+)$')
  return tonumber(c), tonumber(h), tonumber(d)
end

local function adj_member(c, h, d)
  -- Zero-padded, so records of equal score sort by position.
  return format('%016d:%d:%d', c, h, d)
end

-- Drops expired entries from the stream and the log: at most CLEAN log
-- members per call; the rest on later calls (they are ignored meanwhile).
local function clean(w)
  call('XTRIM', w.ts, 'MINID', int(w.B + 1))
  local r = call('ZRANGE', w.log, CLEAN - 1, CLEAN - 1, 'WITHSCORES')
  if r[2] and tonumber(r[2]) <= w.B then
    call('ZREMRANGEBYRANK', w.log, 0, CLEAN - 1)
    w.stale = STALE
  else
    call('ZREMRANGEBYSCORE', w.log, '-inf', w.B)
    w.stale = 0
  end
end

-- Adjustments of entries at or below base leave `adj`; hbase becomes the
-- running total at the last of them. Records are in position order: a
-- bisection by rank finds the last one at or below base.
local function evict_adj(w)
  local first = call('ZRANGE', w.adj, 0, 0)
  if not first[1] then
    w.nadj, w.neg = 0, 0
    return
  end
  local c, h = adj_parse(first[1])
  if c > w.B then
    return
  end
  local lo, hi, hlast = 0, w.nadj, h
  while hi - lo > 1 do
    local mid = floor((lo + hi) / 2)
    local r = call('ZRANGE', w.adj, mid, mid)
    if not r[1] then
      hi = mid
    else
      c, h = adj_parse(r[1])
      if c <= w.B then
        lo, hlast = mid, h
      else
        hi = mid
      end
    end
  end
  call('ZREMRANGEBYRANK', w.adj, 0, lo)
  w.hbase, w.nadj = hlast, w.nadj - lo - 1
  if w.nadj <= 0 then
    w.nadj, w.neg = 0, 0
  end
end

-- Moves base past every entry spent at or before now - hold, without reading
-- them: the common case, nothing expired, reads nothing (`oldest` is in the
-- counters); a few expired cost one XRANGE; after an idle gap the last
-- expired entry is found by bisecting positions.
local function evict(w)
  local cutoff = now - w.hold
  if w.missing then
    -- Counters gone (a new window, or they expired): no stray entry may count.
    if call('EXISTS', w.log, w.ts, w.adj) > 0 then
      call('UNLINK', w.log, w.ts, w.adj)
    end
    w.missing = false
    return
  end
  if w.oldest == 0 or w.oldest > cutoff then
    if w.stale >= STALE then
      -- Expired entries left from an earlier call (after an idle gap).
      clean(w)
      w.dirty = true
    end
    return
  end
  w.dirty = true
  if w.last <= cutoff then
    -- All expired (an idle gap): dropped in one step, however big; UNLINK
    -- frees the memory off the main thread. Positions start again at 0.
    call('UNLINK', w.log, w.ts, w.adj)
    local L, lt, D = w.L, w.lt, w.D
    fresh(w)
    w.L, w.lt, w.D = L, lt, D
    return
  end
  local rows = call('XRANGE', w.ts, int(w.B + 1), '+', 'COUNT', SCAN)
  local bC, bD, n = w.B, w.dbase, 0
  local fT
  for j = 1, #rows do
    local c, tt, d = entry(rows[j])
    if tt > cutoff then
      fT = tt
      break
    end
    bC, bD, n = c, d, j
  end
  if not fT then
    -- More than SCAN expired. Invariant: the first entry at or after position
    -- lo is expired, the first at or after hi is live; the newest is live.
    local lo, hi = bC, w.total
    fT = w.last
    while hi - lo > 1 do
      local mid = floor((lo + hi) / 2)
      local row = call('XRANGE', w.ts, int(mid), '+', 'COUNT', 1)[1]
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
  if w.nadj > 0 then
    evict_adj(w)
  end
  w.stale = w.stale + n
  if w.stale >= STALE then
    clean(w)
  end
end

local function sliding_used(w)
  return (w.total - w.B) - (w.htot - w.hbase)
end

-- µs until the oldest `need` live units of the window have expired.
local function sliding_frees_in(w, need)
  local T = w.B - w.hbase + need
  local H = w.hbase
  if w.nadj > 0 then
    local r = call('ZREVRANGEBYSCORE', w.adj, '(' .. int(T), '-inf', 'LIMIT', 0, 1)
    if r[1] then
      local _, h = adj_parse(r[1])
      H = h
    end
  end
  local row = call('XRANGE', w.ts, int(T + H), '+', 'COUNT', 1)[1]
  local eC, eT = MAXPOS, nil
  if row then
    eC, eT = entry(row)
  end
  if w.neg > 0 then
    -- A raised cost moves later entries' actual positions up: the next
    -- adjusted entry may reach the target before the entry found above.
    local r = call('ZRANGEBYSCORE', w.adj, int(T), '+inf', 'LIMIT', 0, 1)
    if r[1] then
      local c = adj_parse(r[1])
      if c < eC then
        local row2 = call('XRANGE', w.ts, int(c), int(c), 'COUNT', 1)[1]
        if row2 then
          eC, eT = entry(row2)
        end
      end
    end
  end
  if not eT then
    return w.hold
  end
  return max(eT + w.hold - now, 1)
end

-- Appends `units` to the stream at max(now, newest) (drift: `drift` of them).
local function append(w, units, drift)
  local at = max(now, w.last)
  local C = w.total + units
  if C >= MAXPOS then
    return redis.error_reply('ERR quota-worker: window ' .. w.i .. ' ran out of positions; delete its keys')
  end
  w.dtot = w.dtot + drift
  call('XADD', w.ts, int(C) .. '-' .. int(at), 'd', int(w.dtot))
  w.total, w.last = C, at
  if w.oldest == 0 then
    w.oldest = at
  end
  if w.expires < at + w.hold then
    -- The keys must outlive this entry by a window. Their TTL is set with
    -- some slack (a quarter window, 1 s to 1 h), so most spends skip the
    -- PEXPIREs; idle keys linger at most that much longer.
    local slack = min(max(floor(w.hold / 4), 1000000), 3600000000)
    w.expires = at + w.hold + slack
    local ttl = ms(w.expires - now)
    call('PEXPIRE', w.log, ttl)
    call('PEXPIRE', w.ts, ttl)
    if w.nadj > 0 then
      call('PEXPIRE', w.adj, ttl)
    end
  end
  w.dirty = true
end

-- ---------------------------------------------------------------- buckets

-- Drains the level to now: `units` per quantum of `q` µs, whole quanta only
-- (the remainder carries over, so nothing is lost or gained).
local function drain(w)
  if w.L <= 0 then
    w.L, w.D, w.lt = 0, 0, now
    return
  end
  local e = floor((now - w.lt) / w.q)
  if e >= w.perq then
    w.L, w.D, w.lt = 0, 0, now
    return
  end
  local d = e * w.units
  w.L, w.D = max(w.L - d, 0), max(w.D - d, 0)
  w.lt = (w.L == 0) and now or (w.lt + e * w.q)
end

local function bucket_used(w)
  return ceil(w.L / w.perq)
end

-- µs until the level has drained to `target` (units x quanta).
local function bucket_frees_in(w, target)
  local excess = w.L - target
  if excess <= 0 then
    return 0
  end
  return max(w.lt + ceil(excess / w.units) * w.q - now, 1)
end

-- ---------------------------------------------------------------- state of every window

-- Brings window w to now; returns the units it counts.
local function used_of(w)
  if w.kind == 'fixed' then
    return w.used
  end
  return w.kind == 'bucket' and bucket_used(w) or sliding_used(w)
end

local function prepare(w)
  if w.kind == 'fixed' then
    fixed_state(w)
    return
  end
  load(w)
  evict(w)
  if w.kind == 'bucket' then
    drain(w)
  end
end

local function blocked_for()
  if blocked_until > now then
    return blocked_until - now
  end
  return 0
end

local function save_dirty()
  for i = 1, nwin do
    local w = windows[i]
    if w.dirty then
      save(w)
    end
  end
end

-- ---------------------------------------------------------------- block

if op == 'block' then
  local dur = tonumber(ARGV[2]) * 1000
  local until_ = now + dur
  if until_ > blocked_until then
    -- Never shortens a longer block set by another worker.
    call('SET', KEYS[1], int(until_), 'PX', ms(dur))
    blocked_until = until_
  end
  return { ms(blocked_for()) }
end

for i = 1, nwin do
  prepare(windows[i])
end

-- ---------------------------------------------------------------- peek

if op == 'peek' then
  local out = { ms(blocked_for()) }
  for i = 1, nwin do
    local w = windows[i]
    local used = used_of(w)
    local free_in, drift = 0, 0
    if w.kind == 'fixed' then
      drift = w.drift
      if used > 0 then
        free_in = w.ends - now
      end
    elseif w.kind == 'bucket' then
      drift = min(ceil(w.D / w.perq), used)
      if used > 0 then
        free_in = bucket_frees_in(w, (used - 1) * w.perq)
      end
    else
      drift = w.dtot - w.dbase
      if used > 0 then
        free_in = sliding_frees_in(w, 1)
      end
    end
    out[#out + 1] = used
    out[#out + 1] = max(w.units - used, 0)
    out[#out + 1] = ms(free_in)
    out[#out + 1] = drift
  end
  save_dirty()
  return out
end

-- ---------------------------------------------------------------- sync (drift)

if op == 'sync' then
  local w = windows[tonumber(ARGV[2]) or 0]
  local upstream_left = tonumber(ARGV[3])
  if not w or not upstream_left or upstream_left < 0 then
    save_dirty()
    return redis.error_reply('ERR quota-worker: sync takes a window number and the upstream\'s remaining units >= 0')
  end
  -- Drift only ever lowers what we admit: recorded as units spent now.
  local drift = w.units - used_of(w) - upstream_left
  if drift > 0 then
    if w.kind == 'fixed' then
      fixed_open(w)
      call('HINCRBY', w.state, '#used', drift)
      call('HINCRBY', w.state, '#drift', drift)
    elseif w.kind == 'bucket' then
      w.L = w.L + drift * w.perq
      w.D = w.D + drift * w.perq
      w.dirty = true
    else
      local err = append(w, drift, drift)
      if err then
        return err
      end
    end
  else
    drift = 0
  end
  save_dirty()
  return { drift }
end

-- ---------------------------------------------------------------- spend and settle

local id = ARGV[2]
if id == nil or id == '' or string.sub(id, 1, 1) == '#' or id == '{request_id}' then
  save_dirty()
  return redis.error_reply('ERR quota-worker: request id must be unique, non-empty, not start with "#" (got ' .. tostring(id) .. ')')
end
local cost = tonumber(ARGV[3])

-- Runs `cmd key args...` in slices of at most 4,000 values (Lua's unpack
-- stops near 8,000), keeping groups of `group` values together.
local function chunked(cmd, key, args, group)
  local step = 4000 - 4000 % group
  for from = 1, #args, step do
    call(cmd, key, unpack(args, from, min(from + step - 1, #args)))
  end
end

-- Settles a sliding or bucket window's entry: returns the change in its
-- units (actual - before), or nil when the window does not hold it.
local function settle_entry(w, actual)
  local C = tonumber(call('ZSCORE', w.log, id))
  if not C or C <= w.B then
    return nil
  end
  -- The units it was spent with: its position less its predecessor's.
  local rows = call('XREVRANGE', w.ts, int(C), '-', 'COUNT', 2)
  if not rows[1] then
    return nil
  end
  local spent = C - (rows[2] and entry(rows[2]) or w.B)
  -- Its adjustment record (if settled before), the records after it, and
  -- the running adjustment total before it. Records are in position order,
  -- so they are read from the newest back to it.
  local d_old, h_prev, later = 0, w.hbase, {}
  if w.nadj > 0 then
    local n, done = 8, false
    while not done do
      local recs = call('ZRANGE', w.adj, -n, -1)
      later = {}
      d_old = 0
      for j = #recs, 1, -1 do
        local c, h, d = adj_parse(recs[j])
        if c > C then
          later[#later + 1] = recs[j]
        elseif c == C then
          d_old, h_prev = d, h - d
          done = true
          break
        else
          h_prev = h
          done = true
          break
        end
      end
      if not done and #recs < n then
        h_prev, done = w.hbase, true
      end
      n = n * 4
    end
  end
  local before = spent - d_old
  if actual == before then
    return 0
  end
  local d_new = spent - actual
  local delta = d_new - d_old
  if d_old ~= 0 then
    call('ZREM', w.adj, adj_member(C, h_prev + d_old, d_old))
    w.nadj = w.nadj - 1
  end
  local adds = {}
  if d_new ~= 0 then
    local h = h_prev + d_new
    adds[#adds + 1] = C - h
    adds[#adds + 1] = adj_member(C, h, d_new)
    w.nadj = w.nadj + 1
    if d_new < 0 then
      w.neg = 1
    end
  end
  -- Entries spent after this one and settled before it move by delta.
  for j = 1, #later do
    local c, h, d = adj_parse(later[j])
    adds[#adds + 1] = c - (h + delta)
    adds[#adds + 1] = adj_member(c, h + delta, d)
  end
  chunked('ZREM', w.adj, later, 1)
  if #adds > 0 then
    chunked('ZADD', w.adj, adds, 2)
    call('PEXPIRE', w.adj, max(ms(w.expires - now), 1))
  end
  w.htot = w.htot + delta
  if actual == 0 then
    -- Refunded: the id is forgotten, so spending it again is a new spend.
    call('ZREM', w.log, id)
  end
  w.dirty = true
  return actual - before
end

if op == 'settle' then
  if cost == nil or cost < 0 or cost ~= floor(cost) then
    save_dirty()
    return redis.error_reply('ERR quota-worker: settle cost must be a whole number >= 0')
  end
  local adjusted = 0
  for i = 1, nwin do
    local w = windows[i]
    if w.kind == 'fixed' then
      -- A spend in a past period needs no settling.
      local old = not w.stale and tonumber(call('HGET', w.state, id))
      if old then
        if cost == 0 then
          call('HDEL', w.state, id)
        else
          call('HSET', w.state, id, cost)
        end
        call('HINCRBY', w.state, '#used', cost - old)
        adjusted = adjusted + 1
      end
    else
      local change = settle_entry(w, cost)
      if change then
        adjusted = adjusted + 1
        if w.kind == 'bucket' then
          -- As the upstream's own bucket does: the difference is given
          -- back (or charged) at once.
          w.L = max(w.L + change * w.perq, 0)
          w.D = min(w.D, w.L)
        end
      end
    end
  end
  save_dirty()
  return { adjusted }
end

if op ~= 'spend' then
  save_dirty()
  return redis.error_reply('ERR quota-worker: unknown op ' .. tostring(op))
end
if cost == nil or cost < 1 or cost ~= floor(cost) then
  save_dirty()
  return redis.error_reply('ERR quota-worker: spend cost must be a whole number >= 1')
end

local remaining = nil
local used = {}
for i = 1, nwin do
  local w = windows[i]
  if cost > w.lim then
    save_dirty()
    return redis.error_reply('ERR quota-worker: cost ' .. int(cost) .. ' can never fit window ' .. i .. ' (' .. int(w.lim) .. ' units with the reserve)')
  end
  used[i] = used_of(w)
  local left = w.lim - used[i]
  if remaining == nil or left < remaining then
    remaining = left
  end
end
remaining = max(remaining or 0, 0)

-- Is `id` already counted (a retry whose reply was lost)? Asked only of a
-- rejected spend (an admitted one finds out when it records, NX below), and
-- only of the window that remembers ids longest: every window of a spend
-- records it at once, and a refund forgets it in all of them.
local function holds()
  local best
  for i = 1, nwin do
    local w = windows[i]
    if w.kind ~= 'fixed' and (not best or best.kind == 'fixed' or w.hold > best.hold) then
      best = w
    elseif w.kind == 'fixed' and (not best or (best.kind == 'fixed' and w.per > best.per)) then
      best = w
    end
  end
  if not best then
    return false
  end
  if best.kind == 'fixed' then
    return not best.stale and call('HEXISTS', best.state, id) == 1
  end
  local C = tonumber(call('ZSCORE', best.log, id))
  return C ~= nil and C > best.B
end

-- Every window must admit the spend, so it waits for the one that frees last;
-- on a tie the credential block (0) or the lower window index names it.
local retry, rejecting = blocked_for(), 0
for i = 1, nwin do
  local w = windows[i]
  local need = used[i] + cost - w.lim
  if need > 0 then
    local wait
    if w.kind == 'fixed' then
      wait = w.ends - now
    elseif w.kind == 'bucket' then
      wait = bucket_frees_in(w, (w.lim - cost) * w.perq)
    else
      wait = sliding_frees_in(w, need)
    end
    if wait > retry then
      retry, rejecting = wait, i
    end
  end
end

if retry > 0 then
  if holds() then
    save_dirty()
    return { 1, remaining, 0, 0 }
  end
  save_dirty()
  return { 0, remaining, ms(retry), rejecting }
end

-- Record the id in every window first: a window that already holds it makes
-- this a retry of a spend that happened (its reply was lost): admitted once,
-- charged once, and the records just added are taken back.
local function undo(upto)
  for j = 1, upto do
    local w = windows[j]
    if w.kind == 'fixed' then
      call('HDEL', w.state, id)
    else
      call('ZREM', w.log, id)
    end
  end
end

for i = 1, nwin do
  local w = windows[i]
  local fresh_record
  if w.kind == 'fixed' then
    fixed_open(w)
    fresh_record = call('HSETNX', w.state, id, cost) == 1
  else
    fresh_record = call('ZADD', w.log, 'NX', w.total + cost, id) == 1
    if not fresh_record and tonumber(call('ZSCORE', w.log, id)) <= w.B then
      -- An expired spend's id, not yet cleaned: a new spend.
      call('ZADD', w.log, 'XX', w.total + cost, id)
      fresh_record = true
    end
  end
  if not fresh_record then
    undo(i - 1)
    save_dirty()
    return { 1, remaining, 0, 0 }
  end
end

remaining = nil
for i = 1, nwin do
  local w = windows[i]
  if w.kind == 'fixed' then
    call('HINCRBY', w.state, '#used', cost)
  else
    local err = append(w, cost, 0)
    if err then
      return err
    end
    if w.kind == 'bucket' then
      w.L = w.L + cost * w.perq
    end
  end
  local left = w.lim - used[i] - cost
  if remaining == nil or left < remaining then
    remaining = left
  end
end
save_dirty()
return { 1, max(remaining, 0), 0, 0 }
