-- Take one of a client's in-flight places (the concurrency cap of docs/design.md, "The
-- create path"), atomically.
--
-- KEYS[1]  the client's lease set: a sorted set of lease ids scored by their expiry
--          (unix milliseconds of Redis TIME)
-- ARGV[1]  the cap
-- ARGV[2]  the lease TTL in milliseconds
-- ARGV[3]  the new lease's id
-- ARGV[4…] leases the calling replica is giving back, whose ZREM may still be on its
--          way (a request is answered before its place is given back): dropped first,
--          so that they are never counted against the client's next request
--
-- Expired leases (those of a crashed replica, which stopped renewing them) are dropped
-- before counting, so their places come back. The key itself expires with its last
-- lease. Reply: {1 if acquired else 0, leases held after the call, Redis TIME of the
-- call in microseconds}: the time orders a replica's replies, which may come back in
-- any order over its connections.

local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
local at = time[1] * 1000000 + time[2]
for i = 4, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[1]) then
  return { 0, held, at }
end
redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[2])), ARGV[3])
-- Leases of other replicas may have a longer TTL: the key lives as long as the last.
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], string.format('%d', tonumber(last[2])))
return { 1, held + 1, at }
