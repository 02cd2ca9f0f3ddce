-- `GatewayLimits.renew`: extend a held slot's lease; 0 when it is no longer held.
-- KEYS[1] gateway_slots  the authority's held slots (zset member -> lease expiry, ms)
-- ARGV: member, ttl (ms)
local slots = KEYS[1]
local member, ttl_ms = ARGV[1], tonumber(ARGV[2])
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = redis.call('zscore', slots, member)
if not expiry or tonumber(expiry) <= now then
  return 0
end
redis.call('zadd', slots, now + ttl_ms, member)
return 1
