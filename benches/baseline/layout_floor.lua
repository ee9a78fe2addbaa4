-- Benchmark baseline (benches/quota, section "anatomy"): the floor of
-- lua/spend.lua's layout for an admitted spend on one sliding window.
--
-- Not a limiter: it checks nothing and never refuses. It runs only the Redis
-- calls and encodings that any admission must make in a layout that keeps,
-- per spend, a request id (idempotent retries, settle) apart from a record of
-- where the spend sits in time and in units (exact weighted retry-after,
-- eviction without reading entries), plus the window's counters: read the
-- clock and the counters, record the id, append the entry, write the
-- counters back. spend.lua on the same call can only be slower than this;
-- the gap between the two is what spend.lua's own logic costs.
--
-- KEYS  1 block  2 clock  3 counters (string)  4 ids (zset)  5 entries (stream)
-- ARGV  1 request id  2 cost
-- Returns {1, 0, 0, 0}, the shape of spend.lua's reply.

local call = redis.call
local t = call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local got = call('MGET', KEYS[1], KEYS[2], KEYS[3])
-- The 15 counters spend.lua keeps per window, in its encoding.
local total, b, hb, ht, oldest, last, expires, nadj, stale, dt, db, neg, l, lt, d =
  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
if got[3] then
  total, b, hb, ht, oldest, last, expires, nadj, stale, dt, db, neg, l, lt, d = cmsgpack.unpack(got[3])
end
local C = string.format('%d', total + tonumber(ARGV[2]))
call('ZADD', KEYS[4], 'NX', C, ARGV[1])
local at = math.max(now, last)
call('XADD', KEYS[5], C .. '-' .. string.format('%d', at), 'd', '0')
local packed = cmsgpack.pack(tonumber(C), b, hb, ht, oldest, at, expires, nadj, stale, dt, db, neg, l, lt, d)
if got[3] then
  call('SET', KEYS[3], packed, 'KEEPTTL')
else
  call('SET', KEYS[3], packed, 'PX', 3600000)
end
return { 1, 0, 0, 0 }
