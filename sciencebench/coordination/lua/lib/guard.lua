-- guard(running, jobs, job, lease_prefix, guard_ms, payload, key): a held trial handed out
-- (payload, trial key) while its message is on the way gets a running entry (hash
-- `running`) and a lease (lease_prefix .. key) parked under its message's token for
-- guard_ms unless someone holds it; the job is scanned by the watchdog (set `jobs`).
-- No guard when guard_ms is empty.
local function guard(running, jobs, job, lease_prefix, guard_ms, payload, key)
  if guard_ms == '' then
    return
  end
  redis.call('hset', running, key, payload)
  park_absent(lease_prefix .. key, 'parked:' .. cjson.decode(payload)['task_id'], guard_ms)
  redis.call('sadd', jobs, job)
end
