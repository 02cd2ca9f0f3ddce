-- `Leases.free_slot`: a trial's run is over (its record is committed): give back its slot
-- while the caller is its rightful holder. Its lease and running entry stay until `finish`.
-- KEYS[1] lease    the trial's lease
-- KEYS[2] running  the job's running entries
-- KEYS[3] slots    the job's slots (zset trial key -> expiry, ms)
-- ARGV: owner, trial key
local lease, running, slots = KEYS[1], KEYS[2], KEYS[3]
local owner, key = ARGV[1], ARGV[2]
if not rightful(lease, running, key, owner) then
  return 0
end
redis.call('zrem', slots, key)
return 1
