-- Delete one record if it has expired by the caller's clock (SPEC S8). Checked inside
-- the script, so a record reserved again between the SCAN that found it and this call
-- is kept. Anything else at the key (not a string, or not a record) is left alone.
-- Layout as in complete.lua.
--
-- KEYS[1] the record's key
-- ARGV[1] now, ms (decimal)
--
-- Returns 1 when deleted, else 0.
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then
  return 0
end
local v = redis.call('GETRANGE', KEYS[1], 0, 82)
if #v < 83 or string.sub(v, 1, 2) ~= 'I1' then
  return 0
end
if struct.unpack('>i8', v, 11) <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
