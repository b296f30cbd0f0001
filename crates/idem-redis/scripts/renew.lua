-- Extend the running attempt's lease (SPEC S7), fenced by its token. Layout as in
-- complete.lua.
--
-- KEYS[1] the record's key
-- ARGV[1] token, 8 bytes     ARGV[2] now, ms (decimal)
-- ARGV[3] the new lease_until, 8 bytes   ARGV[4] the same, ms (decimal)
-- ARGV[5] PX when the lease outlives the record, ms
--
-- Returns 1 when renewed, 0 when fenced (another token, expired, or completed), -1 when
-- the key holds something that is not a record.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
if #v < 83 or string.sub(v, 1, 2) ~= 'I1' then
  return -1
end
local expires_at = struct.unpack('>i8', v, 11)
if string.sub(v, 3, 10) ~= ARGV[1] or expires_at <= tonumber(ARGV[2])
    or string.sub(v, 27, 27) ~= 'P' then
  return 0
end
if expires_at < tonumber(ARGV[4]) then
  -- The record lives at least as long as the lease, natively too.
  redis.call('SET', KEYS[1],
    string.sub(v, 1, 10) .. ARGV[3] .. ARGV[3] .. string.sub(v, 27), 'PX', ARGV[5])
else
  redis.call('SET', KEYS[1],
    string.sub(v, 1, 18) .. ARGV[3] .. string.sub(v, 27), 'KEEPTTL')
end
return 1
