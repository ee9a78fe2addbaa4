-- quota-worker: read the blocks of a credential's resources (read-only).
--
-- For `quota`, the status page, the metrics and `unblock`: how long each
-- resource stays blocked, why, and its throttle streak, on Redis's clock
-- (never earlier than the credential's clock key, as in lua/spend.lua).
--
-- KEYS
--   1          <prefix>:{<credential>}:clock
--   then, per resource, the three keys lua/block.lua writes:
--     <prefix>:{<credential>}[:res:<name>]:blocked, ...:blocked:kind, ...:blocked:streak
--
-- ARGV
--   none
--
-- Returns
--   {blocked_for_ms_1, kind_1, streak_1, blocked_for_ms_2, ...}: per
--   resource, ms until its block ends (0: not blocked), the stable word of
--   its reason ("" when none is recorded or it is not blocked), and its
--   throttle streak (0: none).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
if seen > now then
  now = seen
end
local out = {}
for k = 2, #KEYS, 3 do
  local until_ = tonumber(redis.call('GET', KEYS[k]) or '0')
  local ms = math.ceil(math.max(until_ - now, 0) / 1000)
  out[#out + 1] = ms
  out[#out + 1] = ms > 0 and (redis.call('GET', KEYS[k + 1]) or '') or ''
  out[#out + 1] = tonumber(redis.call('GET', KEYS[k + 2]) or '0')
end
return out
