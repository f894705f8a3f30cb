-- One atomic decision over the activation buckets when tiers reserve shares of the
-- cluster bucket (docs/tiers.md, "Reserved capacity"): the client bucket (with its
-- soft limit) and one cluster token from, in this order, the tier's own reserve, the
-- shared remainder, or another tier's reserve that is idle and lends. All of it, or
-- nothing. Every key is in the cluster key's Redis Cluster slot.
--
-- KEYS[1]   the shared remainder: the cluster key, at the cluster rate minus the reserves
-- KEYS[2]   the client bucket, when the layout (ARGV[2]) says so
-- KEYS[..]  the tier's own reserve, when the layout says so
-- KEYS[..]  every other tier's reserve, to borrow from
-- ARGV[1]   the cost n ("0" only looks, taking nothing)
-- ARGV[2]   the layout, three bytes: 'c' or '-' (a client bucket), 's' or '-' (a soft
--           limit), 'o' or '-' (an own reserve); then packed little-endian doubles:
--           refill (tokens per microsecond) and burst of the shared remainder; of the
--           client bucket; of its soft limit; of the own reserve (each when present);
--           then refill, burst and lendable fraction of each other reserve. One
--           argument rather than two: each argument of a call costs Redis about 1.9k
--           instructions, more than reading three bytes off the front of this one.
-- ARGV[3]   optional: a floor the take must leave in the shared remainder, for a
--           warm-up, which then neither borrows nor takes from any reserve
--
-- State: the shared remainder and a client bucket as bucket.lua writes them ('<ddd',
-- or '<dddd' with the soft tokens). A reserve is '<dddd': tokens, the Redis time they
-- were counted at, the key's expiry, and when its tier last asked for a cluster
-- token. A tier that asked within its reserve's refill interval (burst/refill) is
-- active and lends nothing: a tier that starts bursting again has its reserve to
-- itself at once, and its reserved rate back as the reserve refills. Borrowing takes
-- only what the lendable fraction leaves above (1 - lendable) * burst.
--
-- Reply: '<BBBdddd': admitted, soft breach, where the cluster token came from (0 none,
-- 1 shared, 2 own reserve, 3 borrowed), the client tokens left and the microseconds
-- until it holds n, then an upper bound of the cluster tokens this tier could draw on
-- (own + shared + what others could ever lend, idle or not) and the microseconds until
-- the earliest of them holds n. The bound lets a replica refuse from memory without
-- ever refusing a tier whose reserve holds tokens.

local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]
local n = ARGV[1]
if n == '1' then n = 1 elseif n == '0' then n = 0 else n = tonumber(n) end
local take = n > 0
if not take then n = 1 end
local sunpack, spack, format, ceil = struct.unpack, struct.pack, string.format, math.ceil
local args = ARGV[2]
-- One call for the three bytes of the layout: 99 'c', 115 's', 111 'o'.
local l1, l2, l3 = string.byte(args, 1, 3)
local hasClient, hasSoft, hasOwn = l1 == 99, l2 == 115, l3 == 111
local pos = 4
local floor = 0
if ARGV[3] then floor = tonumber(ARGV[3]) end
local stored = redis.call('MGET', unpack(KEYS))

-- A key's state is its tokens at rate r and burst b now, its stored expiry (nil for a
-- missing key: a full bucket), the fourth double (0 when absent, -huge for a missing
-- key: a reserve never asked for) and the time it was counted at; read inline for the
-- buckets every charge has (a function made per call costs more than the reading).
local rs, bs
rs, bs, pos = sunpack('<dd', args, pos)
local ts, es = bs, nil
do
  local s = stored[1]
  local t, at, e
  if s and #s >= 24 then
    t, at, e = sunpack('<ddd', s)
  elseif s and #s == 16 then
    t, at = sunpack('<dd', s)
    e = 0
  end
  if t then
    if now > at then t = t + (now - at) * rs end
    if t > bs then t = bs end
    ts, es = t, e
  end
end
local i = 1

local ci, tc, ec, rc, bc, rsoft, bsoft, tsoft = nil, nil, nil, nil, nil, nil, nil, nil
if hasClient then
  i = i + 1
  ci = i
  rc, bc, pos = sunpack('<dd', args, pos)
  local s = stored[ci]
  local t, at, e, x
  if s and #s >= 32 then
    t, at, e, x = sunpack('<dddd', s)
  elseif s and #s >= 24 then
    t, at, e = sunpack('<ddd', s)
  elseif s and #s == 16 then
    t, at = sunpack('<dd', s)
    e = 0
  end
  tc, ec = bc, nil
  if t then
    if now > at then t = t + (now - at) * rc end
    if t > bc then t = bc end
    tc, ec = t, e
  end
  if hasSoft then
    rsoft, bsoft, pos = sunpack('<dd', args, pos)
    tsoft = bsoft
    if x then
      tsoft = x
      if now > at then tsoft = tsoft + (now - at) * rsoft end
      if tsoft > bsoft then tsoft = bsoft end
    end
  end
end

local oi, to, ro, bo, lo, eo = nil, 0, 0, 0, 0, nil
if hasOwn then
  i = i + 1
  oi = i
  ro, bo, pos = sunpack('<dd', args, pos)
  local s = stored[oi]
  local t, at, e, x
  if s and #s >= 32 then
    t, at, e, x = sunpack('<dddd', s)
  elseif s and #s >= 24 then
    t, at, e = sunpack('<ddd', s)
    x = 0
  elseif s and #s == 16 then
    t, at = sunpack('<dd', s)
    e, x = 0, 0
  end
  to, eo, lo = bo, nil, -math.huge
  if t then
    if now > at then t = t + (now - at) * ro end
    if t > bo then t = bo end
    to, eo, lo = t, e, x
  end
end

-- The other reserves: key index, tokens, rate, burst, lendable, last asked, expiry.
-- Made only when there are some: most charges have none to borrow from.
local others, nothers = nil, #KEYS - i
if nothers > 0 then
  others = {}
  for j = i + 1, #KEYS do
    local r, b, l
    r, b, l, pos = sunpack('<ddd', args, pos)
    local s = stored[j]
    local t, at, e, last = b, nil, nil, -math.huge
    if s and #s >= 32 then
      t, at, e, last = sunpack('<dddd', s)
    elseif s and #s >= 24 then
      t, at, e = sunpack('<ddd', s)
      last = 0
    elseif s and #s == 16 then
      t, at = sunpack('<dd', s)
      e, last = 0, 0
    end
    if at then
      if now > at then t = t + (now - at) * r end
      if t > b then t = b end
    else
      t = b
    end
    others[#others + 1] = {j, t, r, b, l, last, e}
  end
end

-- writeOwn stores the tier's own reserve as it now is, with its tier's last ask at
-- now. That mark keeps others from borrowing for a refill interval (burst/refill), so
-- the key must outlive it, not only the refill of what the reserve holds (which is
-- never longer): an expired key reads as a full reserve whose tier is idle, and a
-- nearly full reserve's refill ends long before the interval does. The expiry is kept
-- while it covers now + the interval, and set to twice the interval when it does not,
-- so that it is rewritten about once an interval.
local function writeOwn()
  if eo ~= nil and eo >= now + bo / ro then
    redis.call('SET', KEYS[oi], spack('<dddd', to, now, eo, now), 'KEEPTTL')
  else
    local x = ceil(2 * (bo / ro) / 1000)
    if not (x < 1e15) then x = 1e15 elseif x < 1 then x = 1 end
    redis.call('SET', KEYS[oi], spack('<dddd', to, now, now + x * 1000, now), 'PX', format('%d', x))
  end
end

local clientOK = (not hasClient) or tc >= n
local from, source = nil, 0
if hasOwn and to >= n then
  from, source = oi, 2
elseif ts - floor >= n then
  from, source = 1, 1
elseif floor == 0 then
  local best = -1
  for k = 1, nothers do
    local o = others[k]
    local keep = (1 - o[5]) * o[4]
    local spare = o[2] - keep - n
    if o[5] > 0 and spare >= 0 and spare > best and now - o[6] >= o[4] / o[3] then
      best, from = spare, k
    end
  end
  if from then source = 3 end
end

local admitted, breach = 0, 0
if clientOK and from then
  admitted = 1
  if hasSoft then
    if tsoft >= n then
      if take then tsoft = tsoft - n end
    else
      breach = 1
    end
  end
end

-- A take keeps a key's expiry (SET ... KEEPTTL) while the stored one (e) outlives the
-- refill of what is left, e >= now + (burst - tokens) / refill, as bucket.lua does, and
-- sets a new one (burst/refill) only when it falls short.
if take and admitted == 1 then
  if hasClient then
    tc = tc - n
    -- The key outlives both refills: the soft one may be the slower.
    if (ec ~= nil and ec >= now + (bc - tc) / rc) and not (hasSoft and not (ec ~= nil and ec >= now + (bsoft - tsoft) / rsoft)) then
      if hasSoft then
        redis.call('SET', KEYS[ci], spack('<dddd', tc, now, ec, tsoft), 'KEEPTTL')
      else
        redis.call('SET', KEYS[ci], spack('<ddd', tc, now, ec), 'KEEPTTL')
      end
    else
      local x = ceil((bc / rc) / 1000)
      if not (x < 1e15) then x = 1e15 elseif x < 1 then x = 1 end
      if hasSoft then
        local xs = ceil((bsoft / rsoft) / 1000)
        if not (xs < 1e15) then xs = 1e15 elseif xs < 1 then xs = 1 end
        if x < xs then x = xs end
        redis.call('SET', KEYS[ci], spack('<dddd', tc, now, now + x * 1000, tsoft), 'PX', format('%d', x))
      else
        redis.call('SET', KEYS[ci], spack('<ddd', tc, now, now + x * 1000), 'PX', format('%d', x))
      end
    end
  end
  if source == 1 then
    ts = ts - n
    if (es ~= nil and es >= now + (bs - ts) / rs) then
      redis.call('SET', KEYS[1], spack('<ddd', ts, now, es), 'KEEPTTL')
    else
      local x = ceil((bs / rs) / 1000)
      if not (x < 1e15) then x = 1e15 elseif x < 1 then x = 1 end
      redis.call('SET', KEYS[1], spack('<ddd', ts, now, now + x * 1000), 'PX', format('%d', x))
    end
  elseif source == 2 then
    to = to - n
    writeOwn()
    lo = now
  else
    local o = others[from]
    o[2] = o[2] - n
    if (o[7] ~= nil and o[7] >= now + (o[4] - o[2]) / o[3]) then
      redis.call('SET', KEYS[o[1]], spack('<dddd', o[2], now, o[7], o[6]), 'KEEPTTL')
    else
      local x = ceil((o[4] / o[3]) / 1000)
      if not (x < 1e15) then x = 1e15 elseif x < 1 then x = 1 end
      redis.call('SET', KEYS[o[1]], spack('<dddd', o[2], now, now + x * 1000, o[6]), 'PX', format('%d', x))
    end
  end
end

-- A tier that asked for a cluster token (its client had one) is active: its reserve
-- records the time, so that nobody borrows from it for a refill interval. Recorded
-- when the token did not come from the reserve itself (that write records it), and at
-- most sixteen times per interval.
if take and hasOwn and clientOK and source ~= 2 and now - lo > bo / ro / 16 then
  writeOwn()
end

-- A refusal checks that the client bucket and the shared remainder live until they
-- are full at the rates in force, as bucket.lua does, so that a rate lowered while a
-- bucket is empty never brings it back as a full burst.
if take and admitted == 0 then
  if hasClient and ec then
    local refill = (bc - tc) / rc
    if hasSoft then
      local r3 = (bsoft - tsoft) / rsoft
      if not (refill >= r3) then refill = r3 end
    end
    local full = refill
    if not (full < 1e17) then full = 1e17 end
    if ec < now + full then
      local x = ceil((refill) / 1000)
      if not (x < 1e15) then x = 1e15 elseif x < 1 then x = 1 end
      if hasSoft then
        redis.call('SET', KEYS[ci], spack('<dddd', tc, now, now + x * 1000, tsoft), 'PX', format('%d', x))
      else
        redis.call('SET', KEYS[ci], spack('<ddd', tc, now, now + x * 1000), 'PX', format('%d', x))
      end
    end
  end
  if es then
    local refill = (bs - ts) / rs
    local full = refill
    if not (full < 1e17) then full = 1e17 end
    if es < now + full then
      local x = ceil((refill) / 1000)
      if not (x < 1e15) then x = 1e15 elseif x < 1 then x = 1 end
      redis.call('SET', KEYS[1], spack('<ddd', ts, now, now + x * 1000), 'PX', format('%d', x))
    end
  end
end

local wc = 0
if hasClient and tc < n then wc = (n - tc) / rc end
-- What this tier could draw on, and the earliest it could get n of it.
local avail, wait = ts - floor, 0
if ts - floor < n then wait = (n + floor - ts) / rs end
if hasOwn then
  avail = avail + to
  local w = 0
  if to < n then w = (n - to) / ro end
  if w < wait then wait = w end
end
for k = 1, nothers do
  local o = others[k]
  if o[5] > 0 and floor == 0 then
    local keep = (1 - o[5]) * o[4]
    local spare = o[2] - keep
    if spare > 0 then avail = avail + spare end
    local w = 0
    if spare < n then w = (n - spare) / o[3] end
    local idle = o[6] + o[4] / o[3] - now
    if idle > w then w = idle end
    if w < wait then wait = w end
  end
end
if from then wait = 0 end
return spack('<BBBdddd', admitted, breach, source, tc or 0, wc, avail, wait)
