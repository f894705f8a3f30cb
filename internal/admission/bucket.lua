-- One atomic decision over one or two token buckets (docs/design.md, "Admission
-- buckets").
--
-- KEYS[1]  the first bucket: the cluster bucket, or a Limiter's only key
-- KEYS[2]  optional second bucket: the client bucket, in KEYS[1]'s cluster slot
-- ARGV[1]  the cost n: "n" >= 1 takes n tokens from every bucket when each holds n,
--          and from none otherwise; "0" only looks (a peek takes nothing)
-- ARGV[2]  the rates, packed as little-endian doubles: refill (tokens per microsecond)
--          and burst of KEYS[1], then of KEYS[2] when given ('<dd' or '<dddd'), then
--          of KEYS[2]'s soft limit when it has one ('<dddddd'); with KEYS[1] alone, a
--          third double may follow ('<ddd'): a floor the take must leave in the bucket,
--          so that a warm-up never takes the tokens users are about to ask for
--
-- State: one 24-byte string per bucket, struct '<ddd': the tokens the bucket held at a
-- Redis TIME, that time in microseconds, and when the key expires (microseconds). A
-- missing key is a full bucket; a 16-byte key (written before the expiry was kept) is
-- read with an unknown expiry. Binary doubles keep every digit and cost Redis no number
-- formatting or parsing: string.format('%.17g') and tonumber of a "tokens:time" text
-- cost more than all the arithmetic here (see docs/benchmarks.md).
--
-- Soft limit: a client bucket with a soft limit is 32 bytes, '<dddd', its fourth double
-- the soft bucket's tokens at the same time. Kept in the client's own key, so that the
-- soft check costs no key, read or write of its own. An admitted take finding the soft
-- bucket short of n tokens is a soft breach; the soft bucket is charged only when it
-- holds them. A longer value is read by its first 24 bytes wherever no soft limit is
-- asked for: a client whose soft limit is dropped keeps its hard bucket.
--
-- Expiry: a key never expires before its bucket is full again. A take keeps the key's
-- expiry (SET ... KEEPTTL) while the stored one still covers the refill of what is
-- left; otherwise, and for a new key, it writes the time its bucket could refill from
-- empty, burst/refill, capped at 10^12 s (what EXPIRE accepts). Keeping the expiry is
-- most takes of a busy bucket, and costs Redis about a fifth of the instructions of
-- a decision less than parsing and setting a PX for each key (docs/benchmarks.md).
-- Each expiry written is computed before the first write and is a finite integer
-- whatever the rate, so a zero or tiny rate cannot make a SET fail halfway through the
-- writes; a rate of 0 never keeps (inf or nan is never covered). A decision that
-- refuses (a take or a peek) also checks that the key lives until its bucket is full at
-- the rate in force: a rate lowered while the bucket was empty would otherwise let the
-- key expire on the old, short expiry and come back as a full burst. At an unchanged
-- rate a take's expiry always covers that, so the check costs no write; only the first
-- refusal after a rate change (or of a 16-byte key) rewrites the key, with its tokens
-- as they are.
--
-- Reply: one string, struct '<Bdd' or '<Bdddd': admitted (1 or 0), then per bucket
-- the tokens left after the decision and the microseconds until it holds n tokens (0
-- when it holds them now, +inf when it never will); with a soft limit, '<BddddB', the
-- last byte 1 for a soft breach. Packed doubles again: a table of integers and the
-- rounding to fill it cost more than the packing.
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
-- A refusal rewrites a key whose expiry falls short of its refill, up to this far
-- ahead (about 3,000 years, below the 10^12 s written): a bucket that never refills
-- is not rewritten on every refusal.
local horizon = 1e17

if #KEYS == 1 then
  local r1, b1, floor = nil, nil, 0
  if #ARGV[2] == 24 then
    r1, b1, floor = unpack('<ddd', ARGV[2])
  else
    r1, b1 = unpack('<dd', ARGV[2])
  end
  local s1 = redis.call('GET', KEYS[1])
  local t1, e1 = b1, nil
  if s1 then
    local at
    if #s1 >= 24 then
      t1, at, e1 = unpack('<ddd', s1)
    elseif #s1 == 16 then
      t1, at = unpack('<dd', s1)
      e1 = 0
    end
    if at then
      if now > at then t1 = t1 + (now - at) * r1 end
      if t1 > b1 then t1 = b1 end
    else
      t1 = b1
    end
  end
  local admitted, w1 = 0, 0
  if t1 - floor >= n then
    admitted = 1
    if take then
      t1 = t1 - n
      if e1 and e1 >= now + (b1 - t1) / r1 then
        redis.call('SET', KEYS[1], pack('<ddd', t1, now, e1), 'KEEPTTL')
      else
        -- Rate 0 gives +inf: not below the cap.
        local x1 = ceil(b1 / r1 / 1000)
        if not (x1 < 1e15) then x1 = 1e15 elseif x1 < 1 then x1 = 1 end
        redis.call('SET', KEYS[1], pack('<ddd', t1, now, now + x1 * 1000), 'PX', format('%d', x1))
      end
    end
  elseif e1 then
    local full = (b1 - t1) / r1
    if not (full < horizon) then full = horizon end
    if e1 < now + full then
      local x1 = ceil((b1 - t1) / r1 / 1000)
      if not (x1 < 1e15) then x1 = 1e15 elseif x1 < 1 then x1 = 1 end
      redis.call('SET', KEYS[1], pack('<ddd', t1, now, now + x1 * 1000), 'PX', format('%d', x1))
    end
  end
  if t1 - floor < n then w1 = (n + floor - t1) / r1 end
  return pack('<Bdd', admitted, t1, w1)
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
local t1, t2, e1, e2 = b1, b2, nil, nil
local t3, at2 = b3, nil
if s1 then
  local at
  if #s1 >= 24 then
    t1, at, e1 = unpack('<ddd', s1)
  elseif #s1 == 16 then
    t1, at = unpack('<dd', s1)
    e1 = 0
  end
  if at then
    if now > at then t1 = t1 + (now - at) * r1 end
    if t1 > b1 then t1 = b1 end
  else
    t1 = b1
  end
end
if s2 then
  local at
  if #s2 >= 24 then
    if soft and #s2 >= 32 then
      t2, at, e2, t3 = unpack('<dddd', s2)
    else
      t2, at, e2 = unpack('<ddd', s2)
    end
  elseif #s2 == 16 then
    t2, at = unpack('<dd', s2)
    e2 = 0
  end
  if at then
    if now > at then
      t2 = t2 + (now - at) * r2
      if soft then t3 = t3 + (now - at) * r3 end
    end
    if t2 > b2 then t2 = b2 end
    if soft and t3 > b3 then t3 = b3 end
  else
    t2 = b2
  end
end
local admitted, w1, w2, breach = 0, 0, 0, 0
if t1 >= n and t2 >= n then
  admitted = 1
  if soft then
    if t3 >= n then
      if take then t3 = t3 - n end
    else
      breach = 1
    end
  end
  if take then
    t1, t2 = t1 - n, t2 - n
    local full2 = (b2 - t2) / r2
    if soft then
      -- The key outlives both refills: the soft one may be the slower.
      local full3 = (b3 - t3) / r3
      if not (full2 >= full3) then full2 = full3 end
    end
    local x1, x2
    if not (e1 and e1 >= now + (b1 - t1) / r1) then
      x1 = ceil(b1 / r1 / 1000)
      if not (x1 < 1e15) then x1 = 1e15 elseif x1 < 1 then x1 = 1 end
    end
    if not (e2 and e2 >= now + full2) then
      x2 = ceil(b2 / r2 / 1000)
      if soft then
        local x3 = ceil(b3 / r3 / 1000)
        if not (x2 >= x3) then x2 = x3 end
      end
      if not (x2 < 1e15) then x2 = 1e15 elseif x2 < 1 then x2 = 1 end
    end
    if x1 then
      redis.call('SET', KEYS[1], pack('<ddd', t1, now, now + x1 * 1000), 'PX', format('%d', x1))
    else
      redis.call('SET', KEYS[1], pack('<ddd', t1, now, e1), 'KEEPTTL')
    end
    if x2 then
      if soft then
        redis.call('SET', KEYS[2], pack('<dddd', t2, now, now + x2 * 1000, t3), 'PX', format('%d', x2))
      else
        redis.call('SET', KEYS[2], pack('<ddd', t2, now, now + x2 * 1000), 'PX', format('%d', x2))
      end
    elseif soft then
      redis.call('SET', KEYS[2], pack('<dddd', t2, now, e2, t3), 'KEEPTTL')
    else
      redis.call('SET', KEYS[2], pack('<ddd', t2, now, e2), 'KEEPTTL')
    end
  end
else
  if e1 then
    local full = (b1 - t1) / r1
    if not (full < horizon) then full = horizon end
    if e1 < now + full then
      local x1 = ceil((b1 - t1) / r1 / 1000)
      if not (x1 < 1e15) then x1 = 1e15 elseif x1 < 1 then x1 = 1 end
      redis.call('SET', KEYS[1], pack('<ddd', t1, now, now + x1 * 1000), 'PX', format('%d', x1))
    end
  end
  if e2 then
    local refill = (b2 - t2) / r2
    if soft then
      local refill3 = (b3 - t3) / r3
      if not (refill >= refill3) then refill = refill3 end
    end
    local full = refill
    if not (full < horizon) then full = horizon end
    if e2 < now + full then
      local x2 = ceil(refill / 1000)
      if not (x2 < 1e15) then x2 = 1e15 elseif x2 < 1 then x2 = 1 end
      if soft then
        redis.call('SET', KEYS[2], pack('<dddd', t2, now, now + x2 * 1000, t3), 'PX', format('%d', x2))
      else
        redis.call('SET', KEYS[2], pack('<ddd', t2, now, now + x2 * 1000), 'PX', format('%d', x2))
      end
    end
  end
end
if t1 < n then w1 = (n - t1) / r1 end
if t2 < n then w2 = (n - t2) / r2 end
if soft then
  return pack('<BddddB', admitted, t1, w1, t2, w2, breach)
end
return pack('<Bdddd', admitted, t1, w1, t2, w2)
