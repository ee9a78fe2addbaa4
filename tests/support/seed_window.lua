-- Test and benchmark support: appends entries straight into a sliding
-- window's layout (v2, see lua/spend.lua), as if spent at the given times,
-- because spending 100k times could not leave 100k entries to expire at once.
--
-- KEYS  meta, log, ts, adj of one window
-- ARGV  1 id prefix   2 n   3 cost   4 first spend time (µs)   5 step (µs)
--       6 group (entries per time step)   7 the window's period (ms)
-- Entry i is "<prefix><i:07>" at first + floor(i / group) * step. Times must
-- not go back before the window's newest entry (the layout orders entries by
-- position and by time at once). Returns the window's total after the append.

local meta, log, ts = KEYS[1], KEYS[2], KEYS[3]
local prefix, n, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local first, step, group = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local hold = tonumber(ARGV[7]) * 1000

local raw = redis.call('GET', meta)
local total, B, hbase, htot, oldest, last, expires, nadj, stale, dtot, dbase, neg, L, lt, D =
  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
if raw then
  total, B, hbase, htot, oldest, last, expires, nadj, stale, dtot, dbase, neg, L, lt, D = cmsgpack.unpack(raw)
end
if first < last then
  return redis.error_reply('seed: entries must not be older than the window\'s newest')
end

local z = {}
for i = 0, n - 1 do
  local at = first + math.floor(i / group) * step
  total = total + cost
  local id = string.format('%s%07d', prefix, i)
  redis.call('XADD', ts, string.format('%d-%d', total, at), 'd', string.format('%d', dtot))
  z[#z + 1], z[#z + 2] = total, id
  if #z >= 2000 or i == n - 1 then
    redis.call('ZADD', log, unpack(z))
    z = {}
  end
  if oldest == 0 then
    oldest = at
  end
  last = at
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
expires = math.max(expires, last + hold + 1000000, now + 1000000)
local ttl = math.ceil((expires - now) / 1000)
redis.call('PEXPIRE', log, ttl)
redis.call('PEXPIRE', ts, ttl)
redis.call('SET', meta, cmsgpack.pack(total, B, hbase, htot, oldest, last, expires, nadj,
  stale, dtot, dbase, neg, L, lt, D), 'PX', ttl)
return total
