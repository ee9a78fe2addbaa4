-- The operations: spend, settle, block, peek, sync, undrift (core.lua's
-- header has their KEYS, ARGV and replies). Each checks its arguments
-- before it reads or writes anything, so a refused call changes nothing.

-- Brings every window to c.now (expired entries and leases leave).
local function bring(c)
  local ws = c.ws
  for i = 1, c.nwin do
    local w = ws[i]
    w.K.load(w, c)
  end
end

-- Writes back every window's changed state.
local function save(c)
  local ws = c.ws
  for i = 1, c.nwin do
    local w = ws[i]
    w.K.save(w, c)
  end
end

-- Why request id `id` cannot be spent or settled, or nil.
local function bad_id(id)
  if id == nil or id == '' or byte(id, 1) == 35 or id == '{request_id}' then  -- 35: '#'
    return 'request id must be unique, non-empty, not start with "#" (got ' .. tostring(id) .. ')'
  end
end

-- Why `cost` (ARGV[3]) is not a whole number from `least` to 2^53 - 1
-- (every count here is below 2^53: a larger one would be rounded), or nil.
local function bad_count(c, what, least)
  local n = c.cost
  if n == nil or n < least or n >= MAXPOS or n % 1 ~= 0 then
    return what .. ' must be a whole number from ' .. least .. ' to 2^53 - 1 (got ' .. tostring(c.ARGV[3]) .. ')'
  end
end

-- µs until window w counts at most `target` units, reset-bound drift xr
-- included: counted until rdt, gone after.
local function frees_in(w, c, target)
  if w.xr > 0 then
    local left = w.rdt - c.now
    if target >= w.xr then
      local before = w.K.frees(w, c, target - w.xr)
      if before < left then
        return before
      end
    end
    return max(left, w.K.frees(w, c, target))
  end
  return w.K.frees(w, c, target)
end

-- ------------------------------------------------------------ spend

-- A refused spend: every enforced window must admit it, so it waits for the
-- one that frees last; on a tie the credential block (0) or the lower window
-- index names it. A spend that names a ticket is promised its turn. Shadow
-- windows name no wait, and are not asked whether they hold the spend (one
-- does not hold a spend it would have refused).
local function refuse(c, remaining)
  local now, cost, ws = c.now, c.cost, c.ws
  local retry, rejecting = max(c.blocked - now, 0), 0
  local best
  for i = 1, c.nwin do
    local w = ws[i]
    if w.shadow then
      -- neither a wait nor a line
    elseif w.used + cost > w.lim then
      local wait = frees_in(w, c, w.lim - cost)
      if w.K.momentary then
        wait = min(wait, SOON)
      end
      if wait > retry then
        retry, rejecting = wait, i
      end
    end
    -- The line's turn (line.lua).
    if w.line and w.turn > retry then
      retry, rejecting = w.turn, i
    end
    if not w.shadow and (not best or w.K.keeps(w) > best.K.keeps(best)) then
      best = w
    end
  end
  -- A retry of a spend that was admitted (its reply was lost) is admitted
  -- again, not charged again. Asked only of a refused spend (an admitted
  -- one finds out when it records), and only of the window that remembers
  -- ids longest: every window of a spend records it at once, and a refund
  -- forgets it in all of them.
  if best and best.K.holds(best, c) then
    save(c)
    return { 1, remaining, 0, 0 }
  end
  if c.lined and c.ticket ~= '' then
    for i = 1, c.nwin do
      local w = ws[i]
      if w.line then
        retry, rejecting = Line[w.kind].book(w, c, retry, rejecting)
      end
    end
    -- A waiter whose turn comes after units promised to other waiters comes
    -- back a little after they leave (a slack of 1/200 of the window, 5 to
    -- 250 ms): a waiter woken a few ms late spends a few ms late, and the
    -- one after it must not find that unit still held. Each window it
    -- waits in promises it its cost at that moment, behind everyone else
    -- (a waiter come back keeps its place: its promise stands).
    local slack = 0
    for i = 1, c.nwin do
      local w = ws[i]
      if w.line and w.slack then
        slack = max(slack, min(max(floor(w.per / 200), 5000), 250000))
      end
    end
    retry = retry + slack
    for i = 1, c.nwin do
      local w = ws[i]
      if w.line and not w.mine then
        Line[w.kind].promise(w, c, now + retry)
      end
    end
  end
  save(c)
  return { 0, remaining, ceil(retry / 1000), rejecting }
end

-- An admitted spend: the id is recorded in every window first; a window
-- that already holds it makes this a retry of a spend that happened (its
-- reply was lost): admitted once, charged once, and the records just added
-- are taken back. A shadow window that would refuse it (`over`) records
-- nothing, and the spend is its shadow refusal (c.nover of them).
local function admit(c, remaining)
  local ws, n, cost = c.ws, c.nwin, c.cost
  for i = 1, n do
    local w = ws[i]
    if not w.over and not w.K.record(w, c) then
      for j = 1, i - 1 do
        local u = ws[j]
        if not u.over then
          u.K.unrecord(u, c)
        end
      end
      save(c)
      return { 1, remaining, 0, 0 }
    end
  end
  remaining = nil
  for i = 1, n do
    local w = ws[i]
    if not w.shadow then
      local left = w.lim - w.used - cost
      if remaining == nil or left < remaining then
        remaining = left
      end
    end
    if not w.over and not w.K.admit(w, c) then
      return fail('window ' .. i .. ' ran out of positions; delete its keys')
    end
  end
  if c.lined then
    for i = 1, n do
      local w = ws[i]
      if w.line then
        Line[w.kind].admitted(w, c)
      end
    end
  end
  for i = 1, n do
    local w = ws[i]
    w.K.save(w, c)
  end
  if c.nring > 0 then
    Ring.add(c, cost)
  end
  if not remaining or remaining < 0 then
    remaining = 0
  end
  local out = { 1, remaining, 0, 0 }
  if c.nover > 0 then
    for i = 1, n do
      local w = ws[i]
      if w.over then
        out[#out + 1] = i
        Ring.shadow(c, w)
      end
    end
  end
  return out
end

-- `t`: a TIME reply the caller read (the claim's), or nil.
function Ops.spend(KEYS, ARGV, t)
  local c, why = parse(KEYS, ARGV, 'spend')
  -- (the history's arguments, if any: none, and the one script need not
  -- define Ring's functions)
  why = why or (ARGV[6 + c.nwin] ~= nil and Ring.parse(c)) or bad_id(c.id) or bad_count(c, 'spend cost', 1)
  if why then
    return fail(why)
  end
  local cost, ws, n = c.cost, c.ws, c.nwin
  for i = 1, n do
    local w = ws[i]
    if cost > w.lim and not w.shadow then
      return fail('cost ' .. cost .. ' can never fit window ' .. i .. ' (' .. w.lim .. ' units with the reserve)')
    end
  end
  clock(c, t)
  local rejected, remaining, nover = c.blocked > c.now, nil, 0
  for i = 1, n do
    local w = ws[i]
    w.K.load(w, c)
    local left = w.lim - w.used
    if not w.shadow then
      if remaining == nil or left < remaining then
        remaining = left
      end
      if cost > left then
        rejected = true
      end
    else
      -- What it would refuse, it counts and does not record (admit).
      local over = cost > left
      w.over = over
      if over then
        nover = nover + 1
      end
    end
  end
  c.nover = nover
  if not remaining or remaining < 0 then
    remaining = 0
  end
  if c.ticket then
    -- Each window's line, brought to now, and this spend's turn in it.
    for i = 1, n do
      local w = ws[i]
      if w.line then
        c.lined = true
        Line[w.kind].turn(w, c)
        if w.turn > 0 then
          rejected = true
        end
      end
    end
  end
  if rejected then
    return refuse(c, remaining)
  end
  return admit(c, remaining)
end

-- ------------------------------------------------------------ the others

-- Settles request c.id to its actual cost (ARGV[3]) in every window that
-- holds it: {windows adjusted}. The history gets the change in the spend's
-- units, as the first window that held it saw it (every window of a spend
-- recorded the same cost); a spend on concurrent windows alone has only its
-- lease's.
function Ops.settle(KEYS, ARGV)
  local c, why = parse(KEYS, ARGV, 'settle')
  why = why or (ARGV[6 + c.nwin] ~= nil and Ring.parse(c)) or bad_id(c.id) or bad_count(c, 'settle cost', 0)
  if why then
    return fail(why)
  end
  clock(c)
  bring(c)
  local adjusted, changed, leased = 0, nil, nil
  local ws = c.ws
  for i = 1, c.nwin do
    local w = ws[i]
    local change, lease = w.K.settle(w, c)
    if change then
      adjusted = adjusted + 1
      if lease then
        leased = leased or change
      else
        changed = changed or change
      end
    end
  end
  save(c)
  changed = changed or leased
  if changed then
    Ring.add(c, changed)
  end
  return { adjusted }
end

-- Blocks the credential for ARGV[2] ms, never shortening a longer block set
-- by another worker: {blocked_for_ms}.
function Ops.block(KEYS, ARGV)
  local c, why = parse(KEYS, ARGV, 'block')
  if not c then
    return fail(why)
  end
  -- A whole number of ms below 2^53 (the largest integer a Lua number holds
  -- exactly; a longer text rounds).
  local ms = tonumber(ARGV[2])
  if ms == nil or ms < 1 or ms >= MAXPOS or ms ~= floor(ms) then
    return fail('block duration must be a whole number of ms from 1 to 2^53 - 1 (got ' .. tostring(ARGV[2]) .. ')')
  end
  clock(c)
  local now, blocked = c.now, c.blocked
  local dur = ms * 1000
  if now + dur > blocked then
    blocked = now + dur
    call('SET', KEYS[1], blocked, 'PX', ceil(dur / 1000))
  end
  return { ceil(max(blocked - now, 0) / 1000) }
end

-- Every window's usage (drops what expired on the way, which changes no
-- answer).
function Ops.peek(KEYS, ARGV)
  local c, why = parse(KEYS, ARGV, 'peek')
  if not c then
    return fail(why)
  end
  clock(c)
  bring(c)
  local out = { ceil(max(c.blocked - c.now, 0) / 1000) }
  local ws = c.ws
  for i = 1, c.nwin do
    local w = ws[i]
    out[#out + 1] = w.used
    out[#out + 1] = max(w.units - w.used, 0)
    out[#out + 1] = w.used > 0 and ceil(frees_in(w, c, w.used - 1) / 1000) or 0
    out[#out + 1] = w.drift
    out[#out + 1] = w.K.leases(w)
  end
  save(c)
  return out
end

-- The upstream says ARGV[3] units are left on the limit window ARGV[2]
-- mirrors: what the window would admit beyond that is recorded as drift.
-- Drift only ever lowers what it admits: {drift recorded}.
function Ops.sync(KEYS, ARGV)
  local c, why = parse(KEYS, ARGV, 'sync')
  if not c then
    return fail(why)
  end
  local n, reset = match(ARGV[2] or '', '^(%d+):?(%d*)$')
  n, reset = tonumber(n) or 0, tonumber(reset)
  local w = n >= 1 and n <= c.nwin and c.ws[n]
  local left = c.cost
  if not w or not left or left < 0 or left >= MAXPOS or left ~= floor(left)
    or (reset and (reset < 1 or reset >= MAXPOS / 1000)) then
    return fail('sync takes a window number (with ":<ms>" until the upstream resets, 1 ms to 2^53 µs) and the upstream\'s remaining units (a whole number from 0 to 2^53 - 1)')
  end
  clock(c)
  bring(c)
  local drift = w.units - w.used - left
  if drift > 0 then
    drift = w.K.sync(w, c, drift, reset)
    if not drift then
      save(c)
      return fail('window ' .. w.i .. ' ran out of positions; delete its keys')
    end
  else
    drift = 0
  end
  save(c)
  return { drift }
end

-- Forgets every window's drift: {forgotten_1, forgotten_2, ...}.
function Ops.undrift(KEYS, ARGV)
  local c, why = parse(KEYS, ARGV, 'undrift')
  if not c then
    return fail(why)
  end
  clock(c)
  bring(c)
  local out, ws = {}, c.ws
  for i = 1, c.nwin do
    local w = ws[i]
    out[i] = w.K.undrift(w, c)
  end
  save(c)
  return out
end
