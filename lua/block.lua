-- quota-worker: block one or more resources of a credential, and remember why.
--
-- The block an upstream asked for, on each resource given (one, or every
-- resource of the credential for a token-wide limit such as GitHub's
-- secondary rate limit). Each resource's block is what lua/spend.lua checks
-- first (its KEYS[1]): a spend on the resource is refused until it ends.
-- The clock is Redis TIME (never earlier than the credential's clock key,
-- as in spend.lua); a block never shortens a longer one already there.
--
-- Throttles in a row double: a throttle answer (a 429, a 403 rate limit,
-- THROTTLED, RATE_LIMITED) that comes while no block of its resource is in
-- force adds one to the resource's streak, and the block is then at least
-- first x 2^(streak - 1), at most the cap. One that comes while a block is
-- in force answers a request sent before that block began: it does not
-- lengthen the streak. A successful answer ends the streak (the worker
-- deletes the streak key); an idle one ends `memory` after its last block.
--
-- KEYS
--   1          <prefix>:{<credential>}:clock     see lua/spend.lua
--   then, per resource, three keys (the default resource's carry no
--   `res:<name>:` part):
--     <prefix>:{<credential>}[:res:<name>]:blocked         string: blocked-until, µs
--     <prefix>:{<credential>}[:res:<name>]:blocked:kind    string: the reason of the
--                                                          block in force, expiring with it
--     <prefix>:{<credential>}[:res:<name>]:blocked:streak  string: throttles in a row
--
-- ARGV
--   1  the wait the upstream asked for, ms (>= 1)
--   2  the shortest block, ms (>= 1): the endpoint's min_block, or the first
--      block of a streak when the upstream's convention says more (60000
--      for GitHub's secondary rate limit)
--   3  "0": not a throttle (no streak: a page that said 0 left); else the
--      longest doubled block, ms
--   4  how long a streak is remembered after its block ends, ms
--   5  the reason: a stable word ("429", "headers_at_zero", ...)
--
-- Returns
--   {blocked_for_ms, streak, ours} for the first resource: the block in
--   force (ours, or a longer one already there), the streak this block is
--   part of (0: not a throttle), and 1 when ours is the block in force (0:
--   a longer one was, and keeps its reason).

local MAXPOS = 9007199254740992  -- 2^53: ms beyond it lose precision
local wait, least, cap, memory = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local reason = ARGV[5]
for _, v in ipairs({ wait, least, cap, memory }) do
  if v == nil or v < 0 or v >= MAXPOS or v ~= math.floor(v) then
    return redis.error_reply('ERR quota-worker: block takes whole numbers of ms below 2^53 (got ' .. table.concat(ARGV, ' ') .. ')')
  end
end
if wait < 1 or least < 1 or reason == nil or (#KEYS - 1) % 3 ~= 0 or #KEYS < 4 then
  return redis.error_reply('ERR quota-worker: block takes a clock key and (blocked, kind, streak) keys per resource, a wait and a shortest block of at least 1 ms, and a reason')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
if seen > now then
  now = seen
end

local first
for k = 2, #KEYS, 3 do
  local blocked_key, kind_key, streak_key = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  local until_now = tonumber(redis.call('GET', blocked_key) or '0')
  local ms, streak = math.max(wait, least), 0
  if cap > 0 then
    streak = tonumber(redis.call('GET', streak_key) or '0')
    if until_now <= now then
      streak = streak + 1
    end
    -- 2^(streak-1) grows past any cap long before it stops being a number.
    local doubled = math.min(least * 2 ^ (math.max(streak, 1) - 1), math.max(cap, least))
    ms = math.floor(math.max(wait, doubled))
    redis.call('SET', streak_key, streak, 'PX', ms + memory)
  end
  local until_ = now + ms * 1000
  local ours = 0
  if until_ > until_now then
    redis.call('SET', blocked_key, until_, 'PX', ms)
    redis.call('SET', kind_key, reason, 'PX', ms)
    until_now, ours = until_, 1
  end
  if not first then
    first = { math.ceil(math.max(until_now - now, 0) / 1000), streak, ours }
  end
end
return first
