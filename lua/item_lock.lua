-- quota-worker: one task at a time per job fan-out item.
--
-- A task claims its item before its first spend, and in the same round trip
-- learns whether it already ended (a redelivered copy), where the item's
-- interrupted run stands, the newest tick whose run completed it, what its
-- last complete run left for the next one ({since}, validators), and the
-- Redis clock (the run's start, for {since}: no host's clock is trusted).
--
-- KEYS
--   1  <prefix>:lock:<job>:<item>        string: who holds the item (task id#nonce)
--   claim only:
--   2  <prefix>:done:<task root>         set when the task ended for good
--   3  <prefix>:cursor:<job>:<item>      the pagination checkpoint (JSON)
--   4  <prefix>:ran:<job>:<item>         newest tick whose run completed the item
--   5  <prefix>:since:<job>:<item>       start of the last complete run (epoch s)
--   6  <prefix>:validators:<job>:<item>  ETag / Last-Modified of its page 1 (JSON)
--   save, forget only:
--   2  <prefix>:cursor:<job>:<item>      the pagination checkpoint (JSON)
--
-- ARGV
--   1  op: "claim" | "renew" | "release" | "save" | "forget"
--   2  the holder's value
--   3  claim, renew, save, forget: lock TTL, ms
--   4  save: the checkpoint (JSON)
--   5  save: the checkpoint's TTL, s
--
-- Returns
--   claim:   {0} the task already ended; {1} another task holds the item;
--            {2, checkpoint or "", ran tick or "", since or "",
--             validators or "", Redis time in s} claimed
--   renew:   1 if held (and extended), 0 if another task holds the item
--   release: 1 if released, 0 if it was no longer ours
--   save:    1 if saved, 0 if another task holds the item (nothing
--            written: a task whose lock lapsed under a stalled Redis must
--            not move back, or bring back, the checkpoint of the task that
--            holds the item now)
--   forget:  1 if the checkpoint was deleted, 0 if another task holds the
--            item (nothing deleted, for the same reason)
--
-- Renew, save and forget take the lock again when nobody holds it: the
-- write that took it was lost (a failover promoted a replica it had not
-- reached yet), or it lapsed while Redis stalled and no task claimed the
-- item since. Nobody else runs the item then, so its task goes on.

-- This file defines item_lock(KEYS, ARGV), which returns the reply (and,
-- for a claim that took the item, the TIME reply it read). The script that
-- runs alone is this text followed by `return item_lock(KEYS, ARGV)`
-- (src/worker/lock.rs); the spend library includes it for the claim with
-- the first page's spend (lua/spend/claim.lua), which hands that clock
-- reading to the spend.

local function item_lock(KEYS, ARGV)
  local op = ARGV[1]
  if op == 'claim' then
    -- One MGET for the done marker and the item's four keys (issue 28:
    -- commands per task). Read before the lock is taken, in the same
    -- script: nothing can run in between.
    local v = redis.call('MGET', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
    if v[1] then
      return { 0 }
    end
    if not redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[3]) then
      return { 1 }
    end
    local function s(x) return x or '' end
    local t = redis.call('TIME')
    return { 2, s(v[2]), s(v[3]), s(v[4]), s(v[5]), t[1] }, t
  end
  local held = redis.call('GET', KEYS[1])
  if op == 'release' then
    if held ~= ARGV[2] then
      return 0
    end
    return redis.call('DEL', KEYS[1])
  end
  if held ~= ARGV[2] then
    if held then
      return 0
    end
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  end
  if op == 'renew' then
    return redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
  if op == 'save' then
    redis.call('SET', KEYS[2], ARGV[4], 'EX', ARGV[5])
    return 1
  end
  if op == 'forget' then
    redis.call('DEL', KEYS[2])
    return 1
  end
  return redis.error_reply('ERR quota-worker: unknown op ' .. tostring(op))
end
