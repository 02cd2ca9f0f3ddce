-- `Shares.choose_share`: `shares.choose` in one step over Redis. A job waits when it has
-- held trials or trials parked for a slot, and is not cancelled.
-- KEYS[1] shares   hash job id -> Share JSON
-- KEYS[2] weights  hash user:<name> | job:<job id> -> an operator's weight
-- ARGV: capacity, the key prefix (`sciencebench:`)
local shares, weights = KEYS[1], KEYS[2]
local capacity = tonumber(ARGV[1])
local prefix = ARGV[2]
local entries = redis.call('hgetall', shares)
local busy_by_user, candidates, total = {}, {}, 0
for i = 1, #entries, 2 do
  local job, share = entries[i], cjson.decode(entries[i + 1])
  local busy = redis.call('zcard', prefix .. job .. ':slots')
    + redis.call('scard', prefix .. job .. ':share:sent')
  total = total + busy
  busy_by_user[share['user']] = (busy_by_user[share['user']] or 0) + busy
  local waits = redis.call('exists', prefix .. job .. ':held')
    + redis.call('llen', prefix .. job .. ':waiting')
  if waits > 0 and busy < share['cap'] and redis.call('exists', prefix .. job .. ':cancelled') == 0 then
    table.insert(candidates, {job, share, busy})
  end
end
if total >= capacity or #candidates == 0 then
  return false
end
local best, best_rank = nil, nil
for _, c in ipairs(candidates) do
  local job, share, busy = c[1], c[2], c[3]
  local uw = tonumber(redis.call('hget', weights, 'user:' .. share['user']) or '1')
  local jw = tonumber(redis.call('hget', weights, 'job:' .. job) or share['weight'])
  local rank = {(busy_by_user[share['user']] + 1) / uw, (busy + 1) / jw, share['at'], job}
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
return best
