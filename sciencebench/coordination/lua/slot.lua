-- `Slots.acquire_slot`: take (or refresh) one of the job's slots (lib/take_slot.lua).
-- KEYS[1] slots  the job's slots (zset trial key -> expiry, ms)
-- ARGV: trial key, cap, ttl (ms)
local slots = KEYS[1]
return take_slot(slots, ARGV[1], ARGV[2], ARGV[3])
