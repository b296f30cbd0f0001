-- Record the answer and mark the record completed, in one write (SPEC S5 stages 3-4).
--
-- Fenced: only the attempt whose token the unexpired record carries may write.
-- Completing again with that token keeps the first answer. The record's layout is in
-- src/record.rs: token at bytes 3-10 (Lua counts from 1), expires_at 11-18,
-- lease_until 19-26, state 27.
--
-- KEYS[1] the record's key   KEYS[2] its tombstone's key (the same hash tag)
-- ARGV[1] token, 8 bytes     ARGV[2] now, ms (decimal)
-- ARGV[3] completed_at, 8 bytes
-- ARGV[4] status and headers (record::encode_answer_head)   ARGV[5] body
-- ARGV[6] the record's TTL, ms (decimal)   ARGV[7] the native TTL's grace, ms (decimal)
-- ARGV[8] the tombstone TTL, ms (decimal; 0 for none)
-- ARGV[9], ARGV[10] (optional) a channel and message to PUBLISH once the record is
-- completed, for duplicates waiting on other instances (SPEC S15)
--
-- A completed record expires at creation (bytes 28-35) + TTL, as
-- Lease::completed_expires_at says: the lease may have kept it alive longer while in
-- progress. Its native TTL follows, with the grace. With a tombstone TTL, the tombstone
-- (SPEC S16) is written beside it: the record's head with state 'T', the completion
-- time and the tombstone's end (expiry + tombstone TTL) as expires_at, then the scope
-- and the status; no headers, no body. Its native TTL is its end, with the grace.
--
-- Returns 1 when the record is (now or already) completed by this attempt, 0 when
-- fenced, -1 when the key holds something that is not a record.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
if #v < 83 or string.sub(v, 1, 2) ~= 'I1' then
  return -1
end
local expires_at = struct.unpack('>i8', v, 11)
local now = tonumber(ARGV[2])
if string.sub(v, 3, 10) ~= ARGV[1] or expires_at <= now then
  return 0
end
if string.sub(v, 27, 27) == 'C' then
  return 1
end
-- completed_at and 'C' replace lease_until and 'P'; the answer follows the scope, in
-- place of the reason an in-progress record may keep after it (mark.lua).
local scope_end = 83 + struct.unpack('>I4', v, 72) + struct.unpack('>I4', v, 76)
  + struct.unpack('>I4', v, 80)
local tail = ARGV[3] .. 'C' .. string.sub(v, 28, scope_end) .. ARGV[4] .. ARGV[5]
local created_at = struct.unpack('>i8', v, 28)
local ttl = tonumber(ARGV[6])
local grace = tonumber(ARGV[7])
local completed_expiry = expires_at
if ttl < expires_at - created_at then
  completed_expiry = created_at + ttl
  redis.call('SET', KEYS[1], string.sub(v, 1, 10) .. struct.pack('>i8', completed_expiry) .. tail,
    'PX', math.max(1, completed_expiry - now + grace))
else
  redis.call('SET', KEYS[1], string.sub(v, 1, 18) .. tail, 'KEEPTTL')
end
local tombstone = tonumber(ARGV[8])
if tombstone > 0 then
  -- At most 2^62 ms: far beyond any real time, and exact in Lua's doubles.
  local tomb_until = math.min(completed_expiry + tombstone, 4611686018427387904)
  local px = math.min(math.max(1, tomb_until - now + grace), 3153600000000)
  redis.call('SET', KEYS[2], 'I1' .. string.sub(v, 3, 10) .. struct.pack('>i8', tomb_until)
    .. ARGV[3] .. 'T' .. string.sub(v, 28, scope_end) .. string.sub(ARGV[4], 1, 2), 'PX', px)
end
if ARGV[9] then
  redis.call('PUBLISH', ARGV[9], ARGV[10])
end
return 1
