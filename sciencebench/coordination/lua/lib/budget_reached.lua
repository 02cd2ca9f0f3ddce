-- budget_reached(ledger): whether the job's ledger (a hash) has reached a limit.
-- budget_now(): the store's clock, as text. mark_reached(ledger, started): note when
-- the limit was reached and how many trials had started then.
local function budget_reached(ledger)
  local v = redis.call('hmget', ledger, 'max_cost_usd', 'max_tokens', 'cost_usd', 'tokens')
  if v[1] and tonumber(v[3] or '0') >= tonumber(v[1]) then
    return true
  end
  return v[2] ~= false and tonumber(v[4] or '0') >= tonumber(v[2])
end
local function budget_now()
  local t = redis.call('time')
  return tostring(tonumber(t[1]) + tonumber(t[2]) / 1e6)
end
local function mark_reached(ledger, started)
  redis.call('hset', ledger, 'reached_at', budget_now(), 'started_when_reached', redis.call('hlen', started))
end
