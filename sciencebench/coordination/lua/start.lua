-- `Leases.start`: a trial's start in one round trip. The claim: nothing if the chord
-- counted its record or a live lease other than the parked one its message may take
-- over holds it; a record not counted yet gets the lease and running entry (the caller
-- answers the chord with it); else, when claimed, its running entry, the cancel flag,
-- the budget and a slot.
-- KEYS[1] lease           the trial's lease
-- KEYS[2] result          the trial's record
-- KEYS[3] jobs            the jobs with live state (sciencebench:jobs)
-- KEYS[4] cancelled       present when the job is cancelled
-- KEYS[5] slots           the job's slots (zset trial key -> expiry, ms)
-- KEYS[6] running         the job's running entries
-- KEYS[7] budget          the job's budget ledger
-- KEYS[8] budget_started  the trials the budget let start
-- KEYS[9] counted         present when the chord counted the trial
-- ARGV: owner, ttl (ms), job id, parked token ('' none), trial key, cap, running entry ('' none)
-- Returns {claim, cancelled, slot, over budget}.
local lease, result, jobs, cancelled = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local slots, running, ledger, started, counted = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local owner, ttl_ms, job, parked, key, cap, entry = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local recorded = redis.call('exists', result) == 1
if recorded and redis.call('exists', counted) == 1 then
  return {'answered', 0, 0, 0}
end
local holder = redis.call('get', lease)
if holder and (parked == '' or holder ~= parked) then
  return {'held', 0, 0, 0}
end
redis.call('set', lease, owner, 'PX', ttl_ms)
redis.call('sadd', jobs, job)
if entry ~= '' then
  redis.call('hset', running, key, entry)
end
if recorded then
  return {'recorded', 0, 0, 0}
end
if redis.call('exists', cancelled) == 1 then
  return {'claimed', 1, 0, 0}
end
if budget_reached(ledger) then
  return {'claimed', 0, 0, 1}
end
local slot = take_slot(slots, key, cap, ttl_ms)
if slot == 1 then
  let_start(ledger, started, key)
end
return {'claimed', 0, slot, 0}
