-- One atomic decision over one or two token buckets (DESIGN.md §3).
--
-- KEYS[1]  the first bucket: the cluster bucket, or a Limiter's only key
-- KEYS[2]  optional second bucket: the client bucket, in KEYS[1]'s cluster slot
-- ARGV[1]  "1" takes one token from every bucket when each holds one, and from none
--          otherwise; "0" only looks (a peek writes nothing)
-- ARGV[2]  the rates, packed as little-endian doubles: refill (tokens per microsecond)
--          and burst of KEYS[1], then of KEYS[2] when given ('<dd' or '<dddd')
--
-- State: one 16-byte string per bucket, struct '<dd': the tokens the bucket held at a
-- Redis TIME, and that time in microseconds. A missing key (or one that is not 16
-- bytes) is a full bucket. Binary doubles keep every digit and cost Redis no number
-- formatting or parsing: string.format('%.17g') and tonumber of a "tokens:time" text
-- cost more than all the arithmetic here (see docs/benchmarks.md).
--
-- A written key expires once its bucket could have refilled completely, burst/refill
-- seconds, capped at 10^12 s (what EXPIRE accepts). Both expiries are computed before
-- the first write and are finite integers whatever the rate, so a zero or tiny rate
-- cannot make a SET fail halfway through the writes.
--
-- Reply: one string, struct '<Bdd' or '<Bdddd': admitted (1 or 0), then per bucket
-- the tokens left after the decision and the microseconds until it holds a whole
-- token (0 when it holds one now, +inf when it never refills). Packed doubles again:
-- a table of integers and the rounding to fill it cost more than the packing.
--
-- The two paths are written out rather than looped over tables or through closures:
-- building those per call cost about 6% more Redis CPU.

local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]
local take = ARGV[1] == '1'
local format, ceil = string.format, math.ceil
local pack, unpack = struct.pack, struct.unpack

if #KEYS == 1 then
  local r1, b1 = unpack('<dd', ARGV[2])
  local s1 = redis.call('GET', KEYS[1])
  local t1 = b1
  if s1 and #s1 == 16 then
    local at
    t1, at = unpack('<dd', s1)
    if now > at then t1 = t1 + (now - at) * r1 end
    if t1 > b1 then t1 = b1 end
  end
  local admitted, w1 = 0, 0
  if t1 >= 1 then
    admitted = 1
    if take then
      t1 = t1 - 1
      -- Rate 0 gives +inf: not below the cap.
      local x1 = ceil(b1 / r1 / 1000)
      if not (x1 < 1e15) then x1 = 1e15 elseif x1 < 1 then x1 = 1 end
      redis.call('SET', KEYS[1], pack('<dd', t1, now), 'PX', format('%d', x1))
    end
  end
  if t1 < 1 then w1 = (1 - t1) / r1 end
  return pack('<Bdd', admitted, t1, w1)
end

local r1, b1, r2, b2 = unpack('<dddd', ARGV[2])
local stored = redis.call('MGET', KEYS[1], KEYS[2])
local s1, s2 = stored[1], stored[2]
local t1, t2 = b1, b2
if s1 and #s1 == 16 then
  local at
  t1, at = unpack('<dd', s1)
  if now > at then t1 = t1 + (now - at) * r1 end
  if t1 > b1 then t1 = b1 end
end
if s2 and #s2 == 16 then
  local at
  t2, at = unpack('<dd', s2)
  if now > at then t2 = t2 + (now - at) * r2 end
  if t2 > b2 then t2 = b2 end
end
local admitted, w1, w2 = 0, 0, 0
if t1 >= 1 and t2 >= 1 then
  admitted = 1
  if take then
    t1, t2 = t1 - 1, t2 - 1
    local x1 = ceil(b1 / r1 / 1000)
    if not (x1 < 1e15) then x1 = 1e15 elseif x1 < 1 then x1 = 1 end
    local x2 = ceil(b2 / r2 / 1000)
    if not (x2 < 1e15) then x2 = 1e15 elseif x2 < 1 then x2 = 1 end
    redis.call('SET', KEYS[1], pack('<dd', t1, now), 'PX', format('%d', x1))
    redis.call('SET', KEYS[2], pack('<dd', t2, now), 'PX', format('%d', x2))
  end
end
if t1 < 1 then w1 = (1 - t1) / r1 end
if t2 < 1 then w2 = (1 - t2) / r2 end
return pack('<Bdddd', admitted, t1, w1, t2, w2)
