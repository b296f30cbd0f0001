-- Takes one token from a tenant's rate bucket (Store::take_rate_token): a hash of
-- its tokens ("t") and when they were counted ("at", ms), refilled at ARGV[2] tokens
-- a second up to ARGV[3], and kept ARGV[4] ms after its last use (then it is full,
-- and its absence says so). Returns 1 when a token was taken, 0 when it was empty.
local now = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local held = redis.call('HMGET', KEYS[1], 't', 'at')
local tokens = tonumber(held[1])
local at = tonumber(held[2])
if tokens == nil or at == nil then
  tokens = burst
  at = now
end
tokens = math.min(burst, tokens + math.max(0, now - at) / 1000 * rate)
local taken = 0
if tokens >= 1 then
  tokens = tokens - 1
  taken = 1
end
redis.call('HSET', KEYS[1], 't', string.format('%.6f', tokens), 'at', math.max(now, at))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return taken
