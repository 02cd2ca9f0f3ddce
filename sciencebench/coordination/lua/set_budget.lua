-- `Budgets.set_budget`: set the limits (none: '') and seed a lost ledger; the ledger.
-- KEYS[1] budget          the job's budget ledger
-- KEYS[2] budget_started  the trials the budget let start
-- ARGV: max cost, max tokens, seed tokens, seed cost
local ledger, started = KEYS[1], KEYS[2]
local max_cost, max_tokens, seed_tokens, seed_cost = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local fresh = redis.call('exists', ledger) == 0
redis.call('hdel', ledger, 'max_cost_usd', 'max_tokens', 'reached_at', 'started_when_reached')
if max_cost ~= '' then
  redis.call('hset', ledger, 'max_cost_usd', max_cost)
end
if max_tokens ~= '' then
  redis.call('hset', ledger, 'max_tokens', max_tokens)
end
if fresh and seed_tokens ~= '' then
  redis.call('hset', ledger, 'tokens', seed_tokens)
end
if fresh and seed_cost ~= '' then
  redis.call('hset', ledger, 'cost_usd', seed_cost)
end
if budget_reached(ledger) then
  mark_reached(ledger, started)
end
return redis.call('hgetall', ledger)
