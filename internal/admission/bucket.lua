-- One atomic decision over one or two token buckets, by the rules of the reference
-- model (internal/admission/model), computed in its order so that the two agree to the
-- last bit.
--
-- KEYS[1]  the first bucket: the cluster bucket, or a Limiter's only key
-- KEYS[2]  optional second bucket: the client bucket, in KEYS[1]'s cluster slot
-- ARGV[1]  the cost n: "n" >= 1 takes n tokens from every bucket when each holds n,
--          and from none otherwise; "0" only looks (a report, as an ask of 1)
-- ARGV[2]  the rates, packed as little-endian doubles: refill (tokens per microsecond)
--          and burst of KEYS[1], then of KEYS[2] when given ('<dd' or '<dddd'), then
--          of KEYS[2]'s soft limit when it has one ('<dddddd'); with KEYS[1] alone, a
--          third double may follow ('<ddd'): a floor the take must leave in the bucket,
--          so that a warm-up never takes the tokens users are about to ask for
--
-- State: packed doubles, which cost Redis no number formatting or parsing (text state
-- cost more than all the arithmetic here; docs/benchmarks.md). A bucket is '<dddd':
-- its tokens at a Redis TIME, that time (µs), the key's expiry (µs), and F, the time
-- from which it is full (model rule 1). A client key is '<ddddd': the same with the
-- soft bucket's tokens fourth (1e300 when it has none yet) and F fifth. Keys the
-- release before wrote (24 bytes; a soft client's 32, its fourth the soft tokens) are
-- read with F at their expiry, which is when that release's key vanished and read full.
-- Any other value (an older layout, a key written by hand) reads as a full bucket.
--
-- Expiry: a key never expires before its F (a missing key reads full, as the model says
-- of a bucket past its F), so that Redis forgets an idle bucket once it is full. A
-- write keeps the key's expiry (SET ... KEEPTTL) while the stored one outlives the F
-- written by a millisecond, the most Redis's clock of an expiry may lag TIME; otherwise
-- it sets the time its bucket could refill from empty (burst/refill) and two
-- milliseconds, capped at 10^12 s (what EXPIRE accepts), so that a busy key is
-- rewritten about once a refill: keeping the expiry costs Redis about a fifth of the
-- instructions of a decision less than parsing and setting a PX at every take
-- (docs/benchmarks.md). Each expiry is a finite integer whatever the rate, so a zero or
-- tiny rate cannot make a SET fail halfway through the writes.
--
-- A decision that takes nothing from a bucket (a refusal, a report) writes it only when
-- the rates asked with put its F more than a millisecond later than the F stored
-- (model rule 3): a rate lowered, or a burst raised, while the bucket was short. At
-- unchanged rates it writes nothing.
--
-- Reply: one string, '<Bdddd': admitted (1 or 0), the first bucket's level after the
-- decision (the floor not taken off), the µs until it holds n and the floor (0 when it
-- does, +inf when it never will), the Redis time of the decision; with a second bucket
-- '<BddddBd': admitted, per bucket the level and the µs until it holds n, the soft
-- breach byte, the time.
--
-- The two paths are written out rather than looped over tables or through closures:
-- building those per call cost about 6% more Redis CPU.

local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]
-- The usual costs are compared as strings: a tonumber costs about 2k instructions,
-- over 2% of a decision.
local n = ARGV[1]
if n == '1' then n = 1 elseif n == '0' then n = 0 else n = tonumber(n) end
local take = n > 0
if not take then n = 1 end
local format, ceil = string.format, math.ceil
local pack, unpack = struct.pack, struct.unpack
local huge = math.huge

if #KEYS == 1 then
  local r1, b1, floor = nil, nil, 0
  if #ARGV[2] == 24 then
    r1, b1, floor = unpack('<ddd', ARGV[2])
  else
    r1, b1 = unpack('<dd', ARGV[2])
  end
  local s1 = redis.call('GET', KEYS[1])
  local t1, e1, F1 = b1, nil, nil
  if s1 then
    local at
    if #s1 >= 32 then
      t1, at, e1, F1 = unpack('<dddd', s1)
    elseif #s1 >= 24 then
      t1, at, e1 = unpack('<ddd', s1)
      F1 = e1
    end
    if not at then
      t1, e1 = b1, nil
    elseif now < F1 then
      if now > at then t1 = t1 + (now - at) * r1 end
      if t1 > b1 then t1 = b1 end
    else
      t1 = b1
    end
  end
  local admitted = 0
  if t1 - floor >= n then
    admitted = 1
    if take then
      t1 = t1 - n
      local F = now
      if t1 < b1 then F = now + (b1 - t1) / r1 end
      if e1 and e1 >= F + 1000 then
        redis.call('SET', KEYS[1], pack('<dddd', t1, now, e1, F), 'KEEPTTL')
      else
        local d = F - now
        if not (d >= b1 / r1) then d = b1 / r1 end
        local x = ceil(d / 1000) + 2
        if not (x < 1e15) then x = 1e15 end
        redis.call('SET', KEYS[1], pack('<dddd', t1, now, now + x * 1000, F), 'PX', format('%d', x))
      end
    end
  end
  if admitted == 0 or not take then
    if e1 and t1 < b1 then
      local f = now + (b1 - t1) / r1
      if f > F1 + 1000 then
        local d = f - now
        if not (d >= b1 / r1) then d = b1 / r1 end
        local x = ceil(d / 1000) + 2
        if not (x < 1e15) then x = 1e15 end
        redis.call('SET', KEYS[1], pack('<dddd', t1, now, now + x * 1000, f), 'PX', format('%d', x))
      end
    end
  end
  -- Model rule 10, one source: linear up to the burst; never, past it.
  local w1 = 0
  if t1 - floor < n then
    w1 = huge
    if n + floor <= b1 then
      w1 = (n - (t1 - floor)) / r1
      local p = (b1 - t1) / r1
      if w1 > p then w1 = p end
    end
  end
  return pack('<Bddd', admitted, t1, w1, now)
end

local soft = #ARGV[2] == 48
local r1, b1, r2, b2, r3, b3
if soft then
  r1, b1, r2, b2, r3, b3 = unpack('<dddddd', ARGV[2])
else
  r1, b1, r2, b2 = unpack('<dddd', ARGV[2])
end
local stored = redis.call('MGET', KEYS[1], KEYS[2])
local s1, s2 = stored[1], stored[2]
local t1, t2, e1, e2, F1, F2 = b1, b2, nil, nil, nil, nil
local t3, known3 = b3, false
if s1 then
  local at
  if #s1 >= 32 then
    t1, at, e1, F1 = unpack('<dddd', s1)
  elseif #s1 >= 24 then
    t1, at, e1 = unpack('<ddd', s1)
    F1 = e1
  end
  if not at then
    t1, e1 = b1, nil
  elseif now < F1 then
    if now > at then t1 = t1 + (now - at) * r1 end
    if t1 > b1 then t1 = b1 end
  else
    t1 = b1
  end
end
if s2 then
  local at, x
  if #s2 >= 40 then
    t2, at, e2, x, F2 = unpack('<ddddd', s2)
  elseif #s2 >= 32 then
    t2, at, e2, x = unpack('<dddd', s2)
    F2 = e2
  elseif #s2 >= 24 then
    t2, at, e2 = unpack('<ddd', s2)
    F2 = e2
  end
  if at and now < F2 then
    if now > at then t2 = t2 + (now - at) * r2 end
    if t2 > b2 then t2 = b2 end
    if soft and x and x < 1e300 then
      known3 = true
      t3 = x
      if now > at then t3 = t3 + (now - at) * r3 end
      if t3 > b3 then t3 = b3 end
    end
  elseif at then
    t2 = b2
  else
    e2, F2 = nil, nil
  end
end
local admitted, breach = 0, 0
if t1 >= n and t2 >= n then
  admitted = 1
  if soft and t3 < n then breach = 1 end
end
if admitted == 1 and take then
  t1, t2 = t1 - n, t2 - n
  if soft and breach == 0 then t3 = t3 - n end
  local Fa = now
  if t1 < b1 then Fa = now + (b1 - t1) / r1 end
  local Fb = now
  if t2 < b2 then Fb = now + (b2 - t2) / r2 end
  local span2 = b2 / r2
  if soft then
    -- The key's F and span: the later of the hard and the soft bucket's.
    local f3 = now
    if t3 < b3 then f3 = now + (b3 - t3) / r3 end
    if not (Fb >= f3) then Fb = f3 end
    if not (span2 >= b3 / r3) then span2 = b3 / r3 end
  end
  if e1 and e1 >= Fa + 1000 then
    redis.call('SET', KEYS[1], pack('<dddd', t1, now, e1, Fa), 'KEEPTTL')
  else
    local d = Fa - now
    if not (d >= b1 / r1) then d = b1 / r1 end
    local x = ceil(d / 1000) + 2
    if not (x < 1e15) then x = 1e15 end
    redis.call('SET', KEYS[1], pack('<dddd', t1, now, now + x * 1000, Fa), 'PX', format('%d', x))
  end
  local x3 = 1e300
  if soft then x3 = t3 end
  if e2 and e2 >= Fb + 1000 then
    redis.call('SET', KEYS[2], pack('<ddddd', t2, now, e2, x3, Fb), 'KEEPTTL')
  else
    local d = Fb - now
    if not (d >= span2) then d = span2 end
    local x = ceil(d / 1000) + 2
    if not (x < 1e15) then x = 1e15 end
    redis.call('SET', KEYS[2], pack('<ddddd', t2, now, now + x * 1000, x3, Fb), 'PX', format('%d', x))
  end
else
  -- Model rule 3: a bucket short of its burst whose F the rates put later.
  if e1 and t1 < b1 then
    local f = now + (b1 - t1) / r1
    if f > F1 + 1000 then
      local d = f - now
      if not (d >= b1 / r1) then d = b1 / r1 end
      local x = ceil(d / 1000) + 2
      if not (x < 1e15) then x = 1e15 end
      redis.call('SET', KEYS[1], pack('<dddd', t1, now, now + x * 1000, f), 'PX', format('%d', x))
    end
  end
  if e2 then
    local f = now
    if t2 < b2 then f = now + (b2 - t2) / r2 end
    local span2 = b2 / r2
    if soft then
      local f3 = now
      if t3 < b3 then f3 = now + (b3 - t3) / r3 end
      if not (f >= f3) then f = f3 end
      if not (span2 >= b3 / r3) then span2 = b3 / r3 end
    end
    if f > now and f > F2 + 1000 then
      local d = f - now
      if not (d >= span2) then d = span2 end
      local x = ceil(d / 1000) + 2
      if not (x < 1e15) then x = 1e15 end
      local x3 = 1e300
      if soft then x3 = t3 end
      redis.call('SET', KEYS[2], pack('<ddddd', t2, now, now + x * 1000, x3, f), 'PX', format('%d', x))
    end
  end
end
-- Model rule 10, one source each: linear up to the burst; never, past it.
local w1, w2 = 0, 0
if t1 < n then
  w1 = huge
  if n <= b1 then
    w1 = (n - t1) / r1
    local p = (b1 - t1) / r1
    if w1 > p then w1 = p end
  end
end
if t2 < n then
  w2 = huge
  if n <= b2 then w2 = (n - t2) / r2 end
end
return pack('<BddddBd', admitted, t1, w1, t2, w2, breach, now)
