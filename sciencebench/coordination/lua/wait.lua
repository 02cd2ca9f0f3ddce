-- `Slots.wait_for_slot`: queue a trial for a slot once; waiting again refreshes the
-- payload and keeps the place.
-- KEYS[1] waiting           the trial keys waiting, oldest first (list)
-- KEYS[2] waiting_payloads  hash trial key -> the Redispatch JSON to send it with
-- ARGV: trial key, payload
local waiting, payloads = KEYS[1], KEYS[2]
local key, payload = ARGV[1], ARGV[2]
if redis.call('hset', payloads, key, payload) == 1 then
  redis.call('rpush', waiting, key)
end
return 1
