-- `GatewayLimits.provider_error` and `success`: halve the authority's limit (never below 1, once per
-- round: a try that took its slot before the last halving halves nothing again) or grow it by one
-- up to its ceiling; the new limit (0: no limit yet).
-- KEYS[1] gateway  the authority's limit (hash: limit, ceiling, status, reason, at, error_at)
-- ARGV: 'error' | 'success', the provider status, since (when the failed try took its slot, s)
local limits = KEYS[1]
local kind, status, since = ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call('time')
local limit = tonumber(redis.call('hget', limits, 'limit') or '0')
if limit == 0 then
  return 0
end
local ceiling = tonumber(redis.call('hget', limits, 'ceiling') or limit)
local new = limit
if kind == 'error' then
  local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
  if since < tonumber(redis.call('hget', limits, 'error_at') or '0') then
    redis.call('hset', limits, 'status', status)
    return limit
  end
  new = math.max(1, math.floor(limit / 2))
  redis.call('hset', limits, 'limit', new, 'status', status, 'at', now, 'error_at', now,
             'reason', 'provider error ' .. status .. ': halved from ' .. limit)
elseif limit < ceiling then
  new = limit + 1
  redis.call('hset', limits, 'limit', new, 'at', t[1], 'reason', 'a trial got its answers: +1')
end
return new
