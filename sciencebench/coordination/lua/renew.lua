-- `Leases.renew`: extend the lease while the caller is the trial's rightful holder.
-- KEYS[1] lease    the trial's lease
-- KEYS[2] running  the job's running entries (hash trial key -> Redispatch JSON)
-- ARGV: owner, ttl (ms), trial key
local lease, running = KEYS[1], KEYS[2]
local owner, ttl_ms, key = ARGV[1], ARGV[2], ARGV[3]
if rightful(lease, running, key, owner) then
  redis.call('set', lease, owner, 'PX', ttl_ms)
  return 1
end
return 0
