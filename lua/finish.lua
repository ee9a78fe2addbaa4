-- quota-worker: record how a task ended, in one round trip.
--
-- The done marker makes a redelivered copy of the task do nothing; the tick's
-- outcome hash is what `quota-worker trigger --wait` reads. For a task that
-- ended on the quota's (or the upstream's) "no", the hash also keeps the
-- earliest moment any of the tick's tasks may retry, on Redis's clock (so
-- daemons on hosts with skewed clocks agree), for the summary's "retry after".
--
-- The job's tick record (KEYS[3], read by the status page) keeps a copy of
-- the outcome hash of each of the job's newest ticks, and the job's last
-- error: the outcome hashes expire a day after their last task, a job's
-- last ticks must outlive that.
--
-- Fairness (lua/rotate.lua): a task of the job's latest tick that ended on
-- a "no" lowers the tick's first such position (`first`), where the next
-- tick starts serving. And the job's starved items are kept (KEYS[5]: item
-- -> the turn its starvation began), so each outcome says how many ticks
-- in a row its item was starved: a task starved (a "no" before any page)
-- adds its item if absent; a task served (a spend admitted) removes it.
--
-- KEYS
--   1  <prefix>:done:<task root>                 string: the outcome
--   2  <prefix>:tick:<job>:<tick_ms>:outcomes    hash: outcome field -> count,
--                                                "#items", "#retry_at_ms"
--   3  <prefix>:ticks:<job> (optional)           hash: tick_ms -> the outcome
--                                                hash as a JSON object;
--                                                "#error" -> the last error
--                                                (JSON), "#error_at_ms"
--   4  <prefix>:fair:<job> (optional, with 5)    hash: tick, turn, offset, n, first
--   5  <prefix>:starved:<job>                    hash: item key -> turn starved since
--   6  <prefix>:tick:<job>:<tick_ms>:ended (optional, with 3)
--                                                stream: an entry per task that ends
--                                                while KEYS[2] has "#wait" (set by
--                                                `trigger --wait`, which blocks on it)
--   7  <prefix>:lock:<job>:<item> (optional)     the item lock the task held: deleted
--                                                if ARGV[16] still holds it
--   8.. (with 7) the item's state the run's end leaves: the first ARGV[17]
--       keys are set (<prefix>:since:, :validators:, :ran:), the rest
--       deleted (<prefix>:cursor:, a :validators: the run had none for);
--       untouched when another task holds KEYS[7]
--
-- ARGV
--   1  the outcome ("done", "quota_exhausted", ...), stored in KEYS[1]
--   2  the hash field to count it in (the outcome, or "~retrying", "~deferred")
--   3  TTL of both keys, seconds
--   4  retry-after, ms, of an outcome that ended on a quota; "" for none
--   5..8 with KEYS[3] only:
--   5  the tick, ms (the field of KEYS[3])
--   6  how many ticks KEYS[3] keeps (the newest)
--   7  TTL of KEYS[3], seconds
--   8  the last error (JSON) when this outcome is one, else ""
--   9..15 with KEYS[4] and KEYS[5] only:
--   9  for fairness: "starved" (a "no" before any page), "cut" (a "no" after
--      pages), "served" (a spend admitted), "" (neither: superseded, ...)
--  10  the task's tick, ms
--  11  the task's item index in its tick
--  12  the task's turn ("": a task queued without rotation; no fairness)
--  13  the item key
--  14  TTL of KEYS[5], ms
--  15  most items KEYS[5] keeps
--  16.. with KEYS[7] only:
--  16  the lock holder's value (task id#nonce)
--  17  n: how many of KEYS[8..] are set
--  18.. n pairs: the value, its TTL in seconds
--
-- Returns: the item's starved ticks in a row (this one included when it
-- starved; the run this one ended when served), or -1 (no fairness).

redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])

-- The item's state and its lock, in the same call as the done marker
-- (issue 28: they were three round trips of their own, a MULTI/EXEC, a
-- SETEX and item_lock.lua's release). A daemon killed before this call
-- leaves the item's state as the run's last checkpoint left it and its
-- lock to lapse within its TTL; after it, the task is done and its item
-- free at once: nothing in between.
--
-- A lock that lapsed (a stalled Redis) and was claimed by another task
-- stays that task's, and so does the item's state: this task's end leaves
-- nothing of it (it would delete the new holder's checkpoint, or set its
-- {since}). A lock that lapsed and nobody took leaves the state written:
-- nobody else is running the item.
if KEYS[7] then
  local holder = redis.call('GET', KEYS[7])
  if holder == ARGV[16] or not holder then
    local n = tonumber(ARGV[17])
    for i = 1, n do
      redis.call('SET', KEYS[7 + i], ARGV[16 + 2 * i], 'EX', ARGV[17 + 2 * i])
    end
    if #KEYS >= 8 + n then
      redis.call('DEL', unpack(KEYS, 8 + n))
    end
  end
  if holder == ARGV[16] then
    redis.call('DEL', KEYS[7])
  end
end
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
if ARGV[4] ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local at = now + tonumber(ARGV[4])
  local earliest = tonumber(redis.call('HGET', KEYS[2], '#retry_at_ms'))
  if earliest == nil or at < earliest then
    redis.call('HSET', KEYS[2], '#retry_at_ms', string.format('%d', at))
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[3])

-- The job's tick record, when the caller keeps one (KEYS[3]).
if KEYS[3] then
  local copy = {}
  local waited = false
  local fields = redis.call('HGETALL', KEYS[2])
  for i = 1, #fields, 2 do
    if fields[i] == '#wait' then
      waited = true
    else
      copy[fields[i]] = tonumber(fields[i + 1])
    end
  end
  if waited and KEYS[6] then
    redis.call('XADD', KEYS[6], 'MAXLEN', 1, '*', 'ended', 1)
    redis.call('EXPIRE', KEYS[6], ARGV[3])
  end
  -- Only a tick new to the record can make it hold too many, and only
  -- then does the record's life start again (issue 28: the other tasks of
  -- the tick skip the HKEYS and the EXPIRE; it lives ARGV[7] past its
  -- newest tick's first end).
  if redis.call('HSET', KEYS[3], ARGV[5], cjson.encode(copy)) == 1 then
    redis.call('EXPIRE', KEYS[3], ARGV[7])
    local ticks = {}
    for _, f in ipairs(redis.call('HKEYS', KEYS[3])) do
      if string.sub(f, 1, 1) ~= '#' then
        ticks[#ticks + 1] = f
      end
    end
    local keep = tonumber(ARGV[6])
    if #ticks > keep then
      table.sort(ticks, function(a, b) return tonumber(a) < tonumber(b) end)
      for i = 1, #ticks - keep do
        redis.call('HDEL', KEYS[3], ticks[i])
      end
    end
  end
  if ARGV[8] ~= '' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('HSET', KEYS[3], '#error', ARGV[8], '#error_at_ms', string.format('%d', now))
  end
end

-- Callers without the fairness arguments (other languages, older tools)
-- record the outcome only.
local class, item = ARGV[9] or '', ARGV[13]
local turn = ARGV[12] and tonumber(ARGV[12])
if class == '' or turn == nil or #KEYS < 5 then
  return -1
end

if class ~= 'served' then
  local f = redis.call('HMGET', KEYS[4], 'tick', 'offset', 'n', 'first')
  local n = tonumber(f[3] or '0')
  if tonumber(f[1]) == tonumber(ARGV[10]) and n > 0 then
    local p = (tonumber(ARGV[11]) - tonumber(f[2] or '0')) % n
    local first = tonumber(f[4])
    if first == nil or p < first then
      redis.call('HSET', KEYS[4], 'first', p)
    end
  end
end

local since = tonumber(redis.call('HGET', KEYS[5], item))
if class == 'starved' then
  if since == nil then
    since = turn
    if redis.call('HLEN', KEYS[5]) < tonumber(ARGV[15]) then
      redis.call('HSET', KEYS[5], item, turn)
    end
  end
  redis.call('PEXPIRE', KEYS[5], ARGV[14])
  -- A task of an older tick ending late counts its own tick at least.
  return math.max(turn - since + 1, 1)
end
if since == nil then
  return 0
end
redis.call('HDEL', KEYS[5], item)
return math.max(turn - since, 0)
