-- `Shares.choose_share`: `shares.choose` in one step over Redis. A job waits when it has
-- held trials or trials parked for a slot, and is not cancelled. Dominant-resource fairness:
-- each busy trial (a slot held, or sent) holds what it asks (`J:requests`, stored with the held
-- trials), else its job's largest request (Share cpus, memory_mb); the next trial counts as that.
-- KEYS[1] shares   hash job id -> Share JSON
-- KEYS[2] weights  hash user:<name> | job:<job id> -> an operator's weight
-- ARGV: capacity (slots), the key prefix (`sciencebench:`), the cluster's cpus and memory_mb
--       (0: no host said its capacity; each trial then counts one)
local shares, weights = KEYS[1], KEYS[2]
local capacity = tonumber(ARGV[1])
local prefix = ARGV[2]
local total_cpus, total_memory = tonumber(ARGV[3]), tonumber(ARGV[4])
local drf = total_cpus > 0 and total_memory > 0
local entries = redis.call('hgetall', shares)
local jobs, by_user, total = {}, {}, 0
local all_cpus, all_memory = 0, 0
for i = 1, #entries, 2 do
  local job, share = entries[i], cjson.decode(entries[i + 1])
  share['cpus'] = share['cpus'] or 1
  share['memory_mb'] = share['memory_mb'] or 2048
  local members = redis.call('zrange', prefix .. job .. ':slots', 0, -1)
  for _, key in ipairs(redis.call('smembers', prefix .. job .. ':share:sent')) do
    table.insert(members, key)
  end
  local busy, cpus, memory = #members, 0, 0
  if busy > 0 then
    local asked = redis.call('hmget', prefix .. job .. ':requests', unpack(members))
    for k = 1, busy do
      local c, m = nil, nil
      if asked[k] then
        c, m = string.match(asked[k], '^(%S+) (%S+)$')
      end
      cpus = cpus + (tonumber(c) or share['cpus'])
      memory = memory + (tonumber(m) or share['memory_mb'])
    end
  end
  total = total + busy
  local user = by_user[share['user']] or {count = 0, cpus = 0, memory = 0}
  user.count = user.count + busy
  user.cpus = user.cpus + cpus
  user.memory = user.memory + memory
  by_user[share['user']] = user
  all_cpus = all_cpus + cpus
  all_memory = all_memory + memory
  table.insert(jobs, {job, share, busy, cpus, memory})
end
if total >= capacity then
  return false
end
-- A holder's dominant share with one more trial of `share` (without capacities: its trials, plus one).
local function part(count, cpus, memory, share)
  if not drf then
    return count + 1
  end
  return math.max((cpus + share['cpus']) / total_cpus, (memory + share['memory_mb']) / total_memory)
end
local best, best_rank = nil, nil
for _, c in ipairs(jobs) do
  local job, share, busy, cpus, memory = c[1], c[2], c[3], c[4], c[5]
  local waits = redis.call('exists', prefix .. job .. ':held')
    + redis.call('llen', prefix .. job .. ':waiting')
  local fits = not drf or (all_cpus + share['cpus'] <= total_cpus + 1e-9
    and all_memory + share['memory_mb'] <= total_memory)
  if waits > 0 and busy < share['cap'] and fits and redis.call('exists', prefix .. job .. ':cancelled') == 0 then
    local user = by_user[share['user']]
    local uw = tonumber(redis.call('hget', weights, 'user:' .. share['user']) or '1')
    local jw = tonumber(redis.call('hget', weights, 'job:' .. job) or share['weight'])
    local rank = {part(user.count, user.cpus, user.memory, share) / uw,
                  part(busy, cpus, memory, share) / jw, share['at'], job}
    local better = best_rank == nil
    if not better then
      for k = 1, 4 do
        if rank[k] ~= best_rank[k] then
          better = rank[k] < best_rank[k]
          break
        end
      end
    end
    if better then
      best, best_rank = job, rank
    end
  end
end
return best
