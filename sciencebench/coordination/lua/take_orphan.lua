-- `Leases.take_orphan`: clear the running entry only while the lease is still absent,
-- so a late renewal and a re-send never both win: after this the old holder is no
-- longer rightful.
-- KEYS[1] lease    the trial's lease
-- KEYS[2] running  the job's running entries
-- ARGV: trial key
local lease, running = KEYS[1], KEYS[2]
local key = ARGV[1]
if redis.call('exists', lease) == 1 then
  return 0
end
return redis.call('hdel', running, key)
