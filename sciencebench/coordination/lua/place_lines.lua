-- `PlacementStore.lines`: per host, what the store knows of each of its running trials and of
-- each trial routed to it and not started (a route counts as in place_loads.lua, which drops the
-- stale ones); `placement.host_lines` turns these into seconds. What a trial's task measured:
-- the measured seconds of an earlier attempt (its record, lib/measured.lua; the first ARGV[3]
-- attempts), as `placement.expected_of`, or '' when none did. A running trial's time is its
-- state `running`'s (else now); a routed one's, its route's.
-- KEYS[1] jobs    the set of jobs with live state
-- KEYS[2] routed  hash <job>/<K> -> Routed JSON
-- ARGV: now (store clock), the key prefix (`sciencebench:`), attempts read back
-- Returns a flat list of host, 'end' | 'line', measured seconds or '', time; numbers as strings
-- (Redis would cut a Lua number to an integer).
local jobs, routes = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])
local prefix = ARGV[2]
local back = tonumber(ARGV[3])
local out = {}
local function decoded(value)
  if not value then
    return nil
  end
  local ok, decoded_value = pcall(cjson.decode, value)
  if ok and type(decoded_value) == 'table' then
    return decoded_value
  end
  return nil
end
local function measured_of(job, key)
  local task, attempt = string.match(key, '^(.*)#(%d+)$')
  if task then
    for n = 1, math.min(tonumber(attempt) - 1, back) do
      local record = redis.call('get', prefix .. job .. ':result:' .. task .. '#' .. n)
      local seconds = record and measured(record)
      if seconds then
        return tostring(seconds)
      end
    end
  end
  return ''
end
local function add(host, kind, seconds, at)
  table.insert(out, host)
  table.insert(out, kind)
  table.insert(out, seconds)
  table.insert(out, tostring(at))
end
for _, job in ipairs(redis.call('smembers', jobs)) do
  local running = redis.call('hgetall', prefix .. job .. ':running')
  for i = 1, #running, 2 do
    local key, payload = running[i], decoded(running[i + 1])
    if payload then
      local host = payload['host']
      if type(host) == 'string' and host ~= '' then
        local started = now
        local status = decoded(redis.call('hget', prefix .. job .. ':state', key))
        if status and status['state'] == 'running' and type(status['at']) == 'number' then
          started = status['at']
        end
        add(host, 'end', measured_of(job, key), started)
      else
        local route = decoded(redis.call('hget', routes, job .. '/' .. key))
        if route and type(route['until']) == 'number' and route['until'] > now then
          add(route['host'], 'line', measured_of(job, key), route['at'])
        end
      end
    end
  end
end
return out
