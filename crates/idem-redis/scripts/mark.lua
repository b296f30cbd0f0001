-- Keep why the running attempt leaves its record in progress (an upstream timeout, a
-- broken connection), fenced by its token: one byte after the scope, the reason's place
-- in idem_core::Ambiguity::ALL plus one (src/record.rs). Layout as in complete.lua;
-- the scope's three lengths are at bytes 72-83. The lease and the TTL are left as they
-- are.
--
-- KEYS[1] the record's key
-- ARGV[1] token, 8 bytes     ARGV[2] now, ms (decimal)   ARGV[3] the reason, 1 byte
--
-- Returns 1 when kept, 0 when fenced (another token, expired, or completed), -1 when
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
local scope_end = 83 + struct.unpack('>I4', v, 72) + struct.unpack('>I4', v, 76)
  + struct.unpack('>I4', v, 80)
redis.call('SET', KEYS[1], string.sub(v, 1, scope_end) .. ARGV[3], 'KEEPTTL')
return 1
