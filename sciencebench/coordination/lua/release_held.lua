-- `Slots.release_held`: every held trial's payload, longest expected first; the job
-- holds nothing after. Each is guarded (lib/guard.lua) unless they are dropped (guard '').
-- KEYS[1] held           zset member -> -(expected seconds)
-- KEYS[2] held_payloads  hash member -> payload
-- KEYS[3] held_tasks     hash task id -> its held members
-- KEYS[4] held_probe     set of probed trial keys
-- KEYS[5] held_meta      hash: window, at
-- KEYS[6] running        the job's running entries
-- KEYS[7] jobs           the jobs with live state (sciencebench:jobs)
-- ARGV: job id, lease key prefix (.. trial key), guard (ms, '' to drop them)
local held, held_payloads, held_tasks, held_probe = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local held_meta, running, jobs = KEYS[5], KEYS[6], KEYS[7]
local job, lease_prefix, guard_ms = ARGV[1], ARGV[2], ARGV[3]
local members = redis.call('zrange', held, 0, -1)
local payloads = {}
for _, member in ipairs(members) do
  local payload = redis.call('hget', held_payloads, member)
  if payload then
    guard(running, jobs, job, lease_prefix, guard_ms, payload, string.match(member, '/(.*)$'))
    table.insert(payloads, payload)
  end
end
redis.call('del', held, held_payloads, held_tasks, held_probe, held_meta)
return payloads
