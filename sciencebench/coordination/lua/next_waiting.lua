-- `Slots.next_waiting`: the next trial to send as one ended: the oldest waiting for a
-- slot, else the held trial expected to run longest. First, probed trials (sent trials
-- of tasks with held ones) that have a record measure their task: its held trials are
-- expected to take what the record stores (lib/measured.lua). A held trial taken is
-- guarded (lib/guard.lua). The records are read by name, which a single Redis (not a
-- cluster) allows.
-- KEYS[1] waiting           the trial keys waiting for a slot, oldest first (list)
-- KEYS[2] waiting_payloads  hash trial key -> payload
-- KEYS[3] held              zset member (<rank>/<trial key>) -> -(expected seconds)
-- KEYS[4] held_payloads     hash member -> payload
-- KEYS[5] held_tasks        hash task id -> JSON list of its held members, until measured
-- KEYS[6] held_probe        set of sent trial keys whose record would measure a held task
-- KEYS[7] held_meta         hash: window, at (the last release)
-- KEYS[8] running           the job's running entries
-- KEYS[9] jobs              the jobs with live state (sciencebench:jobs)
-- ARGV: record key prefix (.. trial key), job id, lease key prefix (.. trial key), guard (ms)
local waiting, waiting_payloads, held, held_payloads = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local held_tasks, held_probe, held_meta, running, jobs = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local result_prefix, job, lease_prefix, guard_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
while true do
  local key = redis.call('lpop', waiting)
  if not key then
    break
  end
  local payload = redis.call('hget', waiting_payloads, key)
  if payload then
    redis.call('hdel', waiting_payloads, key)
    return payload
  end
end
if redis.call('exists', held) == 0 then
  return false
end
for _, key in ipairs(redis.call('smembers', held_probe)) do
  local record = redis.call('get', result_prefix .. key)
  if record then
    redis.call('srem', held_probe, key)
    local task = string.match(key, '^(.*)#')
    local members = redis.call('hget', held_tasks, task)
    local seconds = measured(record)
    if members and seconds then
      for _, member in ipairs(cjson.decode(members)) do
        redis.call('zadd', held, 'XX', -seconds, member)
      end
      redis.call('hdel', held_tasks, task)
    end
  end
end
while true do
  local popped = redis.call('zpopmin', held)
  if #popped == 0 then
    redis.call('del', held_payloads, held_tasks, held_probe, held_meta)
    return false
  end
  local payload = redis.call('hget', held_payloads, popped[1])
  if payload then
    redis.call('hdel', held_payloads, popped[1])
    local key = string.match(popped[1], '/(.*)$')
    guard(running, jobs, job, lease_prefix, guard_ms, payload, key)
    if redis.call('hexists', held_tasks, string.match(key, '^(.*)#')) == 1 then
      redis.call('sadd', held_probe, key)
    end
    if redis.call('exists', held) == 0 then
      redis.call('del', held_payloads, held_tasks, held_probe, held_meta)
    else
      redis.call('hset', held_meta, 'at', redis.call('time')[1])
    end
    return payload
  end
end
