-- let_start(ledger, started, key): a trial the budget lets start, noted (hash `started`)
-- with the store's clock when the job has limits. Needs lib/budget_reached.lua.
local function let_start(ledger, started, key)
  local limits = redis.call('hmget', ledger, 'max_cost_usd', 'max_tokens')
  if limits[1] or limits[2] then
    redis.call('hset', started, key, budget_now())
  end
end
