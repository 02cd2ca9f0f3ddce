-- `PlacementStore.report`: a host's report of the images it holds, and its pulling marks of
-- them dropped (the report now says it holds them).
-- KEYS[1] holds    hash host -> HostImages JSON
-- KEYS[2] pulling  hash repository@digest -> Pulling JSON
-- ARGV: host, its report (JSON), the images it holds
local holds, pulling = KEYS[1], KEYS[2]
redis.call('hset', holds, ARGV[1], ARGV[2])
for i = 3, #ARGV do
  local mark = redis.call('hget', pulling, ARGV[i])
  if mark and cjson.decode(mark)['host'] == ARGV[1] then
    redis.call('hdel', pulling, ARGV[i])
  end
end
return 1
