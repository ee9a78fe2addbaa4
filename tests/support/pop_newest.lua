-- Test and benchmark support: takes a window's newest entry back out, as if
-- it had never been spent (layout v2, see lua/spend.lua), so that a
-- benchmark's every spend meets the same number of entries.
--
-- KEYS  meta, log, ts, adj of one sliding window
-- ARGV  1 the request id of the newest entry
-- Returns the units it held.

local meta, log, ts = KEYS[1], KEYS[2], KEYS[3]
local total, B, hbase, htot, oldest, last, expires, nadj, stale, dtot, dbase, neg, L, lt, D =
  cmsgpack.unpack(redis.call('GET', meta))
local rows = redis.call('XREVRANGE', ts, '+', '-', 'COUNT', 2)
local c = tonumber(string.match(rows[1][1], '^(%d+)'))
if c ~= total or tonumber(redis.call('ZSCORE', log, ARGV[1])) ~= c then
  return redis.error_reply('pop: ' .. ARGV[1] .. ' is not the newest entry')
end
local prev, prev_at = B, 0
if rows[2] then
  local p, t = string.match(rows[2][1], '^(%d+)%-(%d+)$')
  prev, prev_at = tonumber(p), tonumber(t)
end
redis.call('XDEL', ts, rows[1][1])
-- The stream remembers the newest id it gave; positions go back with it.
redis.call('XSETID', ts, rows[2] and rows[2][1] or '0-1')
redis.call('ZREM', log, ARGV[1])
if prev <= B then
  oldest, prev_at = 0, 0
end
redis.call('SET', meta, cmsgpack.pack(prev, B, hbase, htot, oldest, prev_at, expires, nadj,
  stale, dtot, dbase, neg, L, lt, D), 'KEEPTTL')
return total - prev
