-- Delete an in-progress record so its key may execute again (SPEC S6), fenced by the
-- attempt's token. A completed record is never released.
--
-- KEYS[1] the record's key
-- ARGV[1] token  ARGV[2] now, ms
--
-- Returns 1 when released, 0 when fenced (another token, expired, or completed).
local cur = redis.call('HMGET', KEYS[1], 'token', 'expires_at', 'state')
local expires_at = tonumber(cur[2])
if cur[1] ~= ARGV[1] or not expires_at or expires_at <= tonumber(ARGV[2])
    or cur[3] ~= 'in_progress' then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
