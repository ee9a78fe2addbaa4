-- Settled entries of the id log (log.lua, "Settle"): a settle changes a
-- sliding or bucket window's entry to its actual cost with an adjustment
-- record, and retry-after (Log.frees) reads them back.

local function adj_parse(m)
  local c, h, d = match(m, '^(%d+):(%-?%d+):(%-?%d+)$')
  return tonumber(c), tonumber(h), tonumber(d)
end

-- Zero-padded, so records of equal score sort by position.
local function adj_member(c, h, d)
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

-- Its adjustment record of the entry at position C (if settled before), the
-- records after it, and the running adjustment total before it. Records are
-- in position order, so they are read from the newest back to it.
local function records_from(w, C)
  local d_old, h_prev, later = 0, w.hbase, {}
  if w.nadj == 0 then
    return d_old, h_prev, later
  end
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
  return d_old, h_prev, later
end

-- Settles the entry of request c.id to c.cost units: the change in its
-- units (actual - before), or nil when the window does not hold it.
function Log.settle(w, c)
  local id, actual = c.id, c.cost
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
  local d_old, h_prev, later = records_from(w, C)
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
    local cc, h, d = adj_parse(later[j])
    adds[#adds + 1] = cc - (h + delta)
    adds[#adds + 1] = adj_member(cc, h + delta, d)
  end
  chunked('ZREM', w.adj, later, 1)
  if #adds > 0 then
    chunked('ZADD', w.adj, adds, 2)
    call('PEXPIRE', w.adj, max(ceil((w.expires - c.now) / 1000), 1))
  end
  w.htot = w.htot + delta
  if actual == 0 then
    -- Refunded: the id is forgotten, so spending it again is a new spend.
    call('ZREM', w.log, id)
  end
  w.dirty = true
  return actual - before
end
