-- quota-worker: claim an item and spend for its first page in one call.
--
-- A task's first two round trips — the item claim (lua/item_lock.lua) and
-- the spend for its first page (lua/spend.lua) — made one. This text runs
-- after both scripts' texts without their last (dispatch) lines, so each
-- script's logic exists once; the worker composes them (src/worker/lock.rs)
-- and uses this only when the windows live in the queue's Redis and no
-- replica must acknowledge the spend (quota::Limiter::rides_along).
--
-- One clock read for both (issue 28): the composition declares a table
-- `claim_clock` before spend.lua's text and makes the spend's read of
-- Redis TIME take `claim_clock.now` when set; the claim sets it here. The
-- spend's clock guard (never earlier than a fixed window's period) still
-- applies to it.
--
-- The spend runs only when the claim succeeds: a task that already ended, or
-- whose item another task holds, spends nothing. A spend the task then does
-- not use (its run was superseded, its request could not be built) is
-- refunded by the worker.
--
-- KEYS
--   1..6   item_lock.lua's claim keys
--   7..    spend.lua's KEYS for the spend (block, clock, each window's, rings)
--
-- ARGV
--   1..3   item_lock.lua's claim ARGV ("claim", holder, lock TTL ms)
--   4..    spend.lua's ARGV for the spend ("spend", request id, cost, ...)
--
-- Returns item_lock.lua's claim reply; when the item was claimed ({2, ...}),
-- followed by spend.lua's spend reply (4 values), or by "error" and the
-- spend's error message when the spend script refused its arguments or
-- failed.

local lock_keys, lock_argv = { KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6] },
  { ARGV[1], ARGV[2], ARGV[3] }
local spend_keys, spend_argv = {}, {}
for i = 7, #KEYS do
  spend_keys[i - 6] = KEYS[i]
end
for i = 4, #ARGV do
  spend_argv[i - 3] = ARGV[i]
end

local claimed = item_lock_main(lock_keys, lock_argv, claim_clock)
if claimed[1] ~= 2 then
  return claimed
end
-- The claim is written by now: a spend that fails, even by raising (a key
-- of the wrong type, say), must still return it, so the task ends through
-- the limiter's error path instead of being redelivered onto its own lock.
local ok, r = pcall(spend_main, spend_keys, spend_argv)
if not ok or r.err then
  claimed[#claimed + 1] = 'error'
  claimed[#claimed + 1] = ok and r.err or tostring(r)
  return claimed
end
for i = 1, #r do
  claimed[#claimed + 1] = r[i]
end
return claimed
