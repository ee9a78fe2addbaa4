-- The spend history (optional, ARGV 6+n .. 9+n): an admitted spend adds its
-- cost to the current slot of each ring, a settle the change it made, on
-- the call's clock. A ring is a fixed-size string of unsigned 32-bit
-- counters (BITFIELD, saturating at 0): counter 0 holds the newest slot
-- written, counter 1 + (slot mod slots) that slot's units. Slots skipped
-- since the newest are zeroed before reuse, a ring idle for `slots` slots
-- is dropped whole, and one whose newest slot began its TTL ago expires.

-- The rings' arguments of a spend or settle, checked (c.nring = 0: none),
-- and (`ticket`: a spend that names one) the waiting lines' keys, one per
-- window that keeps a line (every enforced window but concurrent ones),
-- after the rings' keys. Returns why not.
function Ring.parse(c)
  local ARGV, KEYS, n = c.ARGV, c.KEYS, c.nwin
  local s = ARGV[6 + n]
  local nring = NUMS[s] or num(s) or 0
  local nline, lk = 0, c.k + nring
  if c.op == 'spend' and ARGV[10 + n] ~= nil then
    c.ticket = ARGV[10 + n]
    local ws = c.ws
    for i = 1, n do
      local w = ws[i]
      if Line[w.kind] and not w.shadow then
        w.line, w.mine, w.turn, w.slack, w.owed = KEYS[lk], false, 0, false, 0
        if not w.line then
          return 'a spend with a waiting line passes one line key per window but concurrent ones after the rings\' keys'
        end
        lk, nline = lk + 1, nline + 1
      end
    end
    if KEYS[lk] ~= nil then
      return 'a spend with a waiting line passes one line key per window but concurrent ones after the rings\' keys, and no more'
    end
  end
  if nring > 0 then
    local slot_ms, nslot, ttl = num(ARGV[7 + n]), num(ARGV[8 + n]), num(ARGV[9 + n])
    if not (slot_ms and slot_ms >= 1 and nslot and nslot >= 1 and ttl and ttl >= 1) then
      return 'the spend history takes a ring count, a slot length (ms), a slot count and a TTL (ms)'
    end
    if KEYS[c.k + nring - 1] == nil or KEYS[c.k + nring + nline] ~= nil then
      return 'the spend history names ' .. nring .. ' ring(s); pass exactly that many keys after the windows\' keys'
    end
    c.nring, c.slot_ms, c.nslot, c.ring_ttl = nring, slot_ms, nslot, ttl
  end
end

-- Adds `units` to the current slot of ring `ring`, slot `now_slot`.
local function bump(c, ring, now_slot, units)
  local nslot = c.nslot
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
    -- Its TTL runs from the first write of its newest slot: by the time
    -- it ends (a TTL of the ring's span plus a slot) that slot has left
    -- the span, so nothing expires that a reader would show, and the
    -- other writes of the slot skip the PEXPIRE.
    call('PEXPIRE', ring, c.ring_ttl)
  elseif slot < newest then
    -- The clock is never behind the newest slot but for a failover to a
    -- skewed replica: count in the newest slot, not a passed one.
    slot = newest
  end
  call('BITFIELD', ring, 'OVERFLOW', 'SAT', 'INCRBY', 'u32', '#' .. (1 + slot % nslot), units)
end

-- Adds `units` to the current slot of each ring.
function Ring.add(c, units)
  if c.nring == 0 or units == 0 then
    return
  end
  local KEYS = c.KEYS
  local now_slot = floor(floor(c.now / 1000) / c.slot_ms)
  for r = c.k, c.k + c.nring - 1 do
    bump(c, KEYS[r], now_slot, units)
  end
end

-- Counts one shadow refusal of window w in its ring (the spend history's
-- settings: none kept when the call keeps no history).
function Ring.shadow(c, w)
  if c.nring == 0 then
    return
  end
  bump(c, w.sring, floor(floor(c.now / 1000) / c.slot_ms), 1)
end
