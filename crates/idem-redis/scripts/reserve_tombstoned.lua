-- Reserve a key whose requests keep tombstones (SPEC S16): what `SET key record NX GET
-- PX ttl` does, unless a live tombstone stands for an expired (or natively deleted)
-- record. Layout as in complete.lua; a tombstone has the same head, with state 'T'
-- and its own end as expires_at.
--
-- KEYS[1] the record's key   KEYS[2] its tombstone's key (the same hash tag)
-- ARGV[1] the new record     ARGV[2] PX for it, ms   ARGV[3] now, ms (decimal)
--
-- Returns the live record, else a live tombstone, else the expired record (which
-- idem_core::decide then says to take over), each as stored; or false when the key was
-- free and the new record is written.
local now = tonumber(ARGV[3])
local v = redis.call('GET', KEYS[1])
if v and #v >= 18 and struct.unpack('>i8', v, 11) > now then
  return v
end
local t = redis.call('GET', KEYS[2])
if t and #t >= 18 and struct.unpack('>i8', t, 11) > now then
  return t
end
if v then
  return v
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
