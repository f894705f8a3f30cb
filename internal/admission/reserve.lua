-- One atomic decision over the activation buckets while tiers reserve shares of the
-- cluster bucket: the client bucket (with its soft limit) and the cost drawn across the
-- tier's own reserve, the shared remainder and the reserves of idle tiers that lend.
-- All of it, or nothing. The rules are internal/admission/model's (the reference
-- model), computed in its order so that the two agree to the last bit; each step names
-- its rule. Every key is in the cluster key's Redis Cluster slot.
--
-- KEYS[1]   the shared remainder: the cluster key, at the cluster rate minus the reserves
-- KEYS[2]   the client bucket, when the layout (ARGV[2]) says so
-- KEYS[..]  the tier's own reserve, when the layout says so
-- KEYS[..]  every other tier's reserve, to borrow from
-- ARGV[1]   the cost n ("0" only looks, as an ask of 1 taking nothing)
-- ARGV[2]   the layout, three bytes: 'c' or '-' (a client bucket), 's' or '-' (a soft
--           limit), 'o' or '-' (an own reserve); then packed little-endian doubles:
--           refill (tokens per microsecond) and burst of the shared remainder; of the
--           client bucket; of its soft limit; of the own reserve (each when present);
--           then refill, burst and lendable fraction of each other reserve. One
--           argument rather than two: each argument of a call costs Redis about 1.9k
--           instructions, more than reading three bytes off the front of this one.
-- ARGV[3]   optional: a warm-up's floor, which the take must leave in the shared
--           remainder; a warm-up neither borrows nor takes from any reserve
--
-- State, packed little-endian doubles: the shared remainder '<dddd' (tokens, the Redis
-- time they were counted at, the key's expiry, F: when it is full); a client key and a
-- reserve '<ddddd' (tokens, time, expiry, a fourth, F), the fourth being the soft
-- bucket's tokens (1e300: none yet) or the time the reserve's tier turns idle. Keys
-- written by the release before (24 bytes; 32 for a soft client or a reserve, whose
-- fourth is then its last ask) are read with F at their expiry, which is when that
-- release's key vanished and read full; any other value reads as a full bucket. A key
-- expires no earlier than its F (and a reserve's idle time): a missing key reads full,
-- as the model says of a bucket past F. Expiries are set as bucket.lua sets them.
--
-- Reply: '<BBddddddddd': admitted, soft breach, the client tokens left and the µs until
-- the bucket holds n, what the tier can draw now and the µs until it could draw n, the
-- bound (what it could draw on, lenders idle or not), the tokens drawn from its own
-- reserve, the shared remainder and lenders, and the Redis time of the decision.
--
-- The usual path (a tier's own reserve, the shared remainder, no lender) is written
-- out on locals: a table per source and a function per step cost about a third more
-- Redis CPU than the decision itself.

local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]
local n = ARGV[1]
if n == '1' then n = 1 elseif n == '0' then n = 0 else n = tonumber(n) end
local take = n > 0
if not take then n = 1 end
local sunpack, spack, format, ceil, huge = struct.unpack, struct.pack, string.format, math.ceil, math.huge
local args = ARGV[2]
-- One call for the three bytes of the layout: 99 'c', 115 's', 111 'o'.
local l1, l2, l3 = string.byte(args, 1, 3)
local hasClient, hasSoft, hasOwn = l1 == 99, l2 == 115, l3 == 111
local pos = 4
local floor = 0
if ARGV[3] then floor = tonumber(ARGV[3]) end
local stored = redis.call('MGET', unpack(KEYS))

-- A write's expiry: the stored one (e) kept while it outlives need (the F written, or
-- a reserve's idle time) by a millisecond; otherwise the later of need and span (a
-- whole refill) and two milliseconds. Returns the PX (nil: KEEPTTL) and the expiry.
local function expiry(e, need, span)
  if e and e >= need + 1000 then return nil, e end
  local d = need - now
  if not (d >= span) then d = span end
  local x = ceil(d / 1000) + 2
  if not (x < 1e15) then x = 1e15 end
  return x, now + x * 1000
end

-- The shared remainder. Rule 1: its level.
local rs, bs
rs, bs, pos = sunpack('<dd', args, pos)
local ls, es, Fs, sw = bs, nil, nil, false
do
  local s = stored[1]
  local t, at
  if s and #s >= 32 then
    t, at, es, Fs = sunpack('<dddd', s)
  elseif s and #s >= 24 then
    t, at, es = sunpack('<ddd', s)
    Fs = es
  end
  if t then
    sw = true
    if now < Fs then
      if now > at then t = t + (now - at) * rs end
      if t > bs then t = bs end
      ls = t
    end
  end
end
local i = 1

-- Rule 4: the client bucket and its soft bucket, one key.
local ci, rc, bc, rsoft, bsoft, lc, lsoft, ec, Fc
local clientOK = true
if hasClient then
  i = i + 1
  ci = i
  rc, bc, pos = sunpack('<dd', args, pos)
  if hasSoft then
    rsoft, bsoft, pos = sunpack('<dd', args, pos)
    lsoft = bsoft
  end
  lc = bc
  local s = stored[ci]
  local t, at, x
  if s and #s >= 40 then
    t, at, ec, x, Fc = sunpack('<ddddd', s)
  elseif s and #s >= 32 then
    t, at, ec, x = sunpack('<dddd', s)
    Fc = ec
  elseif s and #s >= 24 then
    t, at, ec = sunpack('<ddd', s)
    Fc = ec
  end
  if t and now < Fc then
    if now > at then t = t + (now - at) * rc end
    if t > bc then t = bc end
    lc = t
    if hasSoft and x and x < 1e300 then
      if now > at then x = x + (now - at) * rsoft end
      if x > bsoft then x = bsoft end
      lsoft = x
    end
  end
  clientOK = lc >= n
end

-- The own reserve: its level, key, expiry, F, idle time, and whether it was written.
local ro, bo, lo, eo, Fo, Io, ow, ok
if hasOwn then
  i = i + 1
  ok = i
  ro, bo, pos = sunpack('<dd', args, pos)
  lo = bo
  local s = stored[ok]
  local t, at
  if s and #s >= 40 then
    t, at, eo, Io, Fo = sunpack('<ddddd', s)
  elseif s and #s >= 32 then
    t, at, eo, Io = sunpack('<dddd', s)
    Io, Fo = Io + bo / ro, eo
  elseif s and #s >= 24 then
    t, at, eo = sunpack('<ddd', s)
    Io, Fo = -huge, eo
  end
  if t then
    ow = true
    if now < Fo then
      if now > at then t = t + (now - at) * ro end
      if t > bo then t = bo end
      lo = t
    end
  end
end
-- A warm-up draws on the shared remainder alone (the Go side sends no reserve).
local own = hasOwn and floor <= 0

-- Rule 6: the lenders, idle or not, in the table's order, each seven numbers in L:
-- key index, rate, burst, level, keep, µs until idle (0: idle), written (1 or 0); and
-- its expiry, F and idle time in LE, LF, LI.
local L, LE, LF, LI, nl = nil, nil, nil, nil, 0
if floor <= 0 and #KEYS > i then
  L, LE, LF, LI = {}, {}, {}, {}
  for j = i + 1, #KEYS do
    local r, b, lend
    r, b, lend, pos = sunpack('<ddd', args, pos)
    if lend > 0 then
      local s = stored[j]
      local t, at, e, I, F
      if s and #s >= 40 then
        t, at, e, I, F = sunpack('<ddddd', s)
      elseif s and #s >= 32 then
        t, at, e, I = sunpack('<dddd', s)
        I, F = I + b / r, e
      elseif s and #s >= 24 then
        t, at, e = sunpack('<ddd', s)
        I, F = -huge, e
      end
      local lv, from, w = b, 0, 0
      if t then
        w = 1
        if now < F then
          if now > at then t = t + (now - at) * r end
          if t > b then t = b end
          lv = t
        end
        if now < I then from = I - now end
      end
      nl = nl + 1
      local p = (nl - 1) * 7
      L[p + 1], L[p + 2], L[p + 3], L[p + 4], L[p + 5], L[p + 6], L[p + 7] = j, r, b, lv, (1 - lend) * b, from, w
      LE[nl], LF[nl], LI[nl] = e, F, I
    end
  end
end

-- Rule 6: the cost drawn in order, all or nothing; what each source gives.
local need = n
local dOwn, dShared, dL = 0, 0, nil
if clientOK then
  if own and lo > 0 then
    local v = lo
    if v > need then v = need end
    need = need - v
    dOwn = v
  end
  if need > 0 then
    local v = ls - floor
    if v > 0 then
      if v > need then v = need end
      need = need - v
      dShared = v
    end
  end
  if nl > 0 then
    dL = {}
    for k = 1, nl do
      local v = 0
      local p = (k - 1) * 7
      if need > 0 and L[p + 6] <= 0 then
        v = L[p + 4] - L[p + 5]
        if v > 0 then
          if v > need then v = need end
          need = need - v
        else
          v = 0
        end
      end
      dL[k] = v
    end
  end
end
local admitted = clientOK and need <= 0
local drew = admitted and take

-- The sources' writes: rule 2 for what a take drew from, rule 3 for the rest.
local dBorrowed = 0
local ownF = Fo
local ownWritten = false
if own then
  if drew and dOwn > 0 then
    lo = lo - dOwn
    local F = now
    if lo < bo then F = now + (bo - lo) / ro end
    Io = now + bo / ro
    local need2 = F
    if not (need2 >= Io) then need2 = Io end
    local px, e = expiry(eo, need2, 2 * (bo / ro))
    if px then
      redis.call('SET', KEYS[ok], spack('<ddddd', lo, now, e, Io, F), 'PX', format('%d', px))
    else
      redis.call('SET', KEYS[ok], spack('<ddddd', lo, now, e, Io, F), 'KEEPTTL')
    end
    ownWritten = true
  elseif ow and lo < bo then
    local f = now + (bo - lo) / ro
    if f > Fo + 1000 then
      ownF = f
      local need2 = f
      if not (need2 >= Io) then need2 = Io end
      local px, e = expiry(eo, need2, 2 * (bo / ro))
      if px then
        redis.call('SET', KEYS[ok], spack('<ddddd', lo, now, e, Io, f), 'PX', format('%d', px))
      else
        redis.call('SET', KEYS[ok], spack('<ddddd', lo, now, e, Io, f), 'KEEPTTL')
      end
      eo = e
    end
  end
end
if drew and dShared > 0 then
  ls = ls - dShared
  local F = now
  if ls < bs then F = now + (bs - ls) / rs end
  local px, e = expiry(es, F, bs / rs)
  if px then
    redis.call('SET', KEYS[1], spack('<dddd', ls, now, e, F), 'PX', format('%d', px))
  else
    redis.call('SET', KEYS[1], spack('<dddd', ls, now, e, F), 'KEEPTTL')
  end
elseif sw and ls < bs then
  local f = now + (bs - ls) / rs
  if f > Fs + 1000 then
    local px, e = expiry(es, f, bs / rs)
    if px then
      redis.call('SET', KEYS[1], spack('<dddd', ls, now, e, f), 'PX', format('%d', px))
    else
      redis.call('SET', KEYS[1], spack('<dddd', ls, now, e, f), 'KEEPTTL')
    end
  end
end
for k = 1, nl do
  local p = (k - 1) * 7
  local r, b, lv, I = L[p + 2], L[p + 3], L[p + 4], LI[k]
  if I == nil then I = -huge end
  if drew and dL[k] > 0 then
    lv = lv - dL[k]
    L[p + 4] = lv
    dBorrowed = dBorrowed + dL[k]
    local F = now
    if lv < b then F = now + (b - lv) / r end
    local need2 = F
    if not (need2 >= I) then need2 = I end
    local px, e = expiry(LE[k], need2, 2 * (b / r))
    if px then
      redis.call('SET', KEYS[L[p + 1]], spack('<ddddd', lv, now, e, I, F), 'PX', format('%d', px))
    else
      redis.call('SET', KEYS[L[p + 1]], spack('<ddddd', lv, now, e, I, F), 'KEEPTTL')
    end
  elseif L[p + 7] == 1 and lv < b then
    local f = now + (b - lv) / r
    if f > LF[k] + 1000 then
      local need2 = f
      if not (need2 >= I) then need2 = I end
      local px, e = expiry(LE[k], need2, 2 * (b / r))
      if px then
        redis.call('SET', KEYS[L[p + 1]], spack('<ddddd', lv, now, e, I, f), 'PX', format('%d', px))
      else
        redis.call('SET', KEYS[L[p + 1]], spack('<ddddd', lv, now, e, I, f), 'KEEPTTL')
      end
    end
  end
end

-- Rule 7: an ask whose client held its cost marks its tier active; the reserve is
-- written when not drawn from and its mark has less than 15/16 of an interval left.
if take and clientOK and own and not ownWritten then
  local iv = bo / ro
  if not ow or Io < now + iv - iv / 16 then
    local F = ownF
    if not ow then
      F = now
      if lo < bo then F = now + (bo - lo) / ro end
    end
    local I = now + iv
    local need2 = F
    if not (need2 >= I) then need2 = I end
    local px, e = expiry(eo, need2, 2 * iv)
    if px then
      redis.call('SET', KEYS[ok], spack('<ddddd', lo, now, e, I, F), 'PX', format('%d', px))
    else
      redis.call('SET', KEYS[ok], spack('<ddddd', lo, now, e, I, F), 'KEEPTTL')
    end
  end
end

-- Rule 4: the client key.
local breach = 0
local left, softLeft = lc, lsoft
if hasClient then
  local write = false
  if drew then
    left = lc - n
    if hasSoft then
      if lsoft >= n then softLeft = lsoft - n else breach = 1 end
    end
    write = true
  elseif admitted and hasSoft and lsoft < n then
    breach = 1
  end
  -- The key's F: the later of the hard and the soft bucket's.
  local F = now
  if left < bc then F = now + (bc - left) / rc end
  if hasSoft then
    local fs = now
    if softLeft < bsoft then fs = now + (bsoft - softLeft) / rsoft end
    if not (F >= fs) then F = fs end
  end
  local e = ec
  if not write and Fc ~= nil and F > now and F > Fc + 1000 then
    write, e = true, nil
  end
  if write then
    local span = bc / rc
    if hasSoft and not (span >= bsoft / rsoft) then span = bsoft / rsoft end
    local px
    px, e = expiry(e, F, span)
    local x = 1e300
    if hasSoft then x = softLeft end
    if px then
      redis.call('SET', KEYS[ci], spack('<ddddd', left, now, e, x, F), 'PX', format('%d', px))
    else
      redis.call('SET', KEYS[ci], spack('<ddddd', left, now, e, x, F), 'KEEPTTL')
    end
  end
end

-- Rules 9 and 11: what the tier can draw now, and its bound.
local avail, bound = ls - floor, ls
if own then
  avail = lo + avail
  bound = lo + bound
end
for k = 1, nl do
  local p = (k - 1) * 7
  local v = L[p + 4] - L[p + 5]
  if v > 0 then
    bound = bound + v
    if L[p + 6] <= 0 then avail = avail + v end
  end
end

-- Rule 10: when the sources could give n, each refilling linearly up to its burst, a
-- lender from when it turns idle: swept between the times a part starts, starts to
-- rise or stops. Only a refusal or a report gets this far with avail < n.
local wait = 0
if avail < n then
  -- The sources: rate, burst, level, keep, µs until it may be drawn from, lender.
  local S = {}
  if own then S[#S + 1] = {ro, bo, lo, 0, 0, false} end
  S[#S + 1] = {rs, bs, ls, floor, 0, false}
  for k = 1, nl do
    local p = (k - 1) * 7
    S[#S + 1] = {L[p + 2], L[p + 3], L[p + 4], L[p + 5], L[p + 6], true}
  end
  local ns = #S
  local function linear(x, w)
    if w >= (x[2] - x[3]) / x[1] then return x[2] end
    local v = x[3] + w * x[1]
    if v > x[2] then v = x[2] end
    return v
  end
  local function slope(w)
    local s = 0
    for k = 1, ns do
      local x = S[k]
      if not (w < x[5]) then
        local v = linear(x, w)
        if v < x[2] and (not x[6] or v > x[4]) then s = s + x[1] end
      end
    end
    return s
  end
  local function partsAt(w)
    local total = 0
    for k = 1, ns do
      local x = S[k]
      local v = 0
      if not (w < x[5]) then
        v = linear(x, w) - x[4]
        if x[6] and v < 0 then v = 0 end
      end
      total = total + v
    end
    return total
  end
  wait = huge
  local points, np = {}, 0
  for k = 1, ns do
    local x = S[k]
    local w3 = {x[5], (x[4] - x[3]) / x[1], (x[2] - x[3]) / x[1]}
    for q = 1, 3 do
      local w = w3[q]
      if w > 0 and w < huge then
        np = np + 1
        local m = np
        while m > 1 and points[m - 1] > w do
          points[m] = points[m - 1]
          m = m - 1
        end
        points[m] = w
      end
    end
  end
  local prev, sum, found = 0, avail, false
  for m = 1, np do
    local w = points[m]
    if w > prev then
      local s = slope((prev + w) / 2)
      if s > 0 then
        local reach = prev + (n - sum) / s
        if reach <= w then
          wait, found = reach, true
          break
        end
      end
      sum = partsAt(w)
      if sum >= n then
        wait, found = w, true
        break
      end
      prev = w
    end
  end
  if not found then
    local s = slope(prev + 1)
    if s > 0 then wait = prev + (n - sum) / s end
  end
end

local wc = 0
if hasClient and left < n then
  wc = huge
  if n <= bc then wc = (n - left) / rc end
end
if not drew then dOwn, dShared = 0, 0 end
return spack('<BBddddddddd', admitted and 1 or 0, breach, left or 0, wc, avail, wait, bound, dOwn, dShared, dBorrowed, now)
