-- Delete an in-progress record so its key may execute again (SPEC S6), fenced by the
-- attempt's token. A completed record is never released. Layout as in complete.lua.
--
-- KEYS[1] the record's key
-- ARGV[1] token, 8 bytes     ARGV[2] now, ms (decimal)
-- ARGV[3], ARGV[4] (optional) a channel and message to PUBLISH once the record is
-- released, for duplicates waiting on other instances (SPEC S15)
--
-- Returns 1 when released, 0 when fenced (another token, expired, or completed), -1 when
-- the key holds something that is not a record.
local v = redis.call('GETRANGE', KEYS[1], 0, 82)
if v == '' then
  -- No key (or an empty value, which no record is).
  return 0
end
if #v < 83 or string.sub(v, 1, 2) ~= 'I1' then
  return -1
end
if string.sub(v, 3, 10) ~= ARGV[1] or struct.unpack('>i8', v, 11) <= tonumber(ARGV[2])
    or string.sub(v, 27, 27) ~= 'P' then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[3] then
  redis.call('PUBLISH', ARGV[3], ARGV[4])
end
return 1
