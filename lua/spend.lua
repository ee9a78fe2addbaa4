-- quota-worker: the spend script.
--
-- One script for the four operations on a credential's quota windows, so the
-- window arithmetic exists exactly once: spend, settle, block, peek.
-- Every key is one credential's and carries its `{credential}` hash tag, so the
-- script runs unchanged on Redis Cluster. The clock is Redis TIME (µs); no
-- caller clock is trusted.
--
-- KEYS
--   1  <prefix>:{<credential>}:blocked   string: blocked-until, µs (upstream 429)
--   2  <prefix>:{<credential>}:clock     string: when a fixed window last started a
--                                        period, µs (keeps time monotonic, see below)
--   then, per window, in the order of ARGV[5..]:
--     sliding: <...>:log    zset: request id -> spend time (µs)
--              <...>:units  hash: request id -> units; field "#used" = sum of live units,
--                           "#expires" = when both keys' TTL runs out (µs)
--     fixed:   <...>:fixed  hash: "#period" = period number, "#used", request id -> units
--
-- ARGV
--   1  op: "spend" | "settle" | "block" | "peek"
--   2  spend, settle: request id (unique per upstream request; reusing one only
--      retries that same spend and is never charged twice)
--      block: block duration, ms          peek: ignored
--   3  spend: cost in units (>= 1)        settle: the request's actual cost (>= 0; 0 = refund)
--      block, peek: ignored
--   4  number of windows, n
--   5 .. 4+n  one window each:
--      "sliding:<units>:<period_ms>"
--      "fixed:<units>:<period_ms>:<reset_ms>:<tz>" where reset_ms is the reset's
--      offset from local midnight and <tz> is "<offset_ms>" or
--      "<offset_ms>|<utc_ms>|<offset_ms>|..." (UTC offsets and the instants they
--      start, ascending) — the time zone's rules, so DST shifts the reset.
--
-- Returns
--   spend:  {allowed, remaining, retry_after_ms, rejecting_window}
--           allowed 1/0; remaining = fewest units left across the windows (after
--           this spend when allowed, as it stands when rejected); retry_after_ms =
--           when a spend of this cost would be admitted by every window if nobody
--           else spent (0 when allowed); rejecting_window = 1-based index of the
--           rejecting window that frees last, 0 when allowed or when the credential
--           block is what frees last.
--   settle: {windows_adjusted}
--   block:  {blocked_for_ms}
--   peek:   {blocked_for_ms, used_1, remaining_1, frees_in_ms_1, used_2, ...}
--
-- Cost: a spend adds one entry per window whatever its cost (O(1) memory per
-- call). Used units are a counter, so nothing scans the window: expired entries
-- are removed once each, in batches of BATCH (Lua's unpack limit is ~8000), and
-- a window that is wholly expired is dropped in O(1) (UNLINK: DEL would free a
-- 1M-entry window inline, blocking Redis for seconds). The rejection path reads
-- at most as many entries as the units it needs freed (never more than the cost).

local BATCH = 500
local USED = '#used'
local PERIOD = '#period'
local EXPIRES = '#expires'

local op = ARGV[1]
local nwin = tonumber(ARGV[4])

local function int(n)
  return string.format('%d', n)
end

-- Server time in µs, never earlier than the start of any period a fixed
-- window of this credential counts: a Redis clock stepped backwards (NTP, failover to a
-- skewed replica) would otherwise put `now` in an earlier period than the one
-- a fixed window counts, which would then restart from 0 and admit more than
-- the limit. Sliding windows need no such guard: a clock stepped back makes
-- entries look younger, so they expire later (fewer admitted, never more).
-- Both credential-wide strings are read in one call.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cred = redis.call('MGET', KEYS[1], KEYS[2])
local blocked_until = tonumber(cred[1] or '0')
local seen = tonumber(cred[2] or '0')
if seen > now then
  now = seen
end

local function split(s, sep)
  local out = {}
  for part in string.gmatch(s, '([^' .. sep .. ']+)') do
    out[#out + 1] = part
  end
  return out
end

-- Parse the window specs and assign each its keys.
local windows = {}
local maxper = 1
do
  local k = 3
  for i = 1, nwin do
    local f = split(ARGV[4 + i], ':')
    local w = { kind = f[1], units = tonumber(f[2]), per = tonumber(f[3]) * 1000 }
    if w.per > maxper then
      maxper = w.per
    end
    if w.kind == 'sliding' then
      w.log, w.units_key = KEYS[k], KEYS[k + 1]
      k = k + 2
    elseif w.kind == 'fixed' then
      w.state = KEYS[k]
      w.reset = tonumber(f[4]) * 1000
      -- The zone's table runs ten years ahead; it is parsed only as far as
      -- needed (see cover), usually the first few changes.
      local a, b, off = string.find(f[5], '^(%-?%d+)')
      w.tz, w.tzspec, w.tzpos = { tonumber(off) * 1000 }, f[5], b + 1
      k = k + 1
    else
      return redis.error_reply('ERR quota-worker: unknown window kind ' .. tostring(f[1]))
    end
    windows[i] = w
  end
end

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
  local lo, hi = math.min(utc, wall - actual), math.max(utc, wall - actual)
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
  local off = offset_at(w, now)
  local wall = now + off
  local n = math.floor((wall - w.reset) / w.per)
  local ends = wall_to_utc(w, (n + 1) * w.per + w.reset, now)
  if ends <= now then
    ends = now + 1000
  end
  return n, ends
end

-- Drop a sliding window's expired entries. Returns false when the window is
-- empty or was wholly expired (then dropped in one step), true when it holds
-- live entries. The common case, nothing expired, is one ZRANGE.
local function evict(w)
  local cutoff = now - w.per
  local oldest = redis.call('ZRANGE', w.log, 0, 0, 'WITHSCORES')
  if #oldest > 0 and tonumber(oldest[2]) > cutoff then
    return true
  end
  local newest = #oldest > 0 and redis.call('ZRANGE', w.log, -1, -1, 'WITHSCORES')
  if not newest or tonumber(newest[2]) <= cutoff then
    -- Empty or wholly expired (an idle gap): drop it in one step, however big;
    -- UNLINK frees the memory off the main thread.
    redis.call('UNLINK', w.log, w.units_key)
    return false
  end
  while true do
    local old = redis.call('ZRANGEBYSCORE', w.log, '-inf', cutoff, 'LIMIT', 0, BATCH)
    if #old == 0 then
      break
    end
    local costs = redis.call('HMGET', w.units_key, unpack(old))
    local sum = 0
    for j = 1, #costs do
      sum = sum + (tonumber(costs[j]) or 0)
    end
    redis.call('HDEL', w.units_key, unpack(old))
    redis.call('ZREMRANGEBYRANK', w.log, 0, #old - 1)
    redis.call('HINCRBY', w.units_key, USED, -sum)
  end
  return true
end

-- A window's live units, and whether request `id` is already counted in it
-- (one read per window: the units, the id and, for a sliding window, when
-- its keys expire).
local function state_of(w, id)
  if w.kind == 'sliding' then
    w.expires = 0
    if not evict(w) then
      return 0, false
    end
    local r = redis.call('HMGET', w.units_key, USED, id, EXPIRES)
    w.expires = tonumber(r[3] or '0')
    return tonumber(r[1] or '0'), r[2] ~= false
  end
  local n, ends = period_of(w)
  w.period, w.ends = n, ends
  local r = redis.call('HMGET', w.state, PERIOD, USED, id)
  if tonumber(r[1]) ~= n then
    -- A new period starts at 0; the old one's state is reset on the next write.
    w.stale = true
    return 0, false
  end
  return tonumber(r[2] or '0'), r[3] ~= false
end

-- µs until a sliding window has freed `need` units, oldest entries first. Each
-- entry holds at least one unit, so this reads at most `need` entries.
local function sliding_frees_in(w, need)
  local freed, start = 0, 0
  while true do
    local count = math.min(need - freed, BATCH)
    local rows = redis.call('ZRANGE', w.log, start, start + count - 1, 'WITHSCORES')
    if #rows == 0 then
      return 0
    end
    local ids = {}
    for j = 1, #rows, 2 do
      ids[#ids + 1] = rows[j]
    end
    local costs = redis.call('HMGET', w.units_key, unpack(ids))
    for j = 1, #ids do
      freed = freed + (tonumber(costs[j]) or 0)
      if freed >= need then
        return tonumber(rows[2 * j]) + w.per - now
      end
    end
    start = start + #ids
  end
end

-- µs until `need` units of window `w` are free (0: free now).
local function frees_in(w, need)
  if need <= 0 then
    return 0
  end
  if w.kind == 'fixed' then
    return w.ends - now
  end
  return sliding_frees_in(w, need)
end

local function blocked_for()
  if blocked_until > now then
    return blocked_until - now
  end
  return 0
end

local function ms(us)
  return math.ceil(us / 1000)
end

-- Remembers `now` when a fixed window starts a period (see the top): from
-- then on no `now` falls before that period's start, so none can fall in an
-- earlier period. Spends within a period need not write it. It lives at
-- least as long as the window's state.
local function remember_now(w)
  if seen < now then
    local ttl = math.max(ms(maxper), ms(w.ends - now) + 1000, redis.call('PTTL', KEYS[2]))
    redis.call('SET', KEYS[2], int(now), 'PX', ttl)
    seen = now
  end
end

if op == 'block' then
  local dur = tonumber(ARGV[2]) * 1000
  local until_ = now + dur
  if until_ > blocked_until then
    -- Never shortens a longer block set by another worker.
    redis.call('SET', KEYS[1], int(until_), 'PX', ms(dur))
    blocked_until = until_
  end
  return { ms(blocked_for()) }
end

if op == 'peek' then
  local out = { ms(blocked_for()) }
  for i = 1, nwin do
    local w = windows[i]
    local used = state_of(w, USED)
    local free_in = 0
    if used > 0 then
      if w.kind == 'fixed' then
        free_in = w.ends - now
      else
        local oldest = redis.call('ZRANGE', w.log, 0, 0, 'WITHSCORES')
        free_in = tonumber(oldest[2]) + w.per - now
      end
    end
    out[#out + 1] = used
    out[#out + 1] = math.max(w.units - used, 0)
    out[#out + 1] = ms(free_in)
  end
  return out
end

local id = ARGV[2]
if id == nil or id == '' or string.sub(id, 1, 1) == '#' or id == '{request_id}' then
  return redis.error_reply('ERR quota-worker: request id must be unique, non-empty, not start with "#" (got ' .. tostring(id) .. ')')
end
local cost = tonumber(ARGV[3])

if op == 'settle' then
  if cost == nil or cost < 0 then
    return redis.error_reply('ERR quota-worker: settle cost must be >= 0')
  end
  local adjusted = 0
  for i = 1, nwin do
    local w = windows[i]
    local hash = w.units_key or w.state
    local live = true
    if w.kind == 'fixed' then
      local n = period_of(w)
      live = tonumber(redis.call('HGET', w.state, PERIOD)) == n
    end
    local old = live and tonumber(redis.call('HGET', hash, id))
    -- An entry already expired (or a spend in a past period) needs no settling.
    if old then
      if cost == 0 then
        redis.call('HDEL', hash, id)
        if w.log then
          redis.call('ZREM', w.log, id)
        end
      else
        redis.call('HSET', hash, id, cost)
      end
      redis.call('HINCRBY', hash, USED, cost - old)
      adjusted = adjusted + 1
    end
  end
  return { adjusted }
end

if op ~= 'spend' then
  return redis.error_reply('ERR quota-worker: unknown op ' .. tostring(op))
end
if cost == nil or cost < 1 then
  return redis.error_reply('ERR quota-worker: spend cost must be >= 1')
end

local remaining = nil
local retry, rejecting = 0, 0
local used = {}
local duplicate = false
for i = 1, nwin do
  local w = windows[i]
  local seen_id
  used[i], seen_id = state_of(w, id)
  duplicate = duplicate or seen_id
  local left = w.units - used[i]
  if remaining == nil or left < remaining then
    remaining = left
  end
end
remaining = math.max(remaining or 0, 0)

if duplicate then
  -- A retry of a spend that already happened (its reply was lost): admitted
  -- once, charged once.
  return { 1, remaining, 0, 0 }
end

-- Every window must admit the spend, so it waits for the one that frees last;
-- on a tie the credential block (0) or the lower window index names it.
retry = blocked_for()
for i = 1, nwin do
  local w = windows[i]
  local wait = frees_in(w, used[i] + cost - w.units)
  if wait > retry then
    retry, rejecting = wait, i
  end
end

if retry > 0 then
  return { 0, remaining, ms(retry), rejecting }
end

remaining = nil
for i = 1, nwin do
  local w = windows[i]
  if w.kind == 'sliding' then
    redis.call('ZADD', w.log, now, id)
    redis.call('HINCRBY', w.units_key, USED, cost)
    if w.expires >= now + w.per then
      redis.call('HSET', w.units_key, id, cost)
    else
      -- The keys must outlive this entry by a window. Their TTL is set with
      -- some slack (a quarter window, 1 s to 1 h), so most spends skip the
      -- two PEXPIREs; idle keys linger at most that much longer.
      local slack = math.min(math.max(math.floor(w.per / 4), 1000000), 3600000000)
      redis.call('HSET', w.units_key, id, cost, EXPIRES, int(now + w.per + slack))
      redis.call('PEXPIRE', w.log, ms(w.per + slack))
      redis.call('PEXPIRE', w.units_key, ms(w.per + slack))
    end
  else
    if w.stale then
      -- A period's state expires a second after the period ends: set once.
      remember_now(w)
      redis.call('UNLINK', w.state)
      redis.call('HSET', w.state, PERIOD, w.period, id, cost)
      redis.call('PEXPIRE', w.state, ms(w.ends - now) + 1000)
    else
      redis.call('HSET', w.state, id, cost)
    end
    redis.call('HINCRBY', w.state, USED, cost)
  end
  local left = w.units - used[i] - cost
  if remaining == nil or left < remaining then
    remaining = left
  end
end
return { 1, math.max(remaining, 0), 0, 0 }
