-- Reserve a scope (SPEC S5 stage 1): one atomic step on one key.
--
-- The two branches that acquire mirror exactly the Execute rows of idem_core::decide:
--   none, or expired (expires_at <= now)                        -> attempt 1
--   in progress, same fingerprint, lease lapsed (lease <= now)  -> attempt n+1
-- Anything else returns the record as HGETALL pairs and Rust decides with the same
-- function (replay, in progress, mismatch).
--
-- KEYS[1]  the record's key
-- ARGV[1]  now, ms            ARGV[2]  fingerprint, 32 raw bytes
-- ARGV[3]  new fencing token  ARGV[4]  lease_until, ms
-- ARGV[5]  expires_at of a fresh record, ms
-- ARGV[6]  PEXPIRE of a fresh record, ms
-- ARGV[7]  PEXPIRE when the new lease outlives the record, ms
-- ARGV[8]  tenant             ARGV[9]  endpoint ('' in internal mode)
-- ARGV[10] key
--
-- Returns the acquired attempt number (an integer), or the existing record (an array).
-- Numbers are compared with tonumber but always written as the strings Rust passed, so
-- no value is ever rounded by Lua's doubles; tokens are compared as strings.
local now = tonumber(ARGV[1])
local cur = redis.call('HMGET', KEYS[1],
  'expires_at', 'state', 'fingerprint', 'lease_until', 'attempt')

if not cur[1] or (tonumber(cur[1]) and tonumber(cur[1]) <= now) then
  if cur[1] then
    -- An expired record: none of its fields (a recorded answer) may survive.
    redis.call('DEL', KEYS[1])
  end
  redis.call('HSET', KEYS[1],
    'tenant', ARGV[8], 'endpoint', ARGV[9], 'key', ARGV[10],
    'fingerprint', ARGV[2], 'created_at', ARGV[1], 'expires_at', ARGV[5],
    'lease_until', ARGV[4], 'attempt', '1', 'token', ARGV[3], 'state', 'in_progress')
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  return 1
end

local expires_at = tonumber(cur[1])
local lease_until = tonumber(cur[4])
local attempt = tonumber(cur[5])
if cur[2] == 'in_progress' and cur[3] == ARGV[2] and expires_at and lease_until
    and attempt and lease_until <= now then
  -- Takeover keeps created_at; the record lives at least as long as the new lease.
  attempt = math.min(attempt + 1, 4294967295)
  redis.call('HSET', KEYS[1],
    'attempt', string.format('%d', attempt), 'token', ARGV[3], 'lease_until', ARGV[4])
  if expires_at < tonumber(ARGV[4]) then
    redis.call('HSET', KEYS[1], 'expires_at', ARGV[4])
    redis.call('PEXPIRE', KEYS[1], ARGV[7])
  end
  return attempt
end

return redis.call('HGETALL', KEYS[1])
