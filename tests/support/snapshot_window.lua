-- Test and benchmark support: a consistent picture of a sliding window's (or
-- a bucket's id log's) entries, read-only (layout v2, see lua/spend.lua).
--
-- KEYS  meta, log, ts, adj of one window
-- Returns {base, {id, position, ...}, {position, time µs, ...}}: the ids the
-- log holds and every stream entry (expired ones not yet dropped included);
-- an entry's units are its position less the previous entry's (or base's).

local raw = redis.call('GET', KEYS[1])
local base = 0
if raw then
  local _
  _, base = cmsgpack.unpack(raw)
end
local ids = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local entries = {}
for _, row in ipairs(redis.call('XRANGE', KEYS[3], '-', '+')) do
  local p, t = string.match(row[1], '^(%d+)%-(%d+)$')
  entries[#entries + 1] = p
  entries[#entries + 1] = t
end
return { base, ids, entries }
