-- `Slots.take_room`: take (or refresh) a trial's part of a host's capacity (lib/take_room.lua).
-- KEYS[1] room           the trials holding part of the host's capacity (zset J/K -> expiry, ms)
-- KEYS[2] room_requests  what each of them requests (hash J/K -> "<cpus> <memory_mb>")
-- ARGV: member (J/K), cpus, memory_mb, the host's cpus, the host's memory_mb, ttl (ms)
local room, requests = KEYS[1], KEYS[2]
return take_room(room, requests, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
