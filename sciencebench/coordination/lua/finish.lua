-- `Leases.finish`: the trial ends in its rightful holder's process: drop its slot,
-- running entry and lease. Nothing for a copy that lost the trial.
-- `Leases.free_slot` (ARGV[3] 'slot'): its run is over: drop only its slot; the lease
-- and running entry stay until the chord has counted its answer.
-- KEYS[1] lease    the trial's lease
-- KEYS[2] running  the job's running entries
-- KEYS[3] slots    the job's slots (zset trial key -> expiry, ms)
-- ARGV: owner, trial key, what ('slot': the slot only; else everything)
local lease, running, slots = KEYS[1], KEYS[2], KEYS[3]
local owner, key, what = ARGV[1], ARGV[2], ARGV[3]
if not rightful(lease, running, key, owner) then
  return 0
end
redis.call('zrem', slots, key)
if what == 'slot' then
  return 1
end
redis.call('hdel', running, key)
if redis.call('get', lease) == owner then
  redis.call('del', lease)
end
return 1
