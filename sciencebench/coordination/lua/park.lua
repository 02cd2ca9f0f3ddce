-- `Leases.park`: hold a trial's lease under a token unless the chord counted the trial
-- or a live process holds it; the job joins the watchdog's scan.
-- KEYS[1] lease    the trial's lease
-- KEYS[2] jobs     the jobs with live state (sciencebench:jobs)
-- KEYS[3] counted  present once the chord counted the trial
-- ARGV: token, ttl (ms), job id
local lease, jobs, counted = KEYS[1], KEYS[2], KEYS[3]
local token, ttl_ms, job = ARGV[1], ARGV[2], ARGV[3]
if redis.call('exists', counted) == 1 then
  return 0
end
local holder = redis.call('get', lease)
if holder and holder ~= token then
  return 0
end
if holder then
  -- Its own park again, for ttl_ms from now. A login node's user may not write a lease
  -- that exists (coordination.acl): its refresh is refused and the earlier park stays.
  redis.pcall('set', lease, token, 'PX', ttl_ms)
elseif park_absent(lease, token, ttl_ms) == 0 then
  return 0
end
redis.call('sadd', jobs, job)
return 1
