-- Delete one record if it has expired by the caller's clock (SPEC S8). Checked inside
-- the script, so a record reserved again between the SCAN that found it and this call
-- is kept.
--
-- KEYS[1] the record's key
-- ARGV[1] now, ms
--
-- Returns 1 when deleted, else 0.
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
  return 0
end
local expires_at = tonumber(redis.call('HGET', KEYS[1], 'expires_at'))
if expires_at and expires_at <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
