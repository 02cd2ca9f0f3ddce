-- rightful(lease, running, field, owner): is `owner` still the trial's rightful holder?
-- It holds the lease, or the lease lapsed while nobody could renew it (a broker outage)
-- and the trial's running entry (hash `running`, field `field`) still names it: no
-- watchdog has sent the trial to anyone else. Once one has, the caller's claim is gone.
local function rightful(lease, running, field, owner)
  local holder = redis.call('get', lease)
  if holder then
    return holder == owner
  end
  local entry = redis.call('hget', running, field)
  return entry ~= false and cjson.decode(entry)['owner'] == owner
end
