-- quota-worker: block a credential, and remember why.
--
-- Runs as `quota::library()` (lua/spend.lua without its dispatch line)
-- followed by this file, so the block itself is spend.lua's "block"
-- operation: one block key, Redis's clock, and a block never shortens a
-- longer one. Beside it, this keeps the block's reason (for `quota`, the
-- metrics and the status page) and, for blocks that double when they come
-- in a row (GitHub's secondary rate limit), the streak.
--
-- KEYS
--   1 .. #KEYS-2  the credential's spend keys, laid out as lua/spend.lua's header says
--   #KEYS-1       <prefix>:{<credential>}:blocked:kind    string: the reason of the block
--                                                         in force, expiring with it
--   #KEYS         <prefix>:{<credential>}:blocked:streak  string: doubling blocks in a row
--
-- ARGV
--   1 .. #ARGV-3  spend.lua's ARGV for op "block" (ARGV[2]: the block, ms)
--   #ARGV-2       the reason: a stable word ("429", "headers_at_zero", ...)
--   #ARGV-1       "0", or the longest block in ms: the block doubles with each
--                 one of this reason in a row (1st: ARGV[2], 2nd: twice that, ...),
--                 up to this
--   #ARGV         how long a streak is remembered after its last block ends, ms
--
-- Returns
--   {blocked_for_ms, streak, ours}: the block in force (ours, or a longer one
--   already there), the streak this block is part of (0: not doubling), and
--   1 when ours is the block in force (0: a longer one was, and keeps its
--   reason).
--
-- A doubling block met while a block of the same reason is in force does not
-- lengthen the streak: it answers a request sent before that block began.

local nk, na = #KEYS, #ARGV
local why_key, streak_key = KEYS[nk - 1], KEYS[nk]
local reason, cap, memory = ARGV[na - 2], tonumber(ARGV[na - 1]), tonumber(ARGV[na])
local keys, argv = {}, {}
for i = 1, nk - 2 do
  keys[i] = KEYS[i]
end
for i = 1, na - 3 do
  argv[i] = ARGV[i]
end

local ms = tonumber(argv[2])
local streak = 0
if cap > 0 then
  streak = tonumber(redis.call('GET', streak_key) or '0')
  if streak == 0 or redis.call('GET', why_key) ~= reason then
    streak = streak + 1
  end
  -- 2^(streak-1) grows past any cap long before it stops being a number.
  ms = math.min(ms * 2 ^ (streak - 1), cap)
  ms = math.floor(ms)
  argv[2] = tostring(ms)
  redis.call('SET', streak_key, streak, 'PX', ms + memory)
end

local r = spend_main(keys, argv)
if r.err then
  return r
end
local ours = 0
if r[1] <= ms then
  -- Ours is the block in force: its reason is ours.
  redis.call('SET', why_key, reason, 'PX', ms)
  ours = 1
end
return { r[1], streak, ours }
