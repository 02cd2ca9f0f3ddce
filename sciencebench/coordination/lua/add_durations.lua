-- `History.add_durations`: add a job's measured seconds to the history hash: entries
-- [seconds, job] of this job are replaced, and only the newest `keep` are kept.
-- KEYS[1] history  hash <task id>/<task hash>/<agent> -> JSON [[seconds, job id], ...]
-- ARGV: job id, keep, then pairs: history key, JSON list of seconds
local history = KEYS[1]
local job, keep = ARGV[1], tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
  local kept = {}
  local old = redis.call('hget', history, ARGV[i])
  if old then
    for _, entry in ipairs(cjson.decode(old)) do
      if entry[2] ~= job then
        table.insert(kept, entry)
      end
    end
  end
  for _, seconds in ipairs(cjson.decode(ARGV[i + 1])) do
    table.insert(kept, {seconds, job})
  end
  while #kept > keep do
    table.remove(kept, 1)
  end
  redis.call('hset', history, ARGV[i], cjson.encode(kept))
end
return 1
