-- `Leases.commit_result`: store the record only while the caller is the rightful holder
-- and the trial has none; the board state with it; its spend added to the job's budget.
-- KEYS[1] lease           the trial's lease
-- KEYS[2] running         the job's running entries
-- KEYS[3] result          the trial's record
-- KEYS[4] state           the job's board (hash trial key -> TrialStatus JSON)
-- KEYS[5] budget          the job's budget ledger
-- KEYS[6] budget_started  the trials the budget let start
-- ARGV: owner, record JSON, trial key, status JSON ('' for none), tokens, cost ('' unknown)
local lease, running, result, state, ledger, started = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local owner, record, key, status, tokens, cost = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if redis.call('exists', result) == 1 or not rightful(lease, running, key, owner) then
  return 0
end
redis.call('set', result, record)
if status ~= '' then
  redis.call('hset', state, key, status)
end
add_spend(ledger, started, tokens, cost)
return 1
