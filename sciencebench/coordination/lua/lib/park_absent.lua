-- park_absent(lease, token, ttl_ms): the lease becomes `token` for ttl_ms unless someone
-- holds it; 1 when it did. Written to the trial's parking key and renamed onto the lease
-- (RENAMENX), never SET: a login node's ACL user may create an absent lease this way and
-- may not write one otherwise (coordination.acl), so it cannot take a worker's.
local function park_absent(lease, token, ttl_ms)
  local parking = string.gsub(lease, ':lease:([^:]*)$', ':parking:%1')
  redis.call('set', parking, token, 'PX', ttl_ms)
  if redis.call('renamenx', parking, lease) == 1 then
    return 1
  end
  redis.call('del', parking)
  return 0
end
