-- take_room(room, requests, member, cpus, memory_mb, cap_cpus, cap_memory_mb, ttl_ms): take (or
-- refresh) a trial's part of a host's capacity: drop the parts whose holder's lease lapsed, then
-- admit the caller if it holds its part already or its request fits beside the others' (both CPUs
-- and memory). Expiry is on the server's clock, so a dead host's capacity comes back by itself.
local function take_room(room, requests, member, cpus, memory, cap_cpus, cap_memory, ttl_ms)
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _, lapsed in ipairs(redis.call('zrangebyscore', room, '-inf', now)) do
    redis.call('hdel', requests, lapsed)
  end
  redis.call('zremrangebyscore', room, '-inf', now)
  if not redis.call('zscore', room, member) then
    local used_cpus, used_memory = 0, 0
    for _, value in ipairs(redis.call('hvals', requests)) do
      local c, m = string.match(value, '^(%S+) (%S+)$')
      used_cpus = used_cpus + tonumber(c)
      used_memory = used_memory + tonumber(m)
    end
    if used_cpus + tonumber(cpus) > tonumber(cap_cpus) + 1e-9
      or used_memory + tonumber(memory) > tonumber(cap_memory) then
      return 0
    end
    redis.call('hset', requests, member, cpus .. ' ' .. memory)
  end
  redis.call('zadd', room, now + tonumber(ttl_ms), member)
  return 1
end
