-- Extend the running attempt's lease (SPEC S7), fenced by its token.
--
-- KEYS[1] the record's key
-- ARGV[1] token  ARGV[2] now, ms  ARGV[3] new lease_until, ms
-- ARGV[4] PEXPIRE when the lease outlives the record, ms
--
-- Returns 1 when renewed, 0 when fenced (another token, expired, or completed).
local cur = redis.call('HMGET', KEYS[1], 'token', 'expires_at', 'state')
local expires_at = tonumber(cur[2])
if cur[1] ~= ARGV[1] or not expires_at or expires_at <= tonumber(ARGV[2])
    or cur[3] ~= 'in_progress' then
  return 0
end
redis.call('HSET', KEYS[1], 'lease_until', ARGV[3])
if expires_at < tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'expires_at', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return 1
