-- quota-worker: the spend core (layout v2), a Redis function library.
--
-- The operations on a credential's quota windows, so the window arithmetic
-- exists exactly once: spend, settle, block, peek, sync, undrift, and the
-- item claim with its first spend. Every key is one credential's and
-- carries its `{credential}` hash tag, so it runs unchanged on Redis
-- Cluster. The clock is Redis TIME (µs); no caller clock is trusted.
--
-- Assembled from the files of lua/spend/ in this order (src/quota/lua.rs):
-- core.lua (this: the contract, shared names, argument parsing), log.lua
-- (the id log and stream of sliding and bucket windows), sliding.lua,
-- bucket.lua, fixed.lua, concurrent.lua (a file per window kind, each
-- behind the same functions), line.lua (the waiting line), ring.lua (the
-- spend history), ops.lua (the operations), lua/item_lock.lua and
-- claim.lua (the claim), then either functions.lua (Redis 7: FUNCTION
-- LOAD, one function per operation, `FCALL <library>_<op>`) or script.lua
-- (Redis 6, and `quota-worker keys --script`: one script, `EVALSHA`, the
-- operation in ARGV[1]). Both forms take the same KEYS and ARGV.
--
-- KEYS
--   1  <prefix>:{<credential>}:blocked   string: blocked-until, µs (upstream 429)
--   2  <prefix>:{<credential>}:clock     string: when a fixed window last started a
--                                        period, µs (keeps time monotonic, see fixed.lua)
--   then, per window, in the order of ARGV[6..]:
--     sliding, bucket (4 keys) <w>:v2:meta  string: the window's counters (msgpack)
--                              <w>:v2:log   zset: request id -> its position
--                              <w>:v2:ts    stream: one entry per spend, id "<position>-<µs>"
--                              <w>:v2:adj   zset: settled entries (log.lua, "Settle")
--     fixed (1 key)            <w>:fixed    hash: "#period", "#used", "#drift", "#rd", "#rdt",
--                                                request id -> units
--     concurrent (3 keys)      <w>:meta     string: units in flight, earliest lease bound, expiry (msgpack)
--                              <w>:lease    zset: request id -> when its lease expires, µs
--                              <w>:held     hash: request id -> its units
--     and a shadow window's one more: <w>:shadow  string: its refusals' ring (ring.lua)
--   then, optional, the spend history's rings (ARGV[6+n] says how many):
--     <prefix>:{<credential>}:spent:<scope>  string: units per 5-minute slot, 24 h
--   then, optional (a spend naming a ticket, ARGV[10+n]), one per window but
--   concurrent ones, in window order (line.lua):
--     sliding, bucket  <w>:v2:line  zset: the window's waiting line
--     fixed            <w>:line     hash: "p:<period>" -> units promised in
--                                   it, "t:<ticket>" -> the waiter's period
--
-- ARGV
--   1  op: "spend" | "settle" | "block" | "peek" | "sync" | "undrift" (a
--      function checks it names its own operation)
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
--      After "shadow:", a shadow window: it never refuses nor makes a spend
--      wait (no line); a spend it alone would refuse is admitted, not
--      recorded in it (its state is what it would be, enforced), and counted.
--   optional, the spend history the status page charts (absent: none kept):
--   6+n  number of rings, m (their keys follow the windows' keys)
--   7+n  slot length, ms (300000)     8+n  slots kept (288)     9+n  ring TTL, ms
--      An admitted spend adds its cost to the current slot of each ring, a
--      settle the change it made (negative for a refund); nothing else writes.
--   optional, a spend's waiting line (absent: none is kept; only after the
--   history's four arguments):
--   10+n ticket: who this spend is, should it be refused and come back
--      (unique per waiting task, e.g. "<job>:<tick>:<item>"; never a
--      secret); "" for a spend that respects the line but will not come back
--
-- Returns
--   spend:  {allowed, remaining, retry_after_ms, rejecting_window, shadow_1, ...}
--           allowed 1/0; remaining = fewest units this spend could still take
--           across the windows (after it when allowed, as it stands when
--           rejected; a reserve counts as taken); retry_after_ms = when a spend
--           of this cost and reserve would be admitted by every window if nobody
--           else spent (0 when allowed); rejecting_window = 1-based index of the
--           rejecting window that frees last, 0 when allowed or when the
--           credential block is what frees last. A concurrent window that
--           refuses waits until its earliest lease expires, at most 1,000 ms.
--           Shadow windows count in none of these; shadow_1, ...: those that
--           would have refused a (new, admitted) spend, each adding 1 to its
--           ring when the call keeps the history.
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
-- A window kind is a table of functions, each taking the window (a table
-- of its state for this call) and the call (`c`, below):
--   proto(units, per, rest)  what its spec says (kept between calls), or
--                        nil and why it is refused
--   open(w, KEYS, k)     takes its keys from KEYS[k..]; returns how many
--   load(w, c)           reads its state and brings it to c.now: w.used,
--                        w.drift (its own units and drift, reset-bound drift
--                        included; see count_reset_drift)
--   holds(w, c)          whether it holds request c.id (a retried spend)
--   record(w, c)         records c.id for c.cost, false when it held it;
--   unrecord(w, c)       takes that record back
--   admit(w, c)          counts c.cost (after every window recorded it);
--                        false when its positions ran out
--   frees(w, c, target)  µs until it counts at most `target` units of its own
--   settle(w, c)         settles c.id to c.cost: the change in its units
--                        (nil: it does not hold the id) and whether that
--                        change is a lease's
--   sync(w, c, drift, until_us)  records drift (until_us: reset-bound)
--   undrift(w, c)        forgets its drift; returns the units forgotten
--   leases(w)            leases in flight (peek)
--   save(w, c)           writes back what changed
-- and a spend decides over every window in one place (ops.lua), so a
-- window's mode (enforce, or a shadow that only records) is one test there.
--
-- Performance (BENCHMARKS.md, "Issue 33"). A function library runs this
-- text once, at FUNCTION LOAD: helpers are defined once, window specs are
-- parsed once (PROTOS), the tables a call fills are kept for the next call.
-- Redis 7.0 gives a library's top level no standard library (not even
-- `math`), so the names below are bound at a call's start (bind).

local call, error_reply
local floor, ceil, max, min
local tonumber, tostring, format, match, find, byte, pairs
local packmp, unpackmp, unpack

local function bind()
  call, error_reply = redis.call, redis.error_reply
  floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
  tonumber, tostring = _G.tonumber, _G.tostring
  format, match, find, byte, pairs = string.format, string.match, string.find, string.byte, _G.pairs
  packmp, unpackmp, unpack = cmsgpack.pack, cmsgpack.unpack, _G.unpack
end

local CLEAN = 1024      -- expired log members dropped per call at most
local SCAN = 16         -- stream entries read before bisecting
local STALE = 64        -- expired entries tolerated before a cleanup
local LAPSE = 128       -- expired leases dropped per concurrent window and call at most
local SOON = 1000000    -- a concurrent window's refusal waits at most this (µs)
local MAXPOS = 9007199254740992  -- 2^53: positions are exact integers below it

-- The window kinds (one file each), the shared id log, the waiting line and
-- the history (their files fill these in), by the names the specs use.
local Log, Sliding, Bucket, Fixed, Concurrent, Line, Ring = {}, {}, {}, {}, {}, {}, {}
local KINDS = { sliding = Sliding, bucket = Bucket, fixed = Fixed, concurrent = Concurrent }
-- The operations by name (ops.lua, claim.lua): what the functions register
-- and the one script dispatches to.
local Ops = {}

-- The one script runs its whole text on every call: there each file after
-- this one fills its table (Log, a kind, Line, Ring, Ops) when a call first
-- reads from it, so a call defines only the functions of the files it uses.
-- `fill` (src/quota/library.rs) holds every file: one closure a call.
local fill
local function lazy()
  local meta = {
    __index = function(t, name)
      setmetatable(t, nil)
      fill(t)
      return rawget(t, name)
    end,
  }
  setmetatable(Log, meta)
  setmetatable(Sliding, meta)
  setmetatable(Bucket, meta)
  setmetatable(Fixed, meta)
  setmetatable(Concurrent, meta)
  setmetatable(Line, meta)
  setmetatable(Ring, meta)
  setmetatable(Ops, meta)
end

-- An error reply, as every operation refuses its arguments.
local function fail(message)
  return error_reply('ERR quota-worker: ' .. message)
end

-- Numbers of ARGV by their text: the same few (reserves, window counts,
-- costs, the history's settings) come with every call, and tonumber
-- (strtod) is dear. At most 256 kept; callers look NUMS up first.
local NUMS, NNUMS = {}, 0

local function num(s)
  local n = NUMS[s]
  if n == nil and s then
    n = tonumber(s)
    if n then
      if NNUMS >= 256 then
        NUMS, NNUMS = {}, 0
      end
      NUMS[s], NNUMS = n, NNUMS + 1
    end
  end
  return n
end

-- ------------------------------------------------------------ window specs

-- Parsed specs by their text: a spec is the same text on every call on its
-- window, so each is parsed once per library load (in the one-script form,
-- once per call). A kind's proto(units, per_us, rest) returns what never
-- changes (`p`), or nil and why. At most 512 are kept.
local PROTOS, NPROTOS = {}, 0

local function proto(spec, i)
  local p = PROTOS[spec]
  if p then
    return p
  end
  local body = match(spec or '', '^shadow:(.*)$')
  local shadow = body ~= nil
  local kind, units, per, rest = match(body or spec or '', '^(%a+):(%d+):(%d+):?(.*)$')
  if not kind then
    return nil, 'bad window spec ' .. tostring(spec)
  end
  local K = KINDS[kind]
  if not K then
    return nil, 'unknown window kind ' .. tostring(kind)
  end
  local why
  p, why = K.proto(tonumber(units), tonumber(per) * 1000, rest)
  if not p then
    return nil, kind .. ' window ' .. i .. ' ' .. why
  end
  -- Window tables of this spec, by their place in a call (`window`).
  p.K, p.kind, p.pool, p.shadow = K, kind, {}, shadow
  if NPROTOS >= 512 then
    PROTOS, NPROTOS = {}, 0
  end
  PROTOS[spec], NPROTOS = p, NPROTOS + 1
  return p
end

-- Window i of a call, of proto p, when p.pool[i] is missing or kept for
-- another reserve (parse): its table, with the units it may take. What a
-- call sets anew is set by parse, the kind's open() (keys) and load()
-- (state), and Ring.parse (a waiting line's fields).
local function window(p, i, reserve)
  local w = p.pool[i]
  if not w then
    -- Every field any kind uses, in one constructor: a table that grows
    -- field by field is allocated again at each doubling.
    w = {
      K = p.K, p = p, kind = p.kind, i = i, units = p.units, per = p.per, hold = p.hold,
      q = p.q, perq = p.perq, reserve = -1, lim = 0,
      -- a shadow window: its refusals' ring, whether it would refuse this spend
      shadow = p.shadow, sring = false, over = false,
      -- every kind
      used = 0, drift = 0, rd = 0, rdt = 0, xr = 0, dirty = false, ttl = false,
      meta = false, mi = 0, raw = false,
      -- a waiting line (line.lua)
      line = false, mine = false, turn = 0, slack = false, owed = 0,
      -- sliding and bucket (log.lua)
      log = false, ts = false, adj = false, sused = 0,
      total = 0, B = 0, hbase = 0, htot = 0, oldest = 0, last = 0, expires = 0, nadj = 0,
      stale = 0, dtot = 0, dbase = 0, neg = 0, L = 0, lt = 0, D = 0, fd = 0,
      qt = 0, qb = 0, qf = 0, qe = 0, q0 = 0,
      -- fixed (fixed.lua)
      state = false, period = 0, ends = 0, fresh_period = false,
      -- concurrent (concurrent.lua)
      lease = false, held = false, low = 0,
    }
    p.pool[i] = w
  end
  if w.reserve ~= reserve then
    -- The units a spend may take: all of them less the reserve.
    local units = w.units
    w.lim = units - (floor(units / 100) * reserve + ceil(units % 100 * reserve / 100))
    w.reserve = reserve
  end
  return w
end

-- Reset-bound drift (see "Drift"; a window with rd ~= 0) counts until it
-- ends; ended, it is dropped (written back where it lives in the counters:
-- `dirty`).
local function count_reset_drift(w, now, dirty)
  if w.rdt > now then
    w.xr = w.rd
    w.used, w.drift = w.used + w.xr, w.drift + w.xr
  elseif w.rd ~= 0 then
    w.rd, w.rdt = 0, 0
    w.dirty = w.dirty or dirty
  end
end

-- Records drift that stops counting `reset_ms` from now (see "Drift"): it
-- adds to reset-bound drift still counting, and ends at the newer reset.
local function add_reset_drift(w, c, drift, reset_ms)
  w.rd = (w.xr > 0 and w.rd or 0) + drift
  w.rdt, w.xr = c.now + reset_ms * 1000, w.rd
end

-- ------------------------------------------------------------ the call

-- One call's arguments and what every window shares, kept between calls
-- (every field in the constructor: the one script makes it anew on every
-- call, and a table that grows field by field is allocated at each doubling):
--   op, id, cost, nwin, ws (the windows), KEYS, ARGV; metas (MGET's keys:
--   block, clock, then sliding, bucket and concurrent windows' counters),
--   nm; got (MGET's reply), now, seen, blocked; k: the first ring's key;
--   nring and the rings' settings; ticket, lined (a spend in its lines)
local C = {
  ws = {}, metas = {}, op = false, id = false, cost = false, nwin = 0, KEYS = false, ARGV = false,
  nm = 0, k = 0, got = false, now = 0, seen = 0, blocked = 0, nover = 0, nring = 0,
  ticket = false, lined = false, slot_ms = 0, nslot = 0, ring_ttl = 0,
}

-- Parses ARGV (laid out as the header says) for operation `op`: the call
-- `C`, or nil and why. Reads nothing from Redis.
local function parse(KEYS, ARGV, op)
  if not call then
    bind()
  end
  local c = C
  if ARGV[1] ~= op then
    return nil, 'the function for ' .. op .. ' was called with op ' .. tostring(ARGV[1])
  end
  local s = ARGV[4]
  local reserve = NUMS[s] or num(s) or 0
  if reserve < 0 or reserve > 99 or reserve % 1 ~= 0 then  -- (% 1: no call of floor)
    return nil, 'reserve must be a whole percent from 0 to 99 (got ' .. tostring(s) .. ')'
  end
  s = ARGV[5]
  local nwin = NUMS[s] or num(s) or 0
  s = ARGV[3]
  c.op, c.nwin, c.KEYS, c.ARGV = op, nwin, KEYS, ARGV
  c.id, c.cost, c.ticket, c.lined, c.nring = ARGV[2], NUMS[s] or num(s), nil, false, 0
  local ws, metas = c.ws, c.metas
  metas[1], metas[2] = KEYS[1], KEYS[2]
  local nm, k = 2, 3
  for i = 1, nwin do
    local spec = ARGV[5 + i]
    local p = PROTOS[spec]
    if not p then
      local why
      p, why = proto(spec, i)
      if not p then
        return nil, why
      end
    end
    local w = p.pool[i]
    if not w or w.reserve ~= reserve then
      w = window(p, i, reserve)
    end
    w.dirty, w.ttl, w.xr, w.line = false, false, 0, false
    k = k + p.K.open(w, KEYS, k)
    if p.shadow then
      w.sring, k = KEYS[k], k + 1
    end
    local meta = w.meta
    if meta then
      nm = nm + 1
      metas[nm], w.mi = meta, nm
    end
    ws[i] = w
  end
  c.nm, c.k = nm, k
  return c
end

-- The seconds of the last TIME reply read, and them in µs: the clock's
-- seconds change once a second, and tonumber is dear (see NUMS).
local SEC, SECUS = nil, 0

-- Reads the clock (`t`: a TIME reply already read, or nil), the block and
-- every window's counters (one MGET): c.now, c.seen, c.got, c.blocked.
local function clock(c, t)
  t = t or call('TIME')
  local sec = t[1]
  if sec ~= SEC then
    SEC, SECUS = sec, tonumber(sec) * 1000000
  end
  local now = SECUS + tonumber(t[2])
  local got = call('MGET', unpack(c.metas, 1, c.nm))
  -- Never earlier than the start of any period a fixed window of this
  -- credential counts (fixed.lua, "open").
  local seen = got[2] and tonumber(got[2]) or 0
  if seen > now then
    now = seen
  end
  c.now, c.seen, c.got, c.blocked = now, seen, got, got[1] and tonumber(got[1]) or 0
end
