-- quota-worker: confirm that leased backlog tasks are now in apalis-redis.
--
-- KEYS
--   1  <prefix>:backlog           zset
--   2  <prefix>:backlog:data      hash
--   3  <prefix>:backlog:feeding   zset
--
-- ARGV: the task ids pushed.
--
-- Returns: how many were removed from the backlog.

local removed = 0
for _, id in ipairs(ARGV) do
  removed = removed + redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
return removed
