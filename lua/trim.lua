-- quota-worker: trim what apalis-redis never trims (apalis-redis #10).
--
-- Finished tasks stay in apalis's done and dead sets, with their data and
-- metadata, forever; each worker name leaves a metadata hash behind. This
-- drops finished tasks older than a cutoff and metadata of workers no longer
-- registered, one SSCAN / SCAN step of each per call, resuming where the last
-- call stopped, so repeated calls cover everything in bounded steps. Not
-- apalis's vacuum: that also deletes tasks waiting for retry.
--
-- KEYS
--   1  apalis done set          (<queue>:done)
--   2  apalis dead set          (<queue>:dead)
--   3  apalis task data hash    (<queue>:data)
--   4  apalis workers zset      (<queue>:workers)
--   5  hash of the scan cursors between calls (expires after a day)
--
-- ARGV
--   1  task metadata prefix     (<queue>:meta; a task's is <prefix>:<id>)
--   2  cutoff, Unix seconds: tasks done before it are dropped
--   3  members per step (SSCAN COUNT)
--   4  worker metadata prefix   (<queue>:workers:metadata:)
--
-- Returns: {tasks dropped, 1 when every scan has wrapped around (0 else)}.

local cutoff = tonumber(ARGV[2])
local dropped = 0
local wrapped = 1

local function step(field, scan)
  local cursor = redis.call('HGET', KEYS[5], field) or '0'
  local reply = scan(cursor)
  redis.call('HSET', KEYS[5], field, reply[1])
  if reply[1] ~= '0' then
    wrapped = 0
  end
  return reply[2]
end

for s = 1, 2 do
  local ids = step('set' .. s, function(c)
    return redis.call('SSCAN', KEYS[s], c, 'COUNT', tonumber(ARGV[3]))
  end)
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

local keys = step('workers', function(c)
  return redis.call('SCAN', c, 'MATCH', ARGV[4] .. '*', 'COUNT', tonumber(ARGV[3]))
end)
for _, key in ipairs(keys) do
  local name = string.sub(key, #ARGV[4] + 1)
  if not redis.call('ZSCORE', KEYS[4], name) then
    redis.call('DEL', key)
  end
end
redis.call('EXPIRE', KEYS[5], 86400)
return { dropped, wrapped }
