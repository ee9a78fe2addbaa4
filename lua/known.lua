-- quota-worker: one daemon says what it has loaded (src/queue/known.rs).
--
-- Every job of its config is known now: a worker that takes a task of a job
-- its own config does not have gives it back while some daemon had the job
-- within `unknown_job_grace` (rolling deploys, reloads). The daemon itself
-- is alive until now + its entry's life, with what it loaded (its config's
-- fingerprint), so `trigger` can say whether a reload is needed. Called at
-- start, after every reload, and every few seconds; with a life of 0 it
-- removes the daemon's entry (a clean stop).
--
-- KEYS
--   1  known jobs    (hash: job -> Redis time, ms, a daemon last had it loaded)
--   2  live daemons  (hash: daemon id -> "<alive until, ms> <what it loaded, JSON>")
--
-- ARGV
--   1  the daemon's id (host:pid:nonce)
--   2  its entry's life, ms (0: remove it, and write no job)
--   3  how long the hashes live without a write, ms (a job no daemon has had
--      for that long is forgotten with the rest)
--   4  what it loaded (JSON, opaque here)
--   5  1: also forget jobs no daemon has had for ARGV[3] ms (0: not now)
--   6… its jobs
--
-- Returns: Redis time, ms.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local life = tonumber(ARGV[2])
local keep = tonumber(ARGV[3])

if life == 0 then
  redis.call('HDEL', KEYS[2], ARGV[1])
  return now
end

for i = 6, #ARGV do
  redis.call('HSET', KEYS[1], ARGV[i], now)
end
if #ARGV >= 6 then
  redis.call('PEXPIRE', KEYS[1], keep)
end

if ARGV[5] == '1' then
  -- Field by field (HSCAN), never the whole hash unpacked at once.
  local cursor = '0'
  repeat
    local r = redis.call('HSCAN', KEYS[1], cursor, 'COUNT', 500)
    cursor = r[1]
    local kv = r[2]
    for i = 1, #kv, 2 do
      if now - tonumber(kv[i + 1]) > keep then
        redis.call('HDEL', KEYS[1], kv[i])
      end
    end
  until cursor == '0'
end

redis.call('HSET', KEYS[2], ARGV[1], (now + life) .. ' ' .. ARGV[4])
-- Daemons that went without a clean stop: gone once their entry's life ran
-- out. Few entries (one per daemon), read whole.
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local untl = tonumber(string.match(all[i + 1], '^(%d+)'))
  if untl == nil or untl < now then
    redis.call('HDEL', KEYS[2], all[i])
  end
end
redis.call('PEXPIRE', KEYS[2], keep)
return now
