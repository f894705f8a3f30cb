-- Count a client's unexpired leases (see concurrency_acquire.lua). Writes nothing.
--
-- KEYS[1]  the client's lease set

local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf')
