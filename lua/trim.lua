-- quota-worker: trim what apalis-redis never trims (apalis-redis #10).
--
-- Finished tasks stay in apalis's done and dead sets, with their data and
-- metadata, forever; each worker name leaves a metadata hash behind. This
-- drops finished tasks older than a cutoff, a sample at a time (SRANDMEMBER:
-- run it often and it converges), and metadata of workers no longer
-- registered. Not apalis's vacuum: that also deletes tasks waiting for retry.
--
-- KEYS
--   1  apalis done set          (<queue>:done)
--   2  apalis dead set          (<queue>:dead)
--   3  apalis task data hash    (<queue>:data)
--   4  apalis workers zset      (<queue>:workers)
--   5  where the worker-metadata SCAN cursor is kept between calls
--
-- ARGV
--   1  task metadata prefix     (<queue>:meta; a task's is <prefix>:<id>)
--   2  cutoff, Unix seconds: tasks done before it are dropped
--   3  sample size per set
--   4  worker metadata prefix   (<queue>:workers:metadata:)
--
-- Returns: tasks dropped.

local cutoff = tonumber(ARGV[2])
local dropped = 0
for s = 1, 2 do
  local ids = redis.call('SRANDMEMBER', KEYS[s], tonumber(ARGV[3]))
  for _, id in ipairs(ids) do
    local meta = ARGV[1] .. ':' .. id
    local done_at = tonumber(redis.call('HGET', meta, 'done_at') or '0') or 0
    if done_at > 0 and done_at < cutoff then
      redis.call('SREM', KEYS[s], id)
      redis.call('HDEL', KEYS[3], id)
      redis.call('DEL', meta)
      dropped = dropped + 1
    end
  end
end

-- Worker metadata: one SCAN step per call, resuming where the last one stopped.
local scan = redis.call('SCAN', redis.call('GET', KEYS[5]) or '0', 'MATCH', ARGV[4] .. '*', 'COUNT', 1000)
redis.call('SET', KEYS[5], scan[1], 'EX', 86400)
for _, key in ipairs(scan[2]) do
  local name = string.sub(key, #ARGV[4] + 1)
  if not redis.call('ZSCORE', KEYS[4], name) then
    redis.call('DEL', key)
  end
end
return dropped
