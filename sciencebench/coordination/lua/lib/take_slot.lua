-- take_slot(slots, member, cap, ttl_ms): take (or refresh) a concurrency slot: drop
-- expired holders, then admit the caller if it already holds a slot or fewer than the
-- cap are held. Expiry is on the server's clock, so hosts with skewed clocks agree.
local function take_slot(slots, member, cap, ttl_ms)
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('zremrangebyscore', slots, '-inf', now)
  if redis.call('zscore', slots, member) or redis.call('zcard', slots) < tonumber(cap) then
    redis.call('zadd', slots, now + tonumber(ttl_ms), member)
    return 1
  end
  return 0
end
