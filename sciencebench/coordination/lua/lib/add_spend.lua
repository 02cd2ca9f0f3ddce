-- add_spend(ledger, started, tokens, cost): add a committed record's spend (tokens, cost:
-- '' when unknown) to the job's ledger. Needs lib/budget_reached.lua.
local function add_spend(ledger, started, tokens, cost)
  if tokens == '' and cost == '' then
    return
  end
  local was = budget_reached(ledger)
  redis.call('hincrby', ledger, 'trials', 1)
  if tokens ~= '' then
    redis.call('hincrby', ledger, 'tokens', tokens)
    redis.call('hsetnx', ledger, 'first_priced', cost ~= '' and '1' or '0')
    if cost == '' then
      redis.call('hincrby', ledger, 'unpriced', 1)
    end
  end
  if cost ~= '' then
    redis.call('hincrbyfloat', ledger, 'cost_usd', cost)
  end
  if not was and budget_reached(ledger) then
    mark_reached(ledger, started)
  end
end
