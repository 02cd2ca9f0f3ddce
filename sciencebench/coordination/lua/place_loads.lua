-- `PlacementStore.loads`: per host, its trials running (claimed by it), routed to it and not
-- yet started, and of those the ones waiting for it; a route whose trial started or ended goes.
-- KEYS[1] jobs    the set of jobs with live state
-- KEYS[2] routed  hash <job>/<K> -> Routed JSON
-- ARGV: now (store clock), the key prefix (`sciencebench:`)
local jobs, routes = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])
local prefix = ARGV[2]
local out = {}
local function count(host, slot)
  if out[host] == nil then
    out[host] = {0, 0, 0}
  end
  out[host][slot] = out[host][slot] + 1
end
for _, job in ipairs(redis.call('smembers', jobs)) do
  for _, entry in ipairs(redis.call('hvals', prefix .. job .. ':running')) do
    local ok, payload = pcall(cjson.decode, entry)
    if ok and type(payload) == 'table' and type(payload['host']) == 'string' and payload['host'] ~= '' then
      count(payload['host'], 1)
    end
  end
end
local routed = redis.call('hgetall', routes)
for i = 1, #routed, 2 do
  local job, key = string.match(routed[i], '^([^/]*)/(.*)$')
  local ok, entry = pcall(cjson.decode, routed[i + 1])
  local running = job and redis.call('hget', prefix .. job .. ':running', key)
  local claimed = running and cjson.decode(running)['host']
  if not ok or not running or (claimed and claimed ~= '') then
    redis.call('hdel', routes, routed[i])  -- started (it counts where it runs), or over
  elseif entry['until'] > now then
    count(entry['host'], 2)
    if entry['waits'] then
      count(entry['host'], 3)
    end
  end
end
local flat = {}
for host, counts in pairs(out) do
  table.insert(flat, host)
  table.insert(flat, counts[1])
  table.insert(flat, counts[2])
  table.insert(flat, counts[3])
end
return flat
