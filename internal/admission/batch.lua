-- Several decisions of one component in one call, each decided by the very code of
-- bucket.lua or reserve.lua, in the order sent: decision i+1 reads what decision i
-- wrote. Go splices both scripts in below, each as the body of a function of its KEYS
-- and ARGV (batch.go), so that there is one copy of the arithmetic that mirrors the
-- reference model, and a batch of n decisions pays the cost of a call (the EVALSHA's
-- dispatch, its arguments, its reply, TIME, reading and writing the keys) once rather
-- than n times.
--
-- KEYS     every key the batch's decisions name, each once. In a Redis Cluster they
--          share one hash slot: the Go side puts in one batch only decisions whose
--          keys all have the same hash tag (an Admitter's keys all carry its cluster
--          key as theirs; a Limiter's keys, each its own, go in batches of their own)
-- ARGV[1]  the header, numbers of two bytes little-endian unless said otherwise:
--          the key lists: their number, then each list's length (one byte) and the
--          position in KEYS of each of its keys; the argument lists: their number,
--          then each list's length (one byte) and the position in ARGV of each of its
--          arguments; then the decisions, in order, five bytes each: the script ('b'
--          for bucket.lua, 'r' for reserve.lua), its key list and its argument list
-- ARGV[2..] every argument the decisions pass, each once
--
-- A key list or an argument list is built once a batch and handed, read only, to
-- every decision that names it, as are the keys and the arguments themselves: many
-- decisions of one Admitter pass the same keys and rates, and what a decision costs
-- Redis here is then its script's own work, not the building of its KEYS and ARGV.
--
-- The decisions read and write the keys through the table `redis` below, which stands
-- in for Redis's own and answers from a copy of the keys read once at the start:
--   TIME   the Redis time read once at the start: a batch is decided at one instant,
--          each decision at that time, as if they had all come in that microsecond
--   GET, MGET  the value the key holds after the decisions before (false: no key)
--   SET    the value a decision writes, seen by the decisions after; 'PX' x sets the
--          expiry the key will get, 'KEEPTTL' keeps the last one set in the batch or,
--          if none was, the key's own
-- After the last decision every key written is set once: to the last value written,
-- with the last PX set in the batch, or KEEPTTL when no decision set one. That is the
-- value and the expiry the same SETs one call each would have left, for one read and
-- one write a key rather than one a decision.
--
-- Reply: an array, one element per decision in order: its script's reply (the string
-- bucket.lua's or reserve.lua's header describes), or the error it raised. A decision
-- that raises (a bad argument: the scripts raise only while reading their arguments,
-- before they write) fails alone, and the decisions after it go on. An error of the
-- batch itself (reading the keys, or Redis refusing the first write when it is out of
-- memory) fails the whole call before anything is written.

local rcall = redis.call
local time = rcall('TIME')
-- As numbers, which the scripts' arithmetic gives the same value as the strings.
time = {tonumber(time[1]), tonumber(time[2])}
local value, px = {}, {}
do
  local stored = rcall('MGET', unpack(KEYS))
  for i = 1, #KEYS do value[KEYS[i]] = stored[i] end
end

local function call(cmd, ...)
  if cmd == 'SET' then
    local k, v, opt, x = ...
    value[k] = v
    if opt == 'PX' then
      px[k] = x
    elseif px[k] == nil then
      px[k] = false
    end
    return
  elseif cmd == 'MGET' then
    local r = {...}
    for i = 1, #r do r[i] = value[r[i]] end
    return r
  elseif cmd == 'GET' then
    return value[...]
  elseif cmd == 'TIME' then
    return time
  end
  error('batch.lua: a decision may not call ' .. tostring(cmd))
end
local redis = {call = call}

--[[decisions]]--

local decide = {[98] = bucket, [114] = reserve}
local b = {string.byte(ARGV[1], 1, -1)}
local p = 1
local keyLists, argLists = {}, {}
for l = 1, b[p] + b[p + 1] * 256 do
  p = p + 2
  local list = {}
  for j = 1, b[p] do
    list[j] = KEYS[b[p + 2 * j - 1] + b[p + 2 * j] * 256]
  end
  p = p + 2 * b[p] - 1
  keyLists[l] = list
end
p = p + 2
for l = 1, b[p] + b[p + 1] * 256 do
  p = p + 2
  local list = {}
  for j = 1, b[p] do
    list[j] = ARGV[b[p + 2 * j - 1] + b[p + 2 * j] * 256]
  end
  p = p + 2 * b[p] - 1
  argLists[l] = list
end
p = p + 2
local replies, n = {}, 0
for q = p, #b, 5 do
  local ok, reply = pcall(decide[b[q]], keyLists[b[q + 1] + b[q + 2] * 256], argLists[b[q + 3] + b[q + 4] * 256])
  n = n + 1
  if ok then
    replies[n] = reply
  elseif type(reply) == 'table' and reply.err then
    replies[n] = reply
  else
    replies[n] = {err = tostring(reply)}
  end
end

for i = 1, #KEYS do
  local k = KEYS[i]
  local x = px[k]
  if x then
    rcall('SET', k, value[k], 'PX', x)
  elseif x == false then
    rcall('SET', k, value[k], 'KEEPTTL')
  end
end
return replies
