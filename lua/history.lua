-- quota-worker: add units to the 24-hour spend history the status page charts.
--
-- One ring per credential and scope (the credential's windows, or one
-- endpoint's own), stored as a string of unsigned 32-bit counters read and
-- written with BITFIELD: a fixed 1,156 bytes however busy the credential is,
-- and one O(1) update per call. Counter 0 holds the newest slot written
-- (5-minute slots since the epoch, on the Redis clock, as the spend script's
-- clock); counter 1 + (slot mod SLOTS) holds the units spent in that slot.
-- Slots skipped since the newest one are zeroed before they are reused, and
-- a ring idle for SLOTS slots is dropped whole. A ring not written for its
-- TTL expires by itself.
--
-- Called by the worker after each admitted spend (+cost) and after a settle
-- or refund (the difference, which may be negative: counters saturate at 0).
-- It is meant to move into lua/spend.lua once the v2 script can run extra
-- work in the same call, so that recording costs no round trip of its own.
--
-- KEYS
--   1..n  <prefix>:{<credential>}:spent:<scope>   string: the rings to add to
--
-- ARGV
--   1  units to add (an integer, negative to take back)
--   2  slot length, ms (300000)
--   3  slots kept (288: 24 hours)
--   4  TTL of the rings, ms
--
-- Returns: 1

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local units = tonumber(ARGV[1])
local n = tonumber(ARGV[3])
local now_slot = math.floor(now_ms / tonumber(ARGV[2]))

local function at(slot)
  return '#' .. string.format('%d', 1 + slot % n)
end

for _, key in ipairs(KEYS) do
  local newest = redis.call('BITFIELD', key, 'GET', 'u32', '#0')[1]
  local slot = now_slot
  if slot > newest then
    if slot - newest >= n then
      redis.call('DEL', key)
    else
      local zero = {}
      for s = newest + 1, slot do
        zero[#zero + 1] = 'SET'
        zero[#zero + 1] = 'u32'
        zero[#zero + 1] = at(s)
        zero[#zero + 1] = 0
      end
      redis.call('BITFIELD', key, unpack(zero))
    end
    redis.call('BITFIELD', key, 'SET', 'u32', '#0', string.format('%d', slot))
  else
    -- The Redis clock stepped back (a failover to a skewed replica): count
    -- in the newest slot rather than in one the ring has moved past.
    slot = newest
  end
  redis.call('BITFIELD', key, 'OVERFLOW', 'SAT', 'INCRBY', 'u32', at(slot), string.format('%d', units))
  redis.call('PEXPIRE', key, ARGV[4])
end
return 1
