-- `GatewayLimits.acquire`: take (or refresh) one of a gateway authority's slots. The limit is
-- created at n (the ceiling raised to it), expired holders are dropped, and the caller is admitted
-- when it holds a slot already or fewer than the limit are held.
-- KEYS[1] gateway        the authority's limit (hash: limit, ceiling, status, reason, at)
-- KEYS[2] gateway_slots  its held slots (zset member -> lease expiry, ms)
-- KEYS[3] gateways       the authorities ever limited
-- ARGV: member, n (--n-concurrent), ttl (ms), authority
local limits, slots, gateways = KEYS[1], KEYS[2], KEYS[3]
local member, n, ttl_ms, authority = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('sadd', gateways, authority)
if redis.call('hsetnx', limits, 'limit', n) == 1 then
  redis.call('hset', limits, 'ceiling', n, 'status', '', 'reason', 'started at --n-concurrent ' .. n,
             'at', t[1])
elseif tonumber(redis.call('hget', limits, 'ceiling') or '0') < n then
  redis.call('hset', limits, 'ceiling', n)
end
local limit = tonumber(redis.call('hget', limits, 'limit'))
redis.call('zremrangebyscore', slots, '-inf', now)
if redis.call('zscore', slots, member) or redis.call('zcard', slots) < limit then
  redis.call('zadd', slots, now + ttl_ms, member)
  return 1
end
return 0
