-- Record the answer and mark the record completed, in one write (SPEC S5 stages 3-4).
--
-- Fenced: only the attempt whose token the unexpired record carries may write.
-- Completing again with that token keeps the first answer. The record's layout is in
-- src/record.rs: token at bytes 3-10 (Lua counts from 1), expires_at 11-18,
-- lease_until 19-26, state 27.
--
-- KEYS[1] the record's key
-- ARGV[1] token, 8 bytes     ARGV[2] now, ms (decimal)
-- ARGV[3] completed_at, 8 bytes
-- ARGV[4] status and headers (record::encode_answer_head)   ARGV[5] body
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
if string.sub(v, 3, 10) ~= ARGV[1] or struct.unpack('>i8', v, 11) <= tonumber(ARGV[2]) then
  return 0
end
if string.sub(v, 27, 27) == 'C' then
  return 1
end
-- completed_at and 'C' replace lease_until and 'P'; the answer follows the scope.
redis.call('SET', KEYS[1],
  string.sub(v, 1, 18) .. ARGV[3] .. 'C' .. string.sub(v, 28) .. ARGV[4] .. ARGV[5],
  'KEEPTTL')
return 1
