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
--     fixed (1 key)            <w>:fixed    hash: "#period", "#used", "#drift", "#rd", "#rdt",
--                                                request id -> units
--     concurrent (3 keys)      <w>:meta     string: units in flight, earliest lease bound, expiry (msgpack)
--                              <w>:lease    zset: request id -> when its lease expires, µs
--                              <w>:held     hash: request id -> its units
--   then, optional, the spend history's rings (ARGV[6+n] says how many):
--     <prefix>:{<credential>}:spent:<scope>  string: units per 5-minute slot, 24 h
--   then, optional (a spend naming a ticket, ARGV[10+n]), one per window but
--   concurrent ones, in window order (see "Waiting line"):
--     sliding, bucket  <w>:v2:line  zset: the window's waiting line
--     fixed            <w>:line     hash: "p:<period>" -> units promised in
--                                   it, "t:<ticket>" -> the waiter's period
--
-- ARGV
--   1  op: "spend" | "settle" | "block" | "peek" | "sync" | "undrift"
--   2  spend, settle: request id (unique per upstream request; reusing one only
--      retries that same spend and is never charged twice)
--      block: block duration, ms    peek, undrift: ignored
--      sync: the window's number (1-based), or "<number>:<ms>" when the upstream
--      said when its count resets: in <ms> from now; the drift then recorded
--      stops counting at that time (see "Drift")
--   3  spend: cost in units (>= 1)   settle: the request's actual cost (>= 0; 0 = refund)
--      sync: the units the upstream says are left     block, peek: ignored
--   4  spend: reserve, a whole percent 0..99: admitted only if every window
--      keeps at least that share of its units free after it ("0": none)
--   5  number of windows, n
--   6 .. 5+n  one window each:
--      "sliding:<units>:<period_ms>"
--      "bucket:<units>:<period_ms>"  (leaky bucket: burst <units>, refilled at units/period)
--      "concurrent:<units>:<lease_ms>"  (at most <units> in flight; a spend's lease
--      ends at its settle, or by itself <lease_ms> after the spend)
--      "fixed:<units>:<period_ms>:<reset_ms>:<tz>" where reset_ms is the reset's
--      offset from local midnight and <tz> is "<offset_ms>" or
--      "<offset_ms>|<utc_ms>|<offset_ms>|..." (UTC offsets and the instants they
--      start, ascending) — the time zone's rules, so DST shifts the reset.
--   optional, the spend history the status page charts (absent: none kept):
--   6+n  number of rings, m (their keys follow the windows' keys)
--   7+n  slot length, ms (300000)     8+n  slots kept (288)     9+n  ring TTL, ms
--      An admitted spend adds its cost to the current slot of each ring, a
--      settle the change it made (negative for a refund); nothing else writes.
--   optional, a spend's waiting line (absent: the script keeps none, as
--   before it had one; only after the history's four arguments):
--   10+n ticket: who this spend is, should it be refused and come back
--      (unique per waiting task, e.g. "<job>:<tick>:<item>"; never a
--      secret); "" for a spend that respects the line but will not come back
--
-- Returns
--   spend:  {allowed, remaining, retry_after_ms, rejecting_window}
--           allowed 1/0; remaining = fewest units this spend could still take
--           across the windows (after it when allowed, as it stands when
--           rejected; a reserve counts as taken); retry_after_ms = when a spend
--           of this cost and reserve would be admitted by every window if nobody
--           else spent (0 when allowed); rejecting_window = 1-based index of the
--           rejecting window that frees last, 0 when allowed or when the
--           credential block is what frees last. A concurrent window that
--           refuses waits until its earliest lease expires, at most 1,000 ms.
--   settle: {windows_adjusted}   (a concurrent window that held the spend's
--           lease counts: the settle, whatever its cost, ended the lease)
--   block:  {blocked_for_ms}
--   peek:   {blocked_for_ms, used_1, remaining_1, frees_in_ms_1, drift_1, leases_1, used_2, ...}
--           (concurrent: used = units in flight, frees_in = until the earliest
--           lease expires, leases = leases held; other kinds: leases 0)
--   sync:   {drift_units_recorded}
--   undrift: {drift_forgotten_1, drift_forgotten_2, ...}: every window's drift
--           is forgotten (an operator who knows better than the last answer)
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
--   total and its value at base, whether an adjustment is negative, for a
--   bucket its level, the level's time and the drift within the level, then
--   the reset-bound drift and when it ends, the drift total forgotten, and
--   the waiting line's qt, qb, qf, qe, q0 (see "Waiting line").
--
-- Drift (sync): units the upstream says it counted and the window did not,
-- recorded so that the window admits no more than the upstream has left.
-- From an answer without a reset time it is recorded as units spent now
-- (a sliding window's entry, a bucket's level, a fixed window's #used) and
-- leaves as they do. From an answer that said when its count resets, it is
-- one number beside the window's own state (rd) with the time it ends
-- (rdt): it counts, O(1), until then, and from then the window admits
-- exactly what its own spends allow; a later such sync adds to it and moves
-- its end to the newer reset. A refused spend's retry-after accounts for it
-- ending. undrift forgets both kinds: rd at once; in a sliding window the
-- drift entries recorded so far by a mark (the drift total at that moment:
-- entries up to it no longer count as they leave, O(1)), in a bucket or a
-- fixed window its drift share.
--
-- Waiting line (every kind but concurrent; a spend that names a ticket): a refused
-- spend that will come back is promised the moment its units leave,
-- counting the units promised to the spends refused before it, so refused
-- spends come back in turn instead of all at once (docs/spend.md, "Waiting
-- line"). The line is a sequence of units: the window's live entries spent
-- before the line began (positions up to q0), then the line's own entries,
-- positions qb+1 .. qt, each a member "<position>:<moment µs>" scored by its
-- position: a promise (the moment the spend was told) or a spend admitted
-- while the line waited (when it was spent). Each leaves a window after its
-- moment, as entries do. A refused spend of cost c is promised the moment
-- the n-th unit of the sequence leaves, n = its units + c - lim, plus a
-- slack (a waiter woken late must not find the unit it waits for still
-- held by the one before it, woken late too), and goes at the end; its
-- ticket is a member "t:<ticket>" scored by minus its entry's position. A
-- ticket come back is admitted if the window admits it (early: told its
-- turn again; late and full: the next unit, keeping its place); any other
-- spend also needs its turn to be now, and once admitted takes its place
-- in the line. The line never admits: the window's own count decides, the
-- line only refuses and moves retry-after moments. The meta string holds
-- qt, qb, q0, qf (when the first entry after qb leaves: until then nothing
-- is read to move qb) and qe (when the last leaves: the line is over).
-- A bucket's line is a level of its own: qt is the level the line has
-- promised (units x quanta) at time qf, qe when it has drained; a refused
-- spend is promised the moment that level (at least the bucket's own) has
-- drained enough for its cost, which is then added to it; tickets are
-- scored by their turn. A fixed window's line counts the units promised
-- to each future period: a refused spend is promised the first period
-- whose unpromised units fit it (from its own, when another window makes
-- it wait past this one) and waits for its start; a spend in the current
-- period leaves its unspent promised units free (for a grace after the
-- period starts: a waiter that never comes back holds them no longer).

-- A concurrent window admits while its units in flight plus the cost fit its
-- units. A spend takes a lease of its cost (HSETNX held, ZADD lease with its
-- expiry); the settle of its request id, whatever the cost, returns it (the
-- answer was read, or nothing was sent). A lease not returned (its process
-- died) lapses at its expiry: the meta string keeps a lower bound of the
-- earliest expiry, and only a call at or past it reads the zset, dropping at
-- most LAPSE expired leases (the first ones by score: one ZRANGEBYSCORE, one
-- HMGET, one ZREMRANGEBYRANK), so admit, reject and lapse are O(log n). Its
-- keys outlive the latest lease (a quarter lease of slack) and go when nothing
-- is in flight.
--
-- A bucket window (GCRA) admits while its level plus the cost fits its units;
-- the level drains continuously at units/period. Its level is the one value
-- admission reads (in the meta string). Its log/stream/adj remember request ids
-- for max(period, 60 s), only so that retries are not charged twice and settles
-- find their spend; they never decide an admission.

-- The whole script is one function, spend_main(KEYS, ARGV), called by the
-- last line with the call's own KEYS and ARGV. A script that must spend in
-- the same call as work of its own (a queue claim, say) is this text without
-- that last line (`quota::library()` in Rust) followed by its own code, which
-- calls spend_main with its slice of keys and arguments laid out as above and
-- acts on the reply (e.g. claims only when the spend was admitted).

local function spend_main(KEYS, ARGV)
  -- Performance notes (Redis's Lua 5.1 runs this whole chunk on every call,
  -- and what a call allocates it pays for again in garbage collection; see
  -- the benchmark's "anatomy" section): the spend path is written inline
  -- with two small functions that every call needs (save_all, append), which
  -- take what they use as arguments and reach the libraries as globals, so
  -- creating them allocates no upvalues; every other helper is a closure
  -- created only in the branch that needs it. Numbers that go to redis.call
  -- on every spend are formatted as integers here (redis.call prints a
  -- number with "%.17g", slower); the rest go as numbers (Redis prints
  -- integers below 2^53 exactly).

  local call = redis.call
  local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
  local tonumber, match, format = tonumber, string.match, string.format
  local pack, unpackmp = cmsgpack.pack, cmsgpack.unpack

  local CLEAN = 1024      -- expired log members dropped per call at most
  local SCAN = 16         -- stream entries read before bisecting
  local STALE = 64        -- expired entries tolerated before a cleanup
  local LAPSE = 128       -- expired leases dropped per concurrent window and call at most
  local SOON = 1000000    -- a concurrent window's refusal waits at most this (µs)
  local MAXPOS = 9007199254740992  -- 2^53: positions are exact integers below it

  local op = ARGV[1]
  local reserve = tonumber(ARGV[4]) or 0
  local nwin = tonumber(ARGV[5]) or 0

  if reserve < 0 or reserve > 99 or reserve ~= floor(reserve) then
    return redis.error_reply('ERR quota-worker: reserve must be a whole percent from 0 to 99 (got ' .. tostring(ARGV[4]) .. ')')
  end

  local windows = {}
  local metas = { KEYS[1], KEYS[2] }
  local maxper, fixed = 1, false
  local k = 3  -- the next window's first key; after the windows, the first ring's
  do
    for i = 1, nwin do
      local kind, units, per, rest = match(ARGV[5 + i], '^(%a+):(%d+):(%d+):?(.*)$')
      if not kind then
        return redis.error_reply('ERR quota-worker: bad window spec ' .. tostring(ARGV[5 + i]))
      end
      units, per = tonumber(units), tonumber(per) * 1000
      -- Every field up front: a table that grows field by field rehashes.
      local w = {
        kind = kind, i = i, units = units, per = per, hold = per, used = 0, drift = 0,
        -- The units a spend may take: all of them less the reserve.
        lim = units - (floor(units / 100) * reserve + ceil(units % 100 * reserve / 100)),
        meta = false, log = false, ts = false, adj = false, mi = 0, dirty = false, ttl = false,
        total = 0, B = 0, hbase = 0, htot = 0, oldest = 0, last = 0, expires = 0, nadj = 0,
        stale = 0, dtot = 0, dbase = 0, neg = 0, L = 0, lt = 0, D = 0, q = 1, perq = 1,
        lease = false, held = false, low = 0,
        rd = 0, rdt = 0, fd = 0, xr = 0, sused = 0,
        line = false, owed = 0, qt = 0, qb = 0, qf = 0, qe = 0, q0 = 0, mine = false, turn = 0, slack = false,
      }
      if per > maxper and kind ~= 'concurrent' then
        maxper = per
      end
      if kind == 'concurrent' then
        -- `per` is the lease's length; the counters come with the MGET below.
        w.meta, w.lease, w.held = KEYS[k], KEYS[k + 1], KEYS[k + 2]
        metas[#metas + 1] = w.meta
        w.mi = #metas
        k = k + 3
        if per < 1000 then
          return redis.error_reply('ERR quota-worker: concurrent window ' .. i .. ' needs a lease of at least 1 ms')
        end
      elseif kind == 'sliding' or kind == 'bucket' then
        w.meta, w.log, w.ts, w.adj = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
        metas[#metas + 1] = w.meta
        w.mi = #metas
        k = k + 4
        if kind == 'bucket' then
          -- A bucket remembers request ids at least 60 s; its level is kept in
          -- units x quanta of `q` µs, exact below 2^53.
          w.hold = max(per, 60000000)
          while units * (per / w.q) >= MAXPOS and w.q < 1000 do
            w.q = w.q * 10
          end
          w.perq = per / w.q
          if units * w.perq >= MAXPOS then
            return redis.error_reply('ERR quota-worker: bucket window ' .. i .. ' is too large (units x period in ms must stay below 2^53)')
          end
        end
      elseif kind == 'fixed' then
        w.state = KEYS[k]
        local reset, tz = match(rest, '^(%d+):(.*)$')
        w.reset = tonumber(reset) * 1000
        -- The zone's table runs ten years ahead; it is parsed only as far as
        -- needed (see cover), usually the first few changes.
        local _, b, off = string.find(tz, '^(%-?%d+)')
        w.tz, w.tzspec, w.tzpos = { tonumber(off) * 1000 }, tz, b + 1
        fixed = true
        k = k + 1
      else
        return redis.error_reply('ERR quota-worker: unknown window kind ' .. tostring(kind))
      end
      windows[i] = w
    end
  end

  -- Server time in µs, never earlier than the start of any period a fixed
  -- window of this credential counts: a Redis clock stepped backwards (NTP,
  -- failover to a skewed replica) would otherwise put `now` in an earlier
  -- period than the one a fixed window counts, which would then restart from 0
  -- and admit more than the limit. Sliding windows need no such guard: a clock
  -- stepped back makes entries look younger, so they expire later (fewer
  -- admitted, never more); new entries are recorded no earlier than the
  -- window's newest, which keeps positions and times in the same order.
  local t = call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  -- The block, the clock and every sliding and bucket window's counters, in one call.
  local got = call('MGET', unpack(metas))
  local blocked_until = tonumber(got[1] or '0')
  local seen = tonumber(got[2] or '0')
  if seen > now then
    now = seen
  end

  if op == 'block' then
    -- A whole number of ms below 2^53 (the largest integer a Lua number holds
    -- exactly; a longer text rounds), refused before anything is written.
    local ms = tonumber(ARGV[2])
    if ms == nil or ms < 1 or ms >= MAXPOS or ms ~= floor(ms) then
      return redis.error_reply('ERR quota-worker: block duration must be a whole number of ms from 1 to 2^53 - 1 (got ' .. tostring(ARGV[2]) .. ')')
    end
    local dur = ms * 1000
    local until_ = now + dur
    if until_ > blocked_until then
      -- Never shortens a longer block set by another worker.
      call('SET', KEYS[1], until_, 'PX', ceil(dur / 1000))
      blocked_until = until_
    end
    return { ceil(max(blocked_until - now, 0) / 1000) }
  end

  -- ---------------------------------------------------------------- fixed windows

  -- Calendar arithmetic, built only when the credential has a fixed window.
  local F
  if fixed then
    F = {}

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

    -- Reads a fixed window's period (the number of the calendar period holding
    -- `now`, and when it ends) and usage; a new period starts at 0 (its old
    -- state is reset on the next write).
    function F.state(w)
      local wall = now + offset_at(w, now)
      w.period = floor((wall - w.reset) / w.per)
      w.ends = wall_to_utc(w, (w.period + 1) * w.per + w.reset, now)
      if w.ends <= now then
        w.ends = now + 1000
      end
      local r = call('HMGET', w.state, '#period', '#used', '#drift', '#rd', '#rdt')
      if tonumber(r[1]) ~= w.period then
        w.fresh_period = true
        w.used, w.drift = 0, 0
      else
        w.used, w.drift = tonumber(r[2] or '0'), tonumber(r[3] or '0')
        w.rd, w.rdt = tonumber(r[4] or '0'), tonumber(r[5] or '0')
      end
    end

    -- The number of the period holding UTC instant `t` (µs), and when
    -- period `q` starts (µs): for a waiting line's promises.
    function F.period_of(w, t)
      return floor((t + offset_at(w, t) - w.reset) / w.per)
    end
    function F.start(w, q)
      return wall_to_utc(w, q * w.per + w.reset, now)
    end

    -- Starts a fixed window's new period, if it needs one, before a write.
    -- Remembers `now` when it does (see the top): from then on no `now` falls
    -- before that period's start, so none can fall in an earlier period.
    -- Spends within a period need not write it. It lives at least as long as
    -- the window's state.
    function F.open(w)
      if w.fresh_period then
        if seen < now then
          local ttl = max(ceil(maxper / 1000), ceil((w.ends - now) / 1000) + 1000, call('PTTL', KEYS[2]))
          call('SET', KEYS[2], now, 'PX', ttl)
          seen = now
        end
        -- A period's state expires a second after the period ends: set once.
        call('UNLINK', w.state)
        call('HSET', w.state, '#period', w.period, '#used', 0)
        call('PEXPIRE', w.state, ceil((w.ends - now) / 1000) + 1000)
        w.fresh_period = false
      end
    end
  end

  -- ---------------------------------------------------------------- every window, brought to now

  -- Moves a sliding window's (or a bucket's id log's) base past every entry
  -- spent at or before now - hold, without reading them: a few expired cost
  -- one XRANGE; after an idle gap the last expired entry is found by bisecting
  -- positions. Expired stream entries and log members are dropped lazily, at
  -- most CLEAN log members per call, so no call holds Redis for long. Made
  -- only when some window needs it.
  local evict

  -- Drops a concurrent window's leases that expired (their process died
  -- before it settled them), at most LAPSE a call: the first by score, so one
  -- ZRANGEBYSCORE finds them and one ZREMRANGEBYRANK drops them; their units
  -- leave the count. `low` becomes the earliest lease left (past `now` again
  -- unless more than LAPSE had expired: the next call drops more).
  local function lapse(w)
    local ids = call('ZRANGEBYSCORE', w.lease, '-inf', format('%d', now), 'LIMIT', 0, LAPSE)
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

  for i = 1, nwin do
    local w = windows[i]
    if w.kind == 'fixed' then
      F.state(w)
    elseif w.kind == 'concurrent' then
      local raw = got[w.mi]
      if raw then
        w.used, w.low, w.expires = unpackmp(raw)
        if w.low ~= 0 and w.low <= now then
          lapse(w)
        end
      elseif op ~= 'peek' and call('EXISTS', w.lease, w.held) > 0 then
        -- Counters gone with leases left (they expired apart): no stray
        -- lease may count.
        call('UNLINK', w.lease, w.held)
      end
    else
      local raw = got[w.mi]
      if raw then
        local rd, rdt, fd, qt, qb, qf, qe, q0
        w.total, w.B, w.hbase, w.htot, w.oldest, w.last, w.expires, w.nadj,
          w.stale, w.dtot, w.dbase, w.neg, w.L, w.lt, w.D, rd, rdt, fd,
          qt, qb, qf, qe, q0 = unpackmp(raw)
        -- Counters written before reset-bound drift existed end at D, and
        -- before the waiting line (or by a daemon that predates it) at fd.
        w.rd, w.rdt, w.fd = rd or 0, rdt or 0, fd or 0
        w.qt, w.qb, w.qf, w.qe, w.q0 = qt or 0, qb or 0, qf or 0, qe or 0, q0 or 0
        if (w.oldest ~= 0 and w.oldest <= now - w.hold) or w.stale >= STALE then
          evict = evict or function(w)
            local cutoff = now - w.hold
            local function entry(row)
              local c, tt = match(row[1], '^(%d+)%-(%d+)$')
              return tonumber(c), tonumber(tt), tonumber(row[2][2])
            end
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
              local rows = call('XRANGE', w.ts, w.B + 1, '+', 'COUNT', SCAN)
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
                -- More than SCAN expired. Invariant: the first entry at or
                -- after position lo is expired, the first at or after hi is
                -- live (the newest is live).
                local lo, hi = bC, w.total
                fT = w.last
                while hi - lo > 1 do
                  local mid = floor((lo + hi) / 2)
                  local row = call('XRANGE', w.ts, mid, '+', 'COUNT', 1)[1]
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
                -- Adjustment records at or below base leave `adj`; hbase
                -- becomes the running total at the last of them. They are in
                -- position order: a bisection by rank finds the last one.
                local function rec(rank)
                  local r = call('ZRANGE', w.adj, rank, rank)[1]
                  if r then
                    local c, h = match(r, '^(%d+):(%-?%d+):')
                    return tonumber(c), tonumber(h)
                  end
                end
                local c, h = rec(0)
                if not c then
                  w.nadj, w.neg = 0, 0
                elseif c <= w.B then
                  local lo, hi, hlast = 0, w.nadj, h
                  while hi - lo > 1 do
                    local mid = floor((lo + hi) / 2)
                    c, h = rec(mid)
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
          evict(w)
        end
      elseif op ~= 'peek' and call('EXISTS', w.log, w.ts, w.adj) > 0 then
        -- Counters gone with entries left (they expired apart): no stray
        -- entry may count.
        call('UNLINK', w.log, w.ts, w.adj)
      end
      if w.kind == 'bucket' then
        -- The level drains `units` per quantum of `q` µs, whole quanta only
        -- (the remainder carries over, so nothing is lost or gained).
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
      else
        -- Drift forgiven (undrift) counts no more while its entries live:
        -- the drift recorded between base and the mark.
        local forgiven = max(w.fd - w.dbase, 0)
        w.sused = (w.total - w.B) - (w.htot - w.hbase)
        w.used = w.sused - forgiven
        w.drift = w.dtot - w.dbase - forgiven
      end
    end
    -- Reset-bound drift counts until it ends (see "Drift").
    if w.rdt > now then
      w.xr = w.rd
      w.used, w.drift = w.used + w.xr, w.drift + w.xr
    elseif w.rd ~= 0 then
      w.rd, w.rdt = 0, 0
      w.dirty = w.kind ~= 'fixed'
    end
  end

  -- Writes back every changed window's counters, expiring with its keys
  -- (`got`: the counters as the call found them; none: the key is new).
  local function save_all(windows, nwin, now, got)
    for i = 1, nwin do
      local w = windows[i]
      if w.dirty and w.kind == 'concurrent' then
        -- Nothing in flight: nothing to remember (the lease zset and held
        -- hash are empty, so Redis has dropped them already).
        if w.used <= 0 or w.expires <= now then
          redis.call('DEL', w.meta)
        elseif w.ttl or not got[w.mi] then
          redis.call('SET', w.meta, cmsgpack.pack(w.used, w.low, w.expires), 'PX', math.ceil((w.expires - now) / 1000))
        else
          redis.call('SET', w.meta, cmsgpack.pack(w.used, w.low, w.expires), 'KEEPTTL')
        end
      elseif w.dirty then
        -- The counters live until `expires` and, for a bucket, until its
        -- level has drained (1 s slack): usually well before `expires`
        -- (a bucket's keys outlive each entry by at least 60 s).
        local until_, moved = w.expires, w.ttl
        if w.L > 0 then
          local drained = w.lt + math.ceil(w.L / w.units) * w.q + 1000000
          if drained > until_ then
            until_, moved = drained, true
          end
        end
        -- Reset-bound drift keeps them until it ends.
        if w.rd > 0 and w.rdt > until_ then
          until_, moved = w.rdt, true
        end
        -- A waiting line keeps them until its last promise has left.
        if w.qe > until_ then
          until_, moved = w.qe, true
        end
        if until_ <= now or (w.oldest == 0 and w.nadj == 0 and w.L <= 0 and w.rd <= 0 and w.qe <= now) then
          -- Nothing live: the next spend starts from position 0.
          redis.call('DEL', w.meta)
        elseif moved or not got[w.mi] then
          redis.call('SET', w.meta, cmsgpack.pack(w.total, w.B, w.hbase, w.htot, w.oldest, w.last, w.expires,
            w.nadj, w.stale, w.dtot, w.dbase, w.neg, w.L, w.lt, w.D, w.rd, w.rdt, w.fd,
            w.qt, w.qb, w.qf, w.qe, w.q0), 'PX', math.ceil((until_ - now) / 1000))
        else
          -- Unmoved, the counters keep the TTL they have (never shorter
          -- than `until_`), which saves formatting a number on most spends.
          redis.call('SET', w.meta, cmsgpack.pack(w.total, w.B, w.hbase, w.htot, w.oldest, w.last, w.expires,
            w.nadj, w.stale, w.dtot, w.dbase, w.neg, w.L, w.lt, w.D, w.rd, w.rdt, w.fd,
            w.qt, w.qb, w.qf, w.qe, w.q0), 'KEEPTTL')
        end
      end
    end
  end

  -- Appends `units` to a window's stream at max(now, newest), `drift` of them
  -- drift. False when the window's positions ran out (2^53 units).
  local function append(w, units, drift, now)
    local at = math.max(now, w.last)
    local C = w.total + units
    if C >= 9007199254740992 then  -- MAXPOS
      return false
    end
    w.dtot = w.dtot + drift
    -- Numbers leave as strings formatted here: redis.call prints a number
    -- argument with "%.17g", slower than an integer format.
    redis.call('XADD', w.ts, string.format('%d-%d', C, at), 'd', w.dtot == 0 and '0' or string.format('%d', w.dtot))
    w.total, w.last, w.dirty = C, at, true
    if w.oldest == 0 then
      w.oldest = at
    end
    if w.expires < at + w.hold then
      -- The keys must outlive this entry by a window. Their TTL is set with
      -- some slack (a quarter window, 1 s to 1 h), so most spends skip the
      -- PEXPIREs; idle keys linger at most that much longer.
      w.expires = at + w.hold + math.min(math.max(math.floor(w.hold / 4), 1000000), 3600000000)
      w.ttl = true
      local ttl = math.ceil((w.expires - now) / 1000)
      redis.call('PEXPIRE', w.log, ttl)
      redis.call('PEXPIRE', w.ts, ttl)
      if w.nadj > 0 then
        redis.call('PEXPIRE', w.adj, ttl)
      end
    end
    return true
  end

  -- The spend history (optional, ARGV 6+n): adds `units` to the current slot
  -- of each ring, on this call's clock. A ring is a fixed-size string of
  -- unsigned 32-bit counters (BITFIELD, saturating at 0): counter 0 holds the
  -- newest slot written, counter 1 + (slot mod slots) that slot's units.
  -- Slots skipped since the newest are zeroed before reuse, a ring idle for
  -- `slots` slots is dropped whole, and one whose newest slot began its TTL
  -- ago expires.
  local record
  local nring = tonumber(ARGV[6 + nwin]) or 0
  -- The waiting line (optional, a spend's ARGV 10+n, after the history's
  -- four; see "Waiting line"): the ticket, and one line key per window
  -- but concurrent ones after the rings' keys.
  local ticket, nline = nil, 0
  if op == 'spend' and ARGV[10 + nwin] ~= nil then
    ticket = ARGV[10 + nwin]
    local lk = k + nring
    for i = 1, nwin do
      local w = windows[i]
      if w.kind ~= 'concurrent' then
        w.line = KEYS[lk]
        if not w.line then
          return redis.error_reply('ERR quota-worker: a spend with a waiting line passes one line key per window but concurrent ones after the rings\' keys')
        end
        lk, nline = lk + 1, nline + 1
      end
    end
    if KEYS[lk] ~= nil then
      return redis.error_reply('ERR quota-worker: a spend with a waiting line passes one line key per window but concurrent ones after the rings\' keys, and no more')
    end
  end
  if nring > 0 and (op == 'spend' or op == 'settle') then
    local slot_ms, nslot, ring_ttl = tonumber(ARGV[7 + nwin]), tonumber(ARGV[8 + nwin]), tonumber(ARGV[9 + nwin])
    if not (slot_ms and slot_ms >= 1 and nslot and nslot >= 1 and ring_ttl and ring_ttl >= 1) then
      return redis.error_reply('ERR quota-worker: the spend history takes a ring count, a slot length (ms), a slot count and a TTL (ms)')
    end
    if KEYS[k + nring - 1] == nil or KEYS[k + nring + nline] ~= nil then
      return redis.error_reply('ERR quota-worker: the spend history names ' .. nring .. ' ring(s); pass exactly that many keys after the windows\' keys')
    end
    record = function(units)
      if units == 0 then
        return
      end
      local now_slot = floor(floor(now / 1000) / slot_ms)
      for r = k, k + nring - 1 do
        local ring = KEYS[r]
        local newest = call('BITFIELD', ring, 'GET', 'u32', '#0')[1]
        local slot = now_slot
        if slot > newest then
          if slot - newest >= nslot then
            call('DEL', ring)
          else
            local zero = {}
            for s = newest + 1, slot do
              zero[#zero + 1] = 'SET'
              zero[#zero + 1] = 'u32'
              zero[#zero + 1] = '#' .. (1 + s % nslot)
              zero[#zero + 1] = 0
            end
            call('BITFIELD', ring, unpack(zero))
          end
          call('BITFIELD', ring, 'SET', 'u32', '#0', slot)
          -- Its TTL runs from the first write of its newest slot: by the
          -- time it ends (a TTL of the ring's span plus a slot) that slot
          -- has left the span, so nothing expires that a reader would show,
          -- and the other writes of the slot skip the PEXPIRE.
          call('PEXPIRE', ring, ring_ttl)
        elseif slot < newest then
          -- The clock is never behind the newest slot but for a failover to
          -- a skewed replica: count in the newest slot, not a passed one.
          slot = newest
        end
        call('BITFIELD', ring, 'OVERFLOW', 'SAT', 'INCRBY', 'u32', '#' .. (1 + slot % nslot), units)
      end
    end
  end

  local id = ARGV[2]
  local cost = tonumber(ARGV[3])
  if op == 'spend' or op == 'settle' then
    if id == nil or id == '' or string.sub(id, 1, 1) == '#' or id == '{request_id}' then
      save_all(windows, nwin, now, got)
      return redis.error_reply('ERR quota-worker: request id must be unique, non-empty, not start with "#" (got ' .. tostring(id) .. ')')
    end
    -- A spend costs 1 or more, a settle 0 or more (a refund); both below
    -- 2^53, as every count here: a larger one would be rounded.
    local least = op == 'spend' and 1 or 0
    if cost == nil or cost < least or cost >= MAXPOS or cost ~= floor(cost) then
      save_all(windows, nwin, now, got)
      return redis.error_reply('ERR quota-worker: ' .. op .. ' cost must be a whole number from ' .. least .. ' to 2^53 - 1 (got ' .. tostring(ARGV[3]) .. ')')
    end
  end
  local rejected, remaining = false, nil
  if op == 'spend' then
    rejected = blocked_until > now
    for i = 1, nwin do
      local w = windows[i]
      if cost > w.lim then
        save_all(windows, nwin, now, got)
        return redis.error_reply('ERR quota-worker: cost ' .. cost .. ' can never fit window ' .. i .. ' (' .. w.lim .. ' units with the reserve)')
      end
      local left = w.lim - w.used
      if remaining == nil or left < remaining then
        remaining = left
      end
      if cost > left then
        rejected = true
      end
    end
    remaining = max(remaining or 0, 0)
  end

  -- ---------------------------------------------------------------- the waiting line (spend)

  -- Each sliding window's line, brought to now, and this spend's turn in
  -- it (w.turn, µs from now; 0: now). Only for a spend that names a line.
  local lined, vlevel = false, nil
  if ticket and op == 'spend' then
    -- µs from now until a spend of `c` units fits behind the line: until
    -- the n-th unit of the line's sequence has left, n = its units + c -
    -- lim. The sequence: the live entries spent before the line began
    -- (positions up to q0), then the line's own entries (positions qb+1 ..
    -- qt), each leaving a window after its moment. Settles are not counted
    -- (the line never admits: an estimate that is off costs a refusal,
    -- never an excess).
    local function turn_of(w, c)
      local r0 = max(min(w.q0 - w.B, w.sused), 0)
      local n = r0 + (w.qt - w.qb) + c - w.lim
      if n <= 0 then
        return 0
      end
      local at
      if n <= r0 then
        local row = call('XRANGE', w.ts, format('%d', w.B + n), '+', 'COUNT', 1)[1]
        at = row and tonumber(match(row[1], '%-(%d+)$'))
      else
        -- A unit of the line's own: a waiter's, who may spend it later
        -- than promised (see the slack below).
        local r = call('ZRANGEBYSCORE', w.line, format('%d', w.qb + n - r0), '+inf', 'LIMIT', 0, 1)[1]
        at = r and tonumber(match(r, '^%d+:(%d+)$'))
        w.slack = true
      end
      if not at then
        return w.hold
      end
      return max(at + w.hold - now, 0)
    end
    -- A bucket's line is a level of its own (see "Waiting line"): what the
    -- line has promised, at time qf; this is it at time t >= qf.
    vlevel = function(w, t)
      if t <= w.qf then
        return w.qt
      end
      return max(w.qt - floor((t - w.qf) / w.q) * w.units, 0)
    end
    -- µs from now until a spend of `c` units fits a bucket behind its line:
    -- when the line's level (at least the bucket's own, now) has drained
    -- enough for it.
    local function bucket_turn(w, c)
      local t0 = max(now, w.qf)
      local v = vlevel(w, t0)
      if t0 == now and w.L > v then
        v = w.L
      end
      local excess = v + (c - w.lim) * w.perq
      if excess <= 0 then
        return t0 - now
      end
      w.slack = true
      return t0 + ceil(excess / w.units) * w.q - now
    end
    for i = 1, nwin do
      local w = windows[i]
      if w.line and w.kind == 'fixed' then
        -- A fixed window's line: units promised per future period
        -- ("p:<period>"), and each waiter's period ("t:<ticket>").
        lined = true
        local r = call('HMGET', w.line, 'p:' .. w.period, 't:' .. ticket)
        w.owed = tonumber(r[1]) or 0
        local mp = tonumber(r[2])
        if w.owed > 0 and now > F.start(w, w.period) + min(max(floor(w.per / 100), 1000000), 60000000) then
          -- Past a grace after the period's start, units promised in it
          -- and not yet spent are free again: a waiter that never comes
          -- back holds them no longer.
          w.owed = 0
        end
        if mp and mp >= w.period then
          w.mine = { mp }
        end
        if w.mine and mp == w.period then
          if w.used + cost > w.lim then
            -- Its units were taken: it waits again, promised anew.
            w.mine, w.turn = false, w.ends - now
          end
        elseif w.used + cost + w.owed > w.lim then
          -- This period's free units are promised (or there are none): a
          -- waiter early for its period waits for it, anyone else at least
          -- for the next.
          w.turn = (w.mine and F.start(w, mp) or w.ends) - now
        end
        if w.turn > 0 then
          rejected = true
        end
      elseif w.line and w.kind == 'bucket' then
        lined = true
        if w.qe ~= 0 and w.qe <= now then
          -- Over: the line's level has drained.
          w.qt, w.qf, w.qe, w.dirty = 0, 0, 0, true
        end
        if w.qe ~= 0 then
          -- A waiter come back: its ticket's score is its turn.
          local m = ticket ~= '' and tonumber(call('ZSCORE', w.line, 't:' .. ticket))
          if m then
            w.mine = { 0, m }
            if w.used + cost > w.lim and m > now then
              w.turn = m - now
            end
          else
            w.turn = bucket_turn(w, cost)
          end
          if w.turn > 0 then
            rejected = true
          end
        end
      elseif w.line then
        lined = true
        if w.qe ~= 0 and w.qe <= now then
          -- Over: every promise's entry has left the window.
          w.qt, w.qb, w.qf, w.qe, w.q0, w.dirty = 0, 0, 0, 0, 0, true
        end
        if w.qt > 0 and w.qf ~= 0 and w.qf <= now then
          -- Entries that have left move the line's base past them; they
          -- and their tickets are dropped (at most SCAN a call).
          local rows = call('ZRANGEBYSCORE', w.line, format('(%d', w.qb), '+inf', 'LIMIT', 0, SCAN)
          local qb, qf = w.qb, 0
          for j = 1, #rows do
            local v, m = match(rows[j], '^(%d+):(%d+)$')
            if not v then
              break
            end
            if tonumber(m) + w.hold <= now then
              qb = tonumber(v)
            else
              qf = tonumber(m) + w.hold
              break
            end
          end
          if qf == 0 and #rows >= SCAN then
            qf = now
          end
          if qb > w.qb then
            call('ZREMRANGEBYSCORE', w.line, 1, format('%d', qb))
            call('ZREMRANGEBYSCORE', w.line, format('%d', -qb), '(0')
            w.qb = qb
          end
          w.qf, w.dirty = qf, true
        end
        if w.qt > 0 then
          -- A waiter come back: its ticket's score is minus its entry's position.
          local v = ticket ~= '' and tonumber(call('ZSCORE', w.line, 't:' .. ticket))
          if v then
            local e = call('ZRANGEBYSCORE', w.line, -v, -v, 'LIMIT', 0, 1)[1]
            w.mine = { -v, tonumber(match(e or '', '^%d+:(%d+)$')) or now }
            -- Its units were promised: only the window itself decides,
            -- but a waiter early for its turn waits for it.
            if w.used + cost > w.lim and w.mine[2] > now then
              w.turn = w.mine[2] - now
            end
          else
            -- Everyone else waits for their turn behind the line.
            w.turn = turn_of(w, cost)
          end
          if w.turn > 0 then
            rejected = true
          end
        end
      end
    end
  end

  -- ---------------------------------------------------------------- when units free (peek, rejections)

  local frees_in
  if op == 'peek' or rejected then
    -- µs until window w counts at most `target` units (bucket: units x
    -- quanta): a fixed window at its reset; a bucket when its level has
    -- drained; a sliding window when its oldest used - target live units have
    -- expired: the first entry whose actual position (position less the
    -- adjustments up to it) reaches base + need. Without reset-bound drift
    -- (which frees_in adds): `target` counts the window's own state only.
    local function base_frees(w, target)
      if w.used - w.xr <= target then
        return 0
      elseif w.kind == 'fixed' then
        return w.ends - now
      elseif w.kind == 'concurrent' then
        -- Until the earliest lease expires (a settle may free one sooner:
        -- nobody can know when).
        local first = call('ZRANGE', w.lease, 0, 0, 'WITHSCORES')
        return max((tonumber(first[2]) or now) - now, 1)
      elseif w.kind == 'bucket' then
        local excess = w.L - target * w.perq
        if excess <= 0 then
          return 0
        end
        return max(w.lt + ceil(excess / w.units) * w.q - now, 1)
      end
      -- The stream's own count: drift forgiven by undrift still has its
      -- entries, so the wait is for them too (never shorter than exact).
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
        local c, tt = match(row[1], '^(%d+)%-(%d+)$')
        eC, eT = tonumber(c), tonumber(tt)
      end
      if w.neg > 0 then
        -- A raised cost moves later entries' actual positions up: the next
        -- adjusted entry may reach the target before the entry found above.
        local r = call('ZRANGEBYSCORE', w.adj, T, '+inf', 'LIMIT', 0, 1)[1]
        local c = r and tonumber(match(r, '^(%d+):'))
        if c and c < eC then
          local row2 = call('XRANGE', w.ts, c, c, 'COUNT', 1)[1]
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
    -- With reset-bound drift xr until rdt: counted until then, gone after.
    frees_in = function(w, target)
      if w.xr > 0 then
        local left = w.rdt - now
        if target >= w.xr then
          local before = base_frees(w, target - w.xr)
          if before < left then
            return before
          end
        end
        return max(left, base_frees(w, target))
      end
      return base_frees(w, target)
    end
  end

  -- ---------------------------------------------------------------- peek

  if op == 'peek' then
    local out = { ceil(max(blocked_until - now, 0) / 1000) }
    for i = 1, nwin do
      local w = windows[i]
      out[#out + 1] = w.used
      out[#out + 1] = max(w.units - w.used, 0)
      out[#out + 1] = w.used > 0 and ceil(frees_in(w, w.used - 1) / 1000) or 0
      out[#out + 1] = w.drift
      out[#out + 1] = w.kind == 'concurrent' and call('ZCARD', w.lease) or 0
    end
    save_all(windows, nwin, now, got)
    return out
  end

  -- ---------------------------------------------------------------- sync (drift)

  if op == 'sync' then
    local n, reset = match(ARGV[2] or '', '^(%d+):?(%d*)$')
    local w = windows[tonumber(n) or 0]
    reset = tonumber(reset)
    local upstream_left = tonumber(ARGV[3])
    if not w or not upstream_left or upstream_left < 0 or upstream_left >= MAXPOS or upstream_left ~= floor(upstream_left)
      or (reset and (reset < 1 or reset >= MAXPOS / 1000)) then
      save_all(windows, nwin, now, got)
      return redis.error_reply('ERR quota-worker: sync takes a window number (with ":<ms>" until the upstream resets, 1 ms to 2^53 µs) and the upstream\'s remaining units (a whole number from 0 to 2^53 - 1)')
    end
    -- Drift only ever lowers what we admit.
    local drift = w.units - w.used - upstream_left
    if w.kind == 'concurrent' then
      -- Units in flight are no spent units: nothing to resync.
      drift = 0
    end
    if drift > 0 and reset then
      -- Until the upstream's reset: one number beside the window's state.
      w.rd = (w.xr > 0 and w.rd or 0) + drift
      w.rdt, w.xr = now + reset * 1000, w.rd
      if w.kind == 'fixed' then
        F.open(w)
        call('HSET', w.state, '#rd', w.rd, '#rdt', w.rdt)
      else
        w.dirty = true
      end
    elseif drift > 0 then
      -- Without a reset: units spent now, which leave as spends do.
      if w.kind == 'fixed' then
        F.open(w)
        call('HINCRBY', w.state, '#used', drift)
        call('HINCRBY', w.state, '#drift', drift)
      elseif w.kind == 'bucket' then
        w.L = w.L + drift * w.perq
        w.D = w.D + drift * w.perq
        w.dirty = true
      elseif not append(w, drift, drift, now) then
        save_all(windows, nwin, now, got)
        return redis.error_reply('ERR quota-worker: window ' .. w.i .. ' ran out of positions; delete its keys')
      end
    else
      drift = 0
    end
    save_all(windows, nwin, now, got)
    return { drift }
  end

  -- ---------------------------------------------------------------- undrift

  if op == 'undrift' then
    local out = {}
    for i = 1, nwin do
      local w = windows[i]
      out[i] = w.drift
      if w.kind == 'concurrent' then
        -- Leases in flight hold no drift.
        out[i] = 0
      elseif w.kind == 'fixed' then
        if not w.fresh_period then
          call('HINCRBY', w.state, '#used', -(w.drift - w.xr))
          call('HSET', w.state, '#drift', 0)
          call('HDEL', w.state, '#rd', '#rdt')
        end
      elseif w.kind == 'bucket' then
        w.L, w.D = max(w.L - w.D, 0), 0
      else
        -- The drift entries recorded so far count no more (see "Drift").
        w.fd = w.dtot
      end
      if w.kind == 'sliding' or w.kind == 'bucket' then
        w.rd, w.rdt, w.dirty = 0, 0, true
      end
    end
    save_all(windows, nwin, now, got)
    return out
  end

  -- ---------------------------------------------------------------- settle

  if op == 'settle' then
    -- id and cost were checked above.

    local function adj_parse(m)
      local c, h, d = match(m, '^(%d+):(%-?%d+):(%-?%d+)$')
      return tonumber(c), tonumber(h), tonumber(d)
    end

    local function adj_member(c, h, d)
      -- Zero-padded, so records of equal score sort by position.
      return format('%016d:%d:%d', c, h, d)
    end

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
      local rows = call('XREVRANGE', w.ts, C, '-', 'COUNT', 2)
      if not rows[1] then
        return nil
      end
      local spent = C - (rows[2] and tonumber(match(rows[2][1], '^(%d+)')) or w.B)
      -- Its adjustment record (if settled before), the records after it, and
      -- the running adjustment total before it. Records are in position
      -- order, so they are read from the newest back to it.
      local d_old, h_prev, later = 0, w.hbase, {}
      if w.nadj > 0 then
        local n, done = 8, false
        while not done do
          local recs = call('ZRANGE', w.adj, -n, -1)
          later, d_old = {}, 0
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
        call('PEXPIRE', w.adj, max(ceil((w.expires - now) / 1000), 1))
      end
      w.htot = w.htot + delta
      if actual == 0 then
        -- Refunded: the id is forgotten, so spending it again is a new spend.
        call('ZREM', w.log, id)
      end
      w.dirty = true
      return actual - before
    end

    -- `changed`: the change in the spend's units, as the first window that
    -- still held it saw it (every window of a spend recorded the same cost).
    local adjusted, changed, leased = 0, nil, nil
    for i = 1, nwin do
      local w = windows[i]
      if w.kind == 'concurrent' then
        -- Whatever the cost, a settle ends the lease: the answer was read,
        -- or nothing was sent. A lease already returned or lapsed: nothing.
        local held = tonumber(call('HGET', w.held, id))
        if held then
          call('HDEL', w.held, id)
          call('ZREM', w.lease, id)
          w.used = max(w.used - held, 0)
          w.dirty = true
          adjusted = adjusted + 1
          leased = leased or (cost - held)
        end
      elseif w.kind == 'fixed' then
        -- A spend in a past period needs no settling.
        local old = not w.fresh_period and tonumber(call('HGET', w.state, id))
        if old then
          if cost == 0 then
            call('HDEL', w.state, id)
          else
            call('HSET', w.state, id, cost)
          end
          call('HINCRBY', w.state, '#used', cost - old)
          adjusted = adjusted + 1
          changed = changed or (cost - old)
        end
      else
        local change = settle_entry(w, cost)
        if change then
          adjusted = adjusted + 1
          changed = changed or change
          if w.kind == 'bucket' then
            -- As the upstream's own bucket does: the difference is given
            -- back (or charged) at once.
            w.L = max(w.L + change * w.perq, 0)
            w.D = min(w.D, w.L)
            w.dirty = true
          end
        end
      end
    end
    save_all(windows, nwin, now, got)
    -- The spent units' change; a spend on concurrent windows alone has only
    -- its lease's.
    changed = changed or leased
    if record and changed then
      record(changed)
    end
    return { adjusted }
  end

  if op ~= 'spend' then
    save_all(windows, nwin, now, got)
    return redis.error_reply('ERR quota-worker: unknown op ' .. tostring(op))
  end

  -- ---------------------------------------------------------------- spend

  if rejected then
    -- Every window must admit the spend, so it waits for the one that frees
    -- last; on a tie the credential block (0) or the lower window index names it.
    local retry, rejecting = max(blocked_until - now, 0), 0
    local best
    for i = 1, nwin do
      local w = windows[i]
      if w.used + cost > w.lim then
        local wait = frees_in(w, w.lim - cost)
        if w.kind == 'concurrent' then
          -- Momentary: a lease may be returned any time, so the caller
          -- asks again soon rather than at the lease's end.
          wait = min(wait, SOON)
        end
        if wait > retry then
          retry, rejecting = wait, i
        end
      end
      -- The line's turn (see "Waiting line").
      if w.turn > retry then
        retry, rejecting = w.turn, i
      end
      -- The window that remembers ids longest (see below); a concurrent
      -- window only while its lease lasts, so it is asked last.
      if not best or (best.kind == 'concurrent' and w.kind ~= 'concurrent')
        or (w.kind ~= 'fixed' and w.kind ~= 'concurrent' and (best.kind == 'fixed' or w.hold > best.hold))
        or (w.kind == 'fixed' and best.kind == 'fixed' and w.per > best.per) then
        best = w
      end
    end
    -- A retry of a spend that was admitted (its reply was lost) is admitted
    -- again, not charged again. Asked only of a rejected spend (an admitted
    -- one finds out when it records, NX below), and only of the window that
    -- remembers ids longest: every window of a spend records it at once, and a
    -- refund forgets it in all of them.
    local held = false
    if best and best.kind == 'fixed' then
      held = not best.fresh_period and call('HEXISTS', best.state, id) == 1
    elseif best and best.kind == 'concurrent' then
      held = call('HEXISTS', best.held, id) == 1
    elseif best then
      local C = tonumber(call('ZSCORE', best.log, id))
      held = C ~= nil and C > best.B
    end
    if held then
      save_all(windows, nwin, now, got)
      return { 1, remaining, 0, 0 }
    end
    if lined and ticket ~= '' then
      -- A fixed window promises the first period, from the one holding
      -- the moment the other windows name, whose unpromised units fit the
      -- cost (looking 64 periods ahead at most), and the spend waits for it.
      for i = 1, nwin do
        local w = windows[i]
        if w.line and w.kind == 'fixed' and not w.mine then
          local q = w.period
          if now + retry >= w.ends then
            q = F.period_of(w, now + retry)
          end
          for _ = 1, 64 do
            local free = w.lim - w.used - w.owed
            if q ~= w.period then
              free = w.lim - (tonumber(call('HGET', w.line, 'p:' .. q)) or 0)
            end
            if cost <= free then
              break
            end
            q = q + 1
          end
          if q > w.period and F.start(w, q) - now > retry then
            retry, rejecting = F.start(w, q) - now, i
          end
          call('HINCRBY', w.line, 'p:' .. q, cost)
          call('HSET', w.line, 't:' .. ticket, q)
          -- The line lives until the last period it promises ends.
          local ttl = ceil((F.start(w, q + 1) - now) / 1000) + 1000
          if call('PTTL', w.line) < ttl then
            call('PEXPIRE', w.line, ttl)
          end
        end
      end
      -- A waiter whose turn comes after units promised to other waiters
      -- comes back a little after they leave (a slack of 1/200 of the
      -- window, 5 to 250 ms): a waiter woken a few ms late spends a few ms
      -- late, and the one after it must not find that unit still held.
      -- Each window it waits in promises it its cost at that moment,
      -- behind everyone else (a waiter come back keeps its place: its
      -- promise stands).
      local slack = 0
      for i = 1, nwin do
        local w = windows[i]
        if w.line and w.slack then
          slack = max(slack, min(max(floor(w.per / 200), 5000), 250000))
        end
      end
      retry = retry + slack
      local at = now + retry
      for i = 1, nwin do
        local w = windows[i]
        if w.line and not w.mine and w.kind == 'bucket' then
          -- The line's level at `at`, plus this cost.
          if w.qe == 0 then
            call('UNLINK', w.line)
            w.qt, w.qf = w.L, now
          end
          local t = max(at, w.qf)
          w.qt, w.qf = vlevel(w, t) + cost * w.perq, t
          w.qe = t + ceil(w.qt / w.units) * w.q
          call('ZADD', w.line, format('%d', at), 't:' .. ticket)
          -- Tickets whose turn passed a window ago: their waiters did not
          -- come back (or will as fresh spends).
          call('ZREMRANGEBYSCORE', w.line, '-inf', format('(%d', now - w.per))
          call('PEXPIRE', w.line, ceil((w.qe - now) / 1000) + 1000)
          w.dirty = true
        elseif w.line and not w.mine and w.kind == 'sliding' then
          if w.qt == 0 then
            -- A new line: tickets left by one that is over go.
            call('UNLINK', w.line)
            w.q0, w.qb = w.total, 0
          end
          w.qt = w.qt + cost
          call('ZADD', w.line, format('%d', w.qt), format('%d:%d', w.qt, at), format('%d', -w.qt), 't:' .. ticket)
          if w.qf == 0 or at + w.hold < w.qf then
            w.qf = at + w.hold
          end
          -- Its TTL every time (see the admitted spend's, below).
          w.qe = max(w.qe, at + w.hold)
          call('PEXPIRE', w.line, ceil((w.qe - now) / 1000) + 1000)
          w.dirty = true
        end
      end
    end
    save_all(windows, nwin, now, got)
    return { 0, remaining, ceil(retry / 1000), rejecting }
  end

  local costs = format('%d', cost)  -- the cost as fixed windows store it
  -- Record the id in every window first: a window that already holds it makes
  -- this a retry of a spend that happened (its reply was lost): admitted once,
  -- charged once, and the records just added are taken back.
  for i = 1, nwin do
    local w = windows[i]
    local recorded
    if w.kind == 'fixed' then
      F.open(w)
      recorded = call('HSETNX', w.state, id, costs) == 1
    elseif w.kind == 'concurrent' then
      recorded = call('HSETNX', w.held, id, costs) == 1
    else
      local C = format('%d', w.total + cost)
      recorded = call('ZADD', w.log, 'NX', C, id) == 1
      if not recorded and tonumber(call('ZSCORE', w.log, id)) <= w.B then
        -- An expired spend's id, not yet dropped: a new spend.
        call('ZADD', w.log, 'XX', C, id)
        recorded = true
      end
    end
    if not recorded then
      for j = 1, i - 1 do
        local u = windows[j]
        if u.kind == 'fixed' then
          call('HDEL', u.state, id)
        elseif u.kind == 'concurrent' then
          call('HDEL', u.held, id)
        else
          call('ZREM', u.log, id)
        end
      end
      save_all(windows, nwin, now, got)
      return { 1, remaining, 0, 0 }
    end
  end

  remaining = nil
  for i = 1, nwin do
    local w = windows[i]
    local left = w.lim - w.used - cost
    if remaining == nil or left < remaining then
      remaining = left
    end
    if w.kind == 'fixed' then
      call('HINCRBY', w.state, '#used', costs)
    elseif w.kind == 'concurrent' then
      -- The lease: its expiry in the zset (its units are in `held`).
      local at = now + w.per
      call('ZADD', w.lease, format('%d', at), id)
      w.used = w.used + cost
      if w.low == 0 or at < w.low then
        w.low = at
      end
      if w.expires < at then
        -- The keys outlive every lease, with a quarter lease of slack (1 s
        -- to 1 h), so most spends skip the PEXPIREs.
        w.expires = at + min(max(floor(w.per / 4), 1000000), 3600000000)
        w.ttl = true
        local ttl = ceil((w.expires - now) / 1000)
        call('PEXPIRE', w.lease, ttl)
        call('PEXPIRE', w.held, ttl)
      end
      w.dirty = true
    else
      if not append(w, cost, 0, now) then
        return redis.error_reply('ERR quota-worker: window ' .. i .. ' ran out of positions; delete its keys')
      end
      if w.kind == 'bucket' then
        w.L = w.L + cost * w.perq
      end
    end
  end
  if lined then
    -- A waiter come back gives its ticket up; its entry in the line moves
    -- to when it really spent (later than promised: the waiters promised
    -- its units after it are then refused once rather than admitted into
    -- a full window by nobody). A spend admitted while a line waits takes
    -- its place in it, so the promises made after it count its units.
    for i = 1, nwin do
      local w = windows[i]
      if w.line and w.kind == 'fixed' then
        if w.mine then
          -- Its promise is spent.
          call('HINCRBY', w.line, 'p:' .. w.mine[1], -cost)
          call('HDEL', w.line, 't:' .. ticket)
        end
      elseif w.line and w.kind == 'bucket' then
        if w.mine then
          call('ZREM', w.line, 't:' .. ticket)
        elseif w.qe ~= 0 then
          -- Its cost joins the line's level (the bucket's own already
          -- holds it).
          if w.qf <= now then
            w.qt, w.qf = max(vlevel(w, now) + cost * w.perq, w.L), now
          else
            w.qt = w.qt + cost * w.perq
          end
          local qe = w.qf + ceil(w.qt / w.units) * w.q
          if qe > w.qe then
            w.qe = qe
            call('PEXPIRE', w.line, ceil((w.qe - now) / 1000) + 1000)
          end
          w.dirty = true
        end
      elseif w.line and w.mine then
        local v, was = w.mine[1], w.mine[2]
        if now > was then
          call('ZREM', w.line, 't:' .. ticket, format('%d:%d', v, was))
          call('ZADD', w.line, format('%d', v), format('%d:%d', v, now))
          if now + w.hold > w.qe then
            -- Its entry (and the line) leave later.
            w.qe, w.dirty = now + w.hold, true
            call('PEXPIRE', w.line, ceil((w.qe - now) / 1000) + 1000)
          end
        else
          call('ZREM', w.line, 't:' .. ticket)
        end
      elseif w.line and w.qt > 0 then
        w.qt = w.qt + cost
        call('ZADD', w.line, format('%d', w.qt), format('%d:%d', w.qt, now))
        if w.qf == 0 or now + w.hold < w.qf then
          w.qf = now + w.hold
        end
        -- Its TTL every time: the ZADD made the key if something deleted
        -- it while meta still held the line, and no key lives without one.
        w.qe = max(w.qe, now + w.hold)
        call('PEXPIRE', w.line, ceil((w.qe - now) / 1000) + 1000)
        w.dirty = true
      end
    end
  end
  save_all(windows, nwin, now, got)
  if record then
    record(cost)
  end
  return { 1, max(remaining, 0), 0, 0 }
end

return spend_main(KEYS, ARGV)
