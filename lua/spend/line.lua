-- The waiting line (every kind but concurrent; a spend that names a
-- ticket): a refused spend that will come back is promised the moment its
-- units leave, counting the units promised to the spends refused before it,
-- so refused spends come back in turn instead of all at once (docs/spend.md,
-- "Waiting line"). The line never admits: the window's own count decides,
-- the line only refuses and moves retry-after moments.
--
-- A sliding window's line is a sequence of units: the window's live entries
-- spent before the line began (positions up to q0), then the line's own
-- entries, positions qb+1 .. qt, each a member "<position>:<moment µs>"
-- scored by its position: a promise (the moment the spend was told) or a
-- spend admitted while the line waited (when it was spent). Each leaves a
-- window after its moment, as entries do. A refused spend of cost c is
-- promised the moment the n-th unit of the sequence leaves, n = its units +
-- c - lim, plus a slack (a waiter woken late must not find the unit it waits
-- for still held by the one before it, woken late too), and goes at the
-- end; its ticket is a member "t:<ticket>" scored by minus its entry's
-- position. A ticket come back is admitted if the window admits it (early:
-- told its turn again; late and full: when the window holds it behind the
-- waiters ahead of it yet to spend, keeping its place);
-- any other spend also needs its turn to be now, and once admitted takes its
-- place in the line. The counters hold qt, qb, q0, qf (when the first entry
-- after qb leaves: until then nothing is read to move qb) and qe (when the
-- last leaves: the line is over).
--
-- A bucket's line is a level of its own: qt is the level the line has
-- promised (units x quanta) at time qf, qe when it has drained; a refused
-- spend is promised the moment that level (at least the bucket's own) has
-- drained enough for its cost, which is then added to it; tickets are
-- scored by their turn.
--
-- A fixed window's line counts the units promised to each future period: a
-- refused spend is promised the first period whose unpromised units fit it
-- (from its own, when another window makes it wait past this one) and waits
-- for its start; a spend in the current period leaves its unspent promised
-- units free (for a grace after the period starts: a waiter that never
-- comes back holds them no longer).
--
-- Each kind's line is a table (Line[kind]; concurrent windows keep none) of:
--   turn(w, c)            brings the line to now; w.turn = µs until this
--                         spend's turn (0: now), w.mine = the waiter's own
--                         place when c.ticket came back
--   book(w, c, retry, rejecting)  a refused spend books its turn now, where
--                         booking can move the retry later (fixed periods)
--   promise(w, c, at)     a refused spend is promised `at`, behind everyone
--   admitted(w, c)        an admitted spend gives its ticket up or takes
--                         its place in the line

local SlidingLine, BucketLine, FixedLine = {}, {}, {}
Line.sliding, Line.bucket, Line.fixed = SlidingLine, BucketLine, FixedLine

-- The line's TTL: until its last promise (qe) has left, and a second.
local function line_ttl(w, now)
  call('PEXPIRE', w.line, ceil((w.qe - now) / 1000) + 1000)
end

-- ------------------------------------------------------------ sliding

-- µs from now until a spend of `cost` units fits behind the line: until the
-- n-th unit of the line's sequence has left, n = its units + cost - lim.
-- Settles are not counted (the line never admits: an estimate that is off
-- costs a refusal, never an excess).
local function sliding_turn(w, c, cost)
  local r0 = max(min(w.q0 - w.B, w.sused), 0)
  local n = r0 + (w.qt - w.qb) + cost - w.lim
  if n <= 0 then
    return 0
  end
  local at
  if n <= r0 then
    local row = call('XRANGE', w.ts, w.B + n, '+', 'COUNT', 1)[1]
    at = row and tonumber(match(row[1], '%-(%d+)$'))
  else
    -- A unit of the line's own: a waiter's, who may spend it later than
    -- promised (see the slack).
    local r = call('ZRANGEBYSCORE', w.line, w.qb + n - r0, '+inf', 'LIMIT', 0, 1)[1]
    at = r and tonumber(match(r, '^%d+:(%d+)$'))
    w.slack = true
  end
  if not at then
    return w.hold
  end
  return max(at + w.hold - c.now, 0)
end

-- µs from now until a waiter whose turn has come, into a full window,
-- fits behind the waiters ahead of it that have not spent yet (tickets at
-- positions before its own, `pos`): the units ahead of it are held by
-- spends made later than promised (a waiter woken late), and those waiters
-- spend before it. Not the window's next unit, which every waiter of its
-- wave refused now would be told, to come back together and be refused
-- again, each but one: a herd again. A waiter counts 1 unit here (a ticket
-- does not keep its cost); with more waiting than the window holds, a
-- window from now.
local function late_turn(w, c, pos)
  local ahead = call('ZCOUNT', w.line, format('%d', c.cost - pos), format('%d', -(w.qb + 1)))
  local target = w.lim - c.cost - ahead
  if target < 0 then
    return w.hold
  end
  return w.K.frees(w, c, target)
end

function SlidingLine.turn(w, c)
  local now = c.now
  if w.qe ~= 0 and w.qe <= now then
    -- Over: every promise's entry has left the window.
    w.qt, w.qb, w.qf, w.qe, w.q0, w.dirty = 0, 0, 0, 0, 0, true
  end
  if w.qt > 0 and w.qf ~= 0 and w.qf <= now then
    -- Entries that have left move the line's base past them; they and
    -- their tickets are dropped (at most SCAN a call).
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
      call('ZREMRANGEBYSCORE', w.line, 1, qb)
      call('ZREMRANGEBYSCORE', w.line, -qb, '(0')
      w.qb = qb
    end
    w.qf, w.dirty = qf, true
  end
  if w.qt > 0 then
    -- A waiter come back: its ticket's score is minus its entry's position.
    local v = c.ticket ~= '' and tonumber(call('ZSCORE', w.line, 't:' .. c.ticket))
    if v then
      local e = call('ZRANGEBYSCORE', w.line, -v, -v, 'LIMIT', 0, 1)[1]
      w.mine = { -v, tonumber(match(e or '', '^%d+:(%d+)$')) or now }
      -- Its units were promised: only the window itself decides, but a
      -- waiter early for its turn waits for it.
      if w.used + c.cost > w.lim then
        if w.mine[2] > now then
          w.turn = w.mine[2] - now
        else
          w.turn = late_turn(w, c, -v)
        end
      end
    else
      -- Everyone else waits for their turn behind the line.
      w.turn = sliding_turn(w, c, c.cost)
    end
  end
end

function SlidingLine.book(_, _, retry, rejecting)
  return retry, rejecting
end

function SlidingLine.promise(w, c, at)
  if w.qt == 0 then
    -- A new line: tickets left by one that is over go.
    call('UNLINK', w.line)
    w.q0, w.qb = w.total, 0
  end
  w.qt = w.qt + c.cost
  call('ZADD', w.line, w.qt, format('%d:%d', w.qt, at), -w.qt, 't:' .. c.ticket)
  if w.qf == 0 or at + w.hold < w.qf then
    w.qf = at + w.hold
  end
  -- Its TTL every time (see admitted's).
  w.qe = max(w.qe, at + w.hold)
  line_ttl(w, c.now)
  w.dirty = true
end

-- A waiter come back gives its ticket up; its entry in the line moves to
-- when it really spent (later than promised: the waiters promised its units
-- after it are then refused once rather than admitted into a full window by
-- nobody). A spend admitted while a line waits takes its place in it, so
-- the promises made after it count its units.
function SlidingLine.admitted(w, c)
  local now = c.now
  if w.mine then
    local v, was = w.mine[1], w.mine[2]
    if now > was then
      call('ZREM', w.line, 't:' .. c.ticket, format('%d:%d', v, was))
      call('ZADD', w.line, v, format('%d:%d', v, now))
      if now + w.hold > w.qe then
        -- Its entry (and the line) leave later.
        w.qe, w.dirty = now + w.hold, true
        line_ttl(w, now)
      end
    else
      call('ZREM', w.line, 't:' .. c.ticket)
    end
  elseif w.qt > 0 then
    w.qt = w.qt + c.cost
    call('ZADD', w.line, w.qt, format('%d:%d', w.qt, now))
    if w.qf == 0 or now + w.hold < w.qf then
      w.qf = now + w.hold
    end
    -- Its TTL every time: the ZADD made the key if something deleted it
    -- while the counters still held the line, and no key lives without one.
    w.qe = max(w.qe, now + w.hold)
    line_ttl(w, now)
    w.dirty = true
  end
end

-- ------------------------------------------------------------ bucket

-- The line's level (what it has promised, at time qf) at time t >= qf.
local function vlevel(w, t)
  if t <= w.qf then
    return w.qt
  end
  return max(w.qt - floor((t - w.qf) / w.q) * w.units, 0)
end

-- µs from now until a spend of `cost` units fits the bucket behind its line:
-- when the line's level (at least the bucket's own, now) has drained enough.
local function bucket_turn(w, c, cost)
  local now = c.now
  local t0 = max(now, w.qf)
  local v = vlevel(w, t0)
  if t0 == now and w.L > v then
    v = w.L
  end
  local excess = v + (cost - w.lim) * w.perq
  if excess <= 0 then
    return t0 - now
  end
  w.slack = true
  return t0 + ceil(excess / w.units) * w.q - now
end

function BucketLine.turn(w, c)
  local now = c.now
  if w.qe ~= 0 and w.qe <= now then
    -- Over: the line's level has drained.
    w.qt, w.qf, w.qe, w.dirty = 0, 0, 0, true
  end
  if w.qe ~= 0 then
    -- A waiter come back: its ticket's score is its turn.
    local m = c.ticket ~= '' and tonumber(call('ZSCORE', w.line, 't:' .. c.ticket))
    if m then
      w.mine = { 0, m }
      if w.used + c.cost > w.lim and m > now then
        w.turn = m - now
      end
    else
      w.turn = bucket_turn(w, c, c.cost)
    end
  end
end

BucketLine.book = SlidingLine.book

-- The line's level at `at`, plus this cost.
function BucketLine.promise(w, c, at)
  local now = c.now
  if w.qe == 0 then
    call('UNLINK', w.line)
    w.qt, w.qf = w.L, now
  end
  local t = max(at, w.qf)
  w.qt, w.qf = vlevel(w, t) + c.cost * w.perq, t
  w.qe = t + ceil(w.qt / w.units) * w.q
  call('ZADD', w.line, at, 't:' .. c.ticket)
  -- Tickets whose turn passed a window ago: their waiters did not come
  -- back (or will as fresh spends).
  call('ZREMRANGEBYSCORE', w.line, '-inf', format('(%d', now - w.per))
  line_ttl(w, now)
  w.dirty = true
end

function BucketLine.admitted(w, c)
  local now = c.now
  if w.mine then
    call('ZREM', w.line, 't:' .. c.ticket)
  elseif w.qe ~= 0 then
    -- Its cost joins the line's level (the bucket's own already holds it).
    if w.qf <= now then
      w.qt, w.qf = max(vlevel(w, now) + c.cost * w.perq, w.L), now
    else
      w.qt = w.qt + c.cost * w.perq
    end
    local qe = w.qf + ceil(w.qt / w.units) * w.q
    if qe > w.qe then
      w.qe = qe
      line_ttl(w, now)
    end
    w.dirty = true
  end
end

-- ------------------------------------------------------------ fixed

-- Units promised per future period ("p:<period>"), and each waiter's
-- period ("t:<ticket>").
function FixedLine.turn(w, c)
  local now, cost = c.now, c.cost
  local r = call('HMGET', w.line, 'p:' .. w.period, 't:' .. c.ticket)
  w.owed = tonumber(r[1]) or 0
  local mp = tonumber(r[2])
  if w.owed > 0 and now > Fixed.start(w, w.period, now) + min(max(floor(w.per / 100), 1000000), 60000000) then
    -- Past a grace after the period's start, units promised in it and not
    -- yet spent are free again: a waiter that never comes back holds them
    -- no longer.
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
    -- This period's free units are promised (or there are none): a waiter
    -- early for its period waits for it, anyone else at least for the next.
    w.turn = (w.mine and Fixed.start(w, mp, now) or w.ends) - now
  end
end

-- The first period, from the one holding the moment the other windows
-- name, whose unpromised units fit the cost (looking 64 periods ahead at
-- most); the spend waits for its start.
function FixedLine.book(w, c, retry, rejecting)
  if w.mine then
    return retry, rejecting
  end
  local now, cost = c.now, c.cost
  local q = w.period
  if now + retry >= w.ends then
    q = Fixed.period_of(w, now + retry)
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
  if q > w.period and Fixed.start(w, q, now) - now > retry then
    retry, rejecting = Fixed.start(w, q, now) - now, w.i
  end
  call('HINCRBY', w.line, 'p:' .. q, cost)
  call('HSET', w.line, 't:' .. c.ticket, q)
  -- The line lives until the last period it promises ends.
  local ttl = ceil((Fixed.start(w, q + 1, now) - now) / 1000) + 1000
  if call('PTTL', w.line) < ttl then
    call('PEXPIRE', w.line, ttl)
  end
  return retry, rejecting
end

function FixedLine.promise()
end

-- Its promise is spent.
function FixedLine.admitted(w, c)
  if w.mine then
    call('HINCRBY', w.line, 'p:' .. w.mine[1], -c.cost)
    call('HDEL', w.line, 't:' .. c.ticket)
  end
end
