-- Record the response and mark the record completed, in one write (SPEC S5 stages 3-4).
--
-- Fenced: only the attempt whose token the unexpired record carries may write.
-- Completing again with that token keeps the first response.
--
-- KEYS[1] the record's key
-- ARGV[1] token  ARGV[2] now, ms  ARGV[3] status  ARGV[4] encoded headers  ARGV[5] body
--
-- Returns 1 when the record is (now or already) completed by this attempt, 0 when fenced.
local cur = redis.call('HMGET', KEYS[1], 'token', 'expires_at', 'state')
local expires_at = tonumber(cur[2])
if cur[1] ~= ARGV[1] or not expires_at or expires_at <= tonumber(ARGV[2]) then
  return 0
end
if cur[3] == 'completed' then
  return 1
end
redis.call('HSET', KEYS[1],
  'state', 'completed', 'status', ARGV[3], 'headers', ARGV[4], 'body', ARGV[5],
  'completed_at', ARGV[2])
redis.call('HDEL', KEYS[1], 'lease_until')
return 1
