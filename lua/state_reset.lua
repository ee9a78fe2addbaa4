-- quota-worker: start one job fan-out item over (`quota-worker state reset`).
--
-- Forgets where the item's interrupted run stands (its checkpoint, which
-- also holds that run's {since} and page 1's validators), the {since} its
-- last complete run left, and the validators of that run's page 1: the
-- item's next run starts at page 1 and asks for everything (a backfill).
-- With a {since} given, that is set instead of forgotten.
--
-- Refused while a task holds the item: the check of the item lock and the
-- deletes are one step, so no task can claim the item in between (a task
-- that claims it after the reset starts over; one that holds it is never
-- pulled from under). The item's completed tick and last run (history) stay,
-- and nothing outside the item's state is touched: not the windows, not the
-- sink, not another item or job.
--
-- KEYS
--   1  <prefix>:lock:<job>:<item>        the item lock (worker/lock.rs)
--   2  <prefix>:cursor:<job>:<item>      the checkpoint (JSON): deleted
--   3  <prefix>:since:<job>:<item>       {since} (epoch s): deleted, or set to ARGV[1]
--   4  <prefix>:validators:<job>:<item>  page 1's ETag / Last-Modified (JSON): deleted
--
-- ARGV
--   1  the {since} to set (epoch s), or "" to forget it
--   2  its TTL, s (with ARGV[1])
--
-- Returns
--   {0, holder}   a task holds the item (the lock's value): nothing changed
--   {1, checkpoint or "", since or "", validators or ""}
--                 reset: what the three keys held before

local holder = redis.call('GET', KEYS[1])
if holder then
  return { 0, holder }
end
local was = redis.call('MGET', KEYS[2], KEYS[3], KEYS[4])
redis.call('DEL', KEYS[2], KEYS[4])
if ARGV[1] == '' then
  redis.call('DEL', KEYS[3])
else
  redis.call('SET', KEYS[3], ARGV[1], 'EX', ARGV[2])
end
local function s(x) return x or '' end
return { 1, s(was[1]), s(was[2]), s(was[3]) }
