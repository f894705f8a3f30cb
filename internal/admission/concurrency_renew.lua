-- Renew the leases one replica still holds in one client's lease set.
--
-- KEYS[1]     the client's lease set (see concurrency_acquire.lua)
-- ARGV[1]     the lease TTL in milliseconds
-- ARGV[2...]  the ids of the leases to renew
--
-- A lease that is gone (it expired and another acquire dropped it) is not brought
-- back: its place may be someone else's now. Reply: the number of leases renewed.

local time = redis.call('TIME')
local expiry = string.format('%d', time[1] * 1000 + math.floor(time[2] / 1000) + tonumber(ARGV[1]))
local renewed = 0
for i = 2, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, ARGV[i])
end
if renewed > 0 then
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], string.format('%d', tonumber(last[2])))
end
return renewed
