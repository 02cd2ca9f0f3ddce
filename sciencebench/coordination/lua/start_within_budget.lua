-- `Budgets.start_within_budget`: let the trial start unless the budget is reached.
-- KEYS[1] budget          the job's budget ledger
-- KEYS[2] budget_started  the trials the budget let start
-- ARGV: trial key
local ledger, started = KEYS[1], KEYS[2]
if budget_reached(ledger) then
  return 0
end
let_start(ledger, started, ARGV[1])
return 1
