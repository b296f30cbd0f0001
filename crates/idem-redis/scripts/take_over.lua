-- Replace a record only if it is still the version the caller read and decided on:
-- a compare-and-set on the record's head (src/record.rs, FENCED_LEN bytes), which
-- changes with every write a record can see. Reserve uses it to take over an expired
-- record or a lapsed lease; everything else about the reservation is decided in Rust
-- by idem_core::decide.
--
-- KEYS[1] the record's key
-- ARGV[1] the head of the record read, 71 bytes   ARGV[2] the new record
-- ARGV[3] PX for the new record, ms, or '' to keep the key's TTL
--
-- Returns 1 when replaced, 0 when the record changed (or is gone) since it was read.
if redis.call('GETRANGE', KEYS[1], 0, 70) ~= ARGV[1] then
  return 0
end
if ARGV[3] == '' then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
