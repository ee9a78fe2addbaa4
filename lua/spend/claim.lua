-- The item claim and the first page's spend, in one call (FCALL
-- <library>_claim; the one-script form in src/worker/lock.rs).
--
-- A task's first two round trips — the item claim (lua/item_lock.lua) and
-- the spend for its first page — made one. The worker uses it only when
-- the windows live in the queue's Redis and no replica must acknowledge the
-- spend (quota::Limiter::rides_along).
--
-- One clock read for both (issue 28): the claim's TIME reply is the spend's
-- clock (the spend's guard, never earlier than a fixed window's period,
-- still applies to it).
--
-- The spend runs only when the claim succeeds: a task that already ended, or
-- whose item another task holds, spends nothing. A spend the task then does
-- not use (its run was superseded, its request could not be built) is
-- refunded by the worker.
--
-- KEYS
--   1..6   item_lock.lua's claim keys
--   7..    the spend's KEYS (block, clock, each window's, rings, lines)
--
-- ARGV
--   1..3   item_lock.lua's claim ARGV ("claim", holder, lock TTL ms)
--   4..    the spend's ARGV ("spend", request id, cost, ...)
--
-- Returns item_lock.lua's claim reply; when the item was claimed ({2, ...}),
-- followed by the spend's reply (4 values), or by "error" and the spend's
-- error message when it refused its arguments or failed.

function Ops.claim(KEYS, ARGV)
  if not call then
    bind()
  end
  local claimed, t = item_lock({ KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6] },
    { ARGV[1], ARGV[2], ARGV[3] })
  if claimed[1] ~= 2 then
    return claimed
  end
  local spend_keys, spend_argv = {}, {}
  for i = 7, #KEYS do
    spend_keys[i - 6] = KEYS[i]
  end
  for i = 4, #ARGV do
    spend_argv[i - 3] = ARGV[i]
  end
  -- The claim is written by now: a spend that fails, even by raising (a key
  -- of the wrong type, say), must still return it, so the task ends through
  -- the limiter's error path instead of being redelivered onto its own lock.
  local ok, r = pcall(Ops.spend, spend_keys, spend_argv, t)
  if not ok or r.err then
    claimed[#claimed + 1] = 'error'
    claimed[#claimed + 1] = ok and r.err or tostring(r)
    return claimed
  end
  for i = 1, #r do
    claimed[#claimed + 1] = r[i]
  end
  return claimed
end
