// Package model is the reference model of admission: what a decision admits, refuses
// and reports, for any configuration and any sequence of asks, stated once. It has no
// Redis and no clock: every decision is given its time, in microseconds as Redis
// TIME reads it. The Lua scripts (internal/admission/bucket.lua, reserve.lua), the
// refusal memory, the reports and the outage share are tested against it, on real
// Redis, with seeded random configurations and sequences (internal/admission,
// model_test.go); docs/design.md and docs/tiers.md cite these rules rather than
// restate them.
//
// # Buckets
//
// A bucket has a rate r (tokens a microsecond; refill_rps / 10⁶) and a burst b. Its
// state is what its last write left: tokens t at time at, and F, the time from which
// it is full. A bucket never written (or whose key expired, which never happens
// before F) is full.
//
//  1. Level. Asked at time now under rates (r, b), a bucket holds b when now ≥ F, and
//     otherwise min(b, t + (now − at)·r) (no refill when now ≤ at: a clock that steps
//     back gives nothing). Rates are those of the ask: a rate or burst changed between
//     two asks applies to the refill since the last write, so a lowered rate is never
//     made up for, and a bucket full under its old rates stays full under new ones.
//  2. Write. A write at now leaves tokens t' and sets F = now + (b − t')/r under the
//     rates of the write (now when t' ≥ b; +∞ for a rate of 0). Every take writes.
//  3. Check. A decision that takes nothing from a bucket it could draw from (a
//     refusal, a report, a source not drawn) rewrites it with its level when the
//     rates of the ask put F more than CheckSlack later than the F stored: a rate
//     lowered, or a burst raised, while a bucket was short is then never undone by
//     the old F. At unchanged rates F does not move and nothing is written.
//
// Floating point: every formula here is computed in the order the scripts compute it,
// so the model and Redis agree to the last bit; the tests compare decisions exactly.
//
// # A decision
//
// An ask (space.Charge) has a cost n ≥ 1, a client bucket (its Rate, or nil: exempt)
// with an optional soft limit, a tier, and for a warm-up a floor. A report takes
// nothing and is decided as an ask of cost 1.
//
//  4. Client. The client's bucket must hold n. Its soft bucket lives in the same key
//     (one at, one F: the later of the two full times) and never refuses: an admitted
//     take finding it short of n is a soft breach and takes nothing from it;
//     otherwise it takes n too. A soft limit new to a key starts full.
//  5. Cluster, without reserves. The cluster bucket must hold n + floor; an admitted
//     take takes n.
//  6. Cluster, with reserves (space.Reservations). The cluster key is the shared
//     remainder, at the cluster rate less every reserve. A tier's charge may draw on,
//     in this order: its own reserve; the shared remainder; each other reserve (in
//     the table's order) whose tier is idle, down to (1 − lendable)·burst. The cost is
//     drawn across them, all of it or none: each source gives what it holds up to
//     what is still needed. A warm-up (floor > 0) draws only on the shared remainder,
//     which must keep the floor after it.
//  7. Idle. A tier is idle from IdleAt on. Each ask of a tier with a reserve whose
//     client bucket held n (admitted or refused by the cluster side) marks it active:
//     IdleAt = now + burst/rate of its reserve, written when the reserve is drawn
//     from, and otherwise only when the mark stored has less than 15/16 of that left
//     (at most 16 writes an interval). A reserve never written is idle.
//  8. All or nothing. Admitted when the client bucket holds n (or there is none) and
//     the cluster side can draw n. Only an admitted take writes what it takes; a
//     refusal takes nothing, and names client_activation when the client bucket was
//     short (whatever the cluster held), cluster_activation otherwise.
//
// # What a decision reports
//
//  9. Remaining. The client bucket's level after the decision; for the cluster side,
//     what the tier can draw now (rule 6, lenders idle now only; a warm-up's shared
//     remainder less the floor).
//  10. Retry. For a bucket short of n, the least wait after which it would hold n if
//     nothing else asked, each source refilling linearly at its rate up to its part
//     (an F that comes earlier, after a rate change, is not counted: the wait is
//     never early), a lender counted from when it turns idle; +∞ when it never would.
//     A refusal's retry is the longer of the short buckets'.
//  11. Bound. What the refusal memory may keep of a tier's cluster side: everything it
//     could draw on, lenders idle or not (the floor aside). It only falls with takes
//     and rises at most at the sum of the sources' rates (and by CheckSlack of their
//     refill after a rate change), so it is an upper bound for as long as the rates
//     hold, whoever takes. A warm-up reads no reserve: with reserves its decision
//     bounds nothing.
//
// # The outage share
//
//  12. While Redis cannot decide, each of n replicas decides alone on a copy of the
//     cluster side (the cluster bucket, or the shared remainder and the reserves) by
//     the same rules, each cost taken n times from its copy (Outage): n copies spent
//     alone take the cluster budget about once between them. A copy starts full
//     unless it starts from a known state of the cluster bucket; a cost n times over
//     larger than a copy's burst is admitted from a full copy, into debt, so that
//     more replicas than tokens still admit a nth of the rate each. Client buckets are
//     not shared out (docs/design.md says why).
package model

import (
	"math"

	"github.com/space-sandbox/space"
)

// CheckSlack is how much later (µs) the rates of an ask must put a bucket's F than
// the F stored before a check rewrites it (rule 3): a millisecond, far above the
// rounding of two ways of computing one F at unchanged rates, far below any refill
// that matters. A bucket's level may therefore reach its burst up to a millisecond of
// refill early after a rate change; the refusal memory allows for it (MemorySlack).
const CheckSlack = 1000.0

// MemorySlack is the refill time (µs) the refusal memory adds to what it knows of a
// bucket: CheckSlack, the most a bucket can come early after a rate change.
const MemorySlack = CheckSlack

// Rate is a bucket's rate as the scripts read it: tokens a microsecond, and burst.
type Rate struct {
	PerMicro float64
	Burst    float64
}

// RateOf is r as the scripts read it.
func RateOf(r space.Rate) Rate { return Rate{PerMicro: r.RefillRPS / 1e6, Burst: float64(r.Burst)} }

// Bucket is one bucket's state (rule 1). The zero Bucket is one never written: full.
type Bucket struct {
	Written bool
	Tokens  float64
	At      float64
	Full    float64
}

// Level is what the bucket holds at now under r (rule 1).
func (b Bucket) Level(r Rate, now float64) float64 {
	if !b.Written || now >= b.Full {
		return r.Burst
	}
	t := b.Tokens
	if now > b.At {
		t = t + float64((now-b.At)*r.PerMicro)
	}
	if t > r.Burst {
		t = r.Burst
	}
	return t
}

// FullAt is when a bucket left with tokens at now is full under r (rule 2).
func FullAt(tokens float64, r Rate, now float64) float64 {
	if tokens >= r.Burst {
		return now
	}
	return now + (r.Burst-tokens)/r.PerMicro
}

// write sets the bucket to tokens at now, full at full.
func (b *Bucket) write(tokens, now, full float64) {
	*b = Bucket{Written: true, Tokens: tokens, At: now, Full: full}
}

// check is rule 3 for a bucket found at level under r. A full bucket has nothing to
// move (its F under any rates is now).
func (b *Bucket) check(level float64, r Rate, now float64) {
	if !b.Written {
		return
	}
	if f := FullAt(level, r, now); f > now && f > b.Full+CheckSlack {
		b.write(level, now, f)
	}
}

// Client is a client key: its bucket and, in the same key, its soft bucket's tokens
// (SoftKnown false: a soft limit new to the key, full).
type Client struct {
	Bucket
	Soft      float64
	SoftKnown bool
}

// levels are the client's hard and soft levels at now (soft only when soft is not
// nil).
func (c Client) levels(hard Rate, soft *Rate, now float64) (float64, float64) {
	h := c.Level(hard, now)
	if soft == nil {
		return h, 0
	}
	if !c.Written || now >= c.Full || !c.SoftKnown {
		return h, soft.Burst
	}
	s := c.Soft
	if now > c.At {
		s = s + float64((now-c.At)*soft.PerMicro)
	}
	if s > soft.Burst {
		s = soft.Burst
	}
	return h, s
}

// fullAt is the key's F for hard and soft tokens: the later of the two.
func clientFullAt(hard float64, hr Rate, soft float64, sr *Rate, now float64) float64 {
	f := FullAt(hard, hr, now)
	if sr != nil {
		if fs := FullAt(soft, *sr, now); !(f >= fs) {
			f = fs
		}
	}
	return f
}

// Reserve is a tier's reserve: its bucket and when its tier turns idle.
type Reserve struct {
	Bucket
	IdleAt float64
}

// Interval is a reserve's idle interval under r: burst/rate.
func Interval(r Rate) float64 { return r.Burst / r.PerMicro }

// idle reports whether the reserve's tier is idle at now (rule 7): a reserve never
// written is.
func (r Reserve) idle(now float64) bool { return !r.Written || now >= r.IdleAt }

// State is everything the rules read and write: the cluster key (the cluster bucket,
// or the shared remainder while tiers reserve), the client keys and the reserves.
type State struct {
	Cluster  Bucket
	Clients  map[space.ClientKey]*Client
	Reserves map[string]*Reserve
}

// NewState is a state where nothing was ever written: every bucket full.
func NewState() *State {
	return &State{Clients: map[space.ClientKey]*Client{}, Reserves: map[string]*Reserve{}}
}

// Clone is a deep copy of s.
func (s *State) Clone() *State {
	c := &State{Cluster: s.Cluster, Clients: make(map[space.ClientKey]*Client, len(s.Clients)), Reserves: make(map[string]*Reserve, len(s.Reserves))}
	for k, v := range s.Clients {
		x := *v
		c.Clients[k] = &x
	}
	for k, v := range s.Reserves {
		x := *v
		c.Reserves[k] = &x
	}
	return c
}

func (s *State) client(key space.ClientKey) *Client {
	c, ok := s.Clients[key]
	if !ok {
		c = &Client{}
		s.Clients[key] = c
	}
	return c
}

func (s *State) reserve(tier string) *Reserve {
	r, ok := s.Reserves[tier]
	if !ok {
		r = &Reserve{}
		s.Reserves[tier] = r
	}
	return r
}

// Limits are the rates in force at an ask: the cluster bucket and how tiers share it.
type Limits struct {
	Cluster      space.Rate
	Reservations *space.Reservations
}

// Side is one side of a decision as reported (rules 9 and 10).
type Side struct {
	// Remaining is the client bucket's level after the decision, or what the
	// cluster side can draw now.
	Remaining float64
	// Wait is the µs until it holds the cost if nothing else asks (0 when it does);
	// +Inf when it never will.
	Wait float64
}

// Drawn is where an admitted take's cluster tokens came from.
type Drawn struct{ Own, Shared, Borrowed float64 }

// Source names where most of the tokens came from, in the words of the source label
// of space_sandbox_admission_cluster_tokens_total: "reserve" (the tier's own),
// "shared" or "borrowed" (the first of them on a tie); "" when nothing was drawn. A
// source that gave only what refilled since its last take (a fraction) does not name
// a charge the rest of which came from elsewhere.
func (d Drawn) Source() string {
	name, most := "", 0.0
	for _, x := range [...]struct {
		name   string
		tokens float64
	}{{"reserve", d.Own}, {"shared", d.Shared}, {"borrowed", d.Borrowed}} {
		if x.tokens > most {
			name, most = x.name, x.tokens
		}
	}
	return name
}

// Decision is what the rules decide for one ask.
type Decision struct {
	Admitted bool
	// Bucket is the refusing bucket, "" when admitted.
	Bucket     space.Bucket
	SoftBreach bool
	Drawn      Drawn
	// Client is nil for a charge without a client bucket.
	Client  *Side
	Cluster Side
	// Bound is the memory's upper bound of the tier's cluster side (rule 11).
	Bound float64
	// RetryAfter is the refusal's wait in µs (rule 10); 0 when admitted.
	RetryAfter float64
}

// Decide is the decision of ask c (a take when take is true, a report otherwise) at
// now under lim, applied to s.
func Decide(s *State, lim Limits, c space.Charge, take bool, now float64) Decision {
	n := float64(c.Cost)
	if !take || n < 1 {
		n = 1
	}
	var d Decision
	// The client side (rule 4).
	var cl *Client
	var hr Rate
	var sr *Rate
	clientOK := true
	var lc, ls float64
	if c.Rate != nil {
		cl = s.client(c.Key)
		hr = RateOf(*c.Rate)
		if c.Soft != nil {
			r := RateOf(*c.Soft)
			sr = &r
		}
		lc, ls = cl.levels(hr, sr, now)
		clientOK = lc >= n
	}
	// The cluster side (rules 5 to 7).
	p := plan(s, lim, c, now)
	admitted := clientOK && p.draws(n)
	d.Admitted = admitted
	if admitted && take {
		d.Drawn = p.take(n, now)
		if lim.Reservations == nil {
			d.Drawn = Drawn{} // one cluster bucket: nowhere else to come from
		}
	} else {
		p.checkAll(now)
	}
	if take && clientOK {
		p.mark(now)
	}
	if cl != nil {
		left, soft := lc, ls
		if admitted && take {
			left = lc - n
			if sr != nil {
				if ls >= n {
					soft = ls - n
				} else {
					d.SoftBreach = true
				}
			}
			cl.Bucket.write(left, now, clientFullAt(left, hr, soft, sr, now))
			cl.Soft, cl.SoftKnown = soft, sr != nil
		} else {
			if admitted && sr != nil && ls < n {
				d.SoftBreach = true // a report tells whether a take would breach
			}
			if cl.Written {
				if f := clientFullAt(lc, hr, ls, sr, now); f > now && f > cl.Full+CheckSlack {
					cl.Bucket.write(lc, now, f)
					cl.Soft, cl.SoftKnown = ls, sr != nil
				}
			}
		}
		wait := 0.0
		if left < n {
			wait = math.Inf(1) // a cost past its burst never fits
			if n <= hr.Burst {
				wait = (n - left) / hr.PerMicro
			}
		}
		d.Client = &Side{Remaining: left, Wait: wait}
	}
	avail := p.avail()
	d.Cluster = Side{Remaining: avail, Wait: p.wait(avail, n)}
	d.Bound = p.bound()
	if !admitted {
		if cl != nil && !clientOK {
			d.Bucket = space.BucketClientActivation
			d.RetryAfter = d.Client.Wait
		} else {
			d.Bucket = space.BucketClusterActivation
		}
		if d.Cluster.Wait > 0 && !(d.RetryAfter >= d.Cluster.Wait) {
			d.RetryAfter = d.Cluster.Wait
		}
	}
	return d
}

// source is one bucket a charge's cluster side may draw on: its level, the part of
// it that may not be drawn (keep), and when it may be drawn from.
type source struct {
	b     *Bucket
	r     Rate
	level float64
	// keep is what it keeps: a lender's (1 − lendable)·burst, a warm-up's floor.
	keep float64
	// from is the µs until it may be drawn from: a busy lender's wait to turn idle.
	from   float64
	lender bool
	kind   int // kindOwn, kindShared or kindLender, for Drawn
}

const (
	kindOwn = iota
	kindShared
	kindLender
)

// spare is what the source may give now: a lender nothing while busy and never below
// its keep; the shared remainder of a warm-up may be short of its floor (negative).
func (x source) spare() float64 {
	if x.from > 0 {
		return 0
	}
	v := x.level - x.keep
	if x.lender && v < 0 {
		return 0
	}
	return v
}

// clusterPlan is the cluster side of one charge: its sources in drawing order, and the
// own reserve to mark.
type clusterPlan struct {
	sources  []source
	own      *Reserve
	ownRate  Rate
	ownLevel float64
	ownDrawn bool
}

// plan reads the charge's sources (rules 5 and 6) at now.
func plan(s *State, lim Limits, c space.Charge, now float64) *clusterPlan {
	p := &clusterPlan{}
	res := lim.Reservations
	if res == nil {
		r := RateOf(lim.Cluster)
		p.sources = append(p.sources, source{b: &s.Cluster, r: r, level: s.Cluster.Level(r, now), keep: float64(c.Floor), kind: kindShared})
		return p
	}
	warmUp := c.Floor > 0
	if !warmUp {
		for _, t := range res.Reserves {
			if t.Tier == c.Tier {
				rv := s.reserve(t.Tier)
				r := RateOf(t.Rate)
				p.own, p.ownRate, p.ownLevel = rv, r, rv.Level(r, now)
				p.sources = append(p.sources, source{b: &rv.Bucket, r: r, level: p.ownLevel, kind: kindOwn})
			}
		}
	}
	sr := RateOf(res.Shared)
	p.sources = append(p.sources, source{b: &s.Cluster, r: sr, level: s.Cluster.Level(sr, now), keep: float64(c.Floor), kind: kindShared})
	for _, t := range res.Reserves {
		if warmUp || t.Tier == c.Tier || !(t.Lendable > 0) {
			continue
		}
		rv := s.reserve(t.Tier)
		r := RateOf(t.Rate)
		x := source{b: &rv.Bucket, r: r, level: rv.Level(r, now), keep: (1 - t.Lendable) * r.Burst, lender: true, kind: kindLender}
		if !rv.idle(now) {
			x.from = rv.IdleAt - now
		}
		p.sources = append(p.sources, x)
	}
	return p
}

// draws reports whether the sources give n, drawn in order (rule 6).
func (p *clusterPlan) draws(n float64) bool {
	need := n
	for _, x := range p.sources {
		if need <= 0 {
			break
		}
		v := x.spare()
		if v <= 0 {
			continue
		}
		if v > need {
			v = need
		}
		need = need - v
	}
	return need <= 0
}

// take draws n from the sources in order, writes what it drew from and checks the
// rest, and returns where the tokens came from.
func (p *clusterPlan) take(n, now float64) Drawn {
	var d Drawn
	need := n
	for i := range p.sources {
		x := &p.sources[i]
		v := 0.0
		if need > 0 {
			if v = x.spare(); v > need {
				v = need
			}
		}
		if v <= 0 {
			x.b.check(x.level, x.r, now)
			continue
		}
		need = need - v
		x.level = x.level - v
		x.b.write(x.level, now, FullAt(x.level, x.r, now))
		switch x.kind {
		case kindOwn:
			d.Own = v
			p.ownLevel, p.ownDrawn = x.level, true
			p.own.IdleAt = now + Interval(x.r)
		case kindShared:
			d.Shared = v
		default:
			d.Borrowed = d.Borrowed + v
		}
	}
	return d
}

// checkAll checks every source (rule 3) of a decision that took nothing.
func (p *clusterPlan) checkAll(now float64) {
	for _, x := range p.sources {
		x.b.check(x.level, x.r, now)
	}
}

// mark is rule 7 for an ask whose client held its cost: the own reserve, when not
// drawn from, is marked active when its mark has less than 15/16 of an interval left.
// The mark writes the reserve's level at now, its F as the check left it.
func (p *clusterPlan) mark(now float64) {
	if p.own == nil || p.ownDrawn {
		return
	}
	iv := Interval(p.ownRate)
	if p.own.Written && !(p.own.IdleAt < now+iv-iv/16) {
		return
	}
	full := p.own.Full
	if !p.own.Written {
		full = FullAt(p.ownLevel, p.ownRate, now)
	}
	p.own.write(p.ownLevel, now, full)
	p.own.IdleAt = now + iv
}

// avail is what the cluster side can draw now (rule 9).
func (p *clusterPlan) avail() float64 {
	a := 0.0
	for _, x := range p.sources {
		a = a + x.spare()
	}
	return a
}

// bound is rule 11: every source's part, lenders busy or not, the floor aside.
func (p *clusterPlan) bound() float64 {
	b := 0.0
	for _, x := range p.sources {
		v := x.level
		if x.lender {
			if v = x.level - x.keep; v < 0 {
				v = 0
			}
		}
		b = b + v
	}
	return b
}

// wait is rule 10 for the cluster side, given what it can draw now (avail): the least
// w ≥ 0 at which the sources, each refilling linearly at its rate up to its burst and
// a lender from when it turns idle, give n; 0 when they do now, +Inf when they never
// would. The parts are piecewise linear between breakpoints (where a part may start,
// start to rise, or stop), so the sum is found segment by segment.
func (p *clusterPlan) wait(avail, n float64) float64 {
	if avail >= n {
		return 0
	}
	var points []float64
	for _, x := range p.sources {
		for _, w := range x.breaks() {
			if w > 0 && w < math.Inf(1) {
				points = insertSorted(points, w)
			}
		}
	}
	prev, sum := 0.0, avail
	for _, w := range points {
		if w <= prev {
			continue
		}
		if slope := p.slope((prev + w) / 2); slope > 0 {
			if reach := prev + (n-sum)/slope; reach <= w {
				return reach
			}
		}
		if sum = p.partsAt(w); sum >= n {
			return w
		}
		prev = w
	}
	if slope := p.slope(prev + 1); slope > 0 {
		return prev + (n-sum)/slope
	}
	return math.Inf(1)
}

// partsAt is the sum of what the sources may give w µs from now.
func (p *clusterPlan) partsAt(w float64) float64 {
	total := 0.0
	for _, x := range p.sources {
		total = total + x.partAt(w)
	}
	return total
}

// slope is the sum of the rates of the parts rising at w.
func (p *clusterPlan) slope(w float64) float64 {
	s := 0.0
	for _, x := range p.sources {
		if w < x.from {
			continue
		}
		v := x.linear(w)
		if v < x.r.Burst && (!x.lender || v > x.keep) {
			s = s + x.r.PerMicro
		}
	}
	return s
}

// linear is the source's level w µs from now, refilling at its rate up to its burst:
// the burst itself from the moment it is full (a breakpoint of wait), not a sum that
// rounds a hair short of it.
func (x source) linear(w float64) float64 {
	if w >= (x.r.Burst-x.level)/x.r.PerMicro {
		return x.r.Burst
	}
	v := x.level + float64(w*x.r.PerMicro)
	if v > x.r.Burst {
		v = x.r.Burst
	}
	return v
}

// partAt is what the source may give w µs from now (rule 10).
func (x source) partAt(w float64) float64 {
	if w < x.from {
		return 0
	}
	v := x.linear(w) - x.keep
	if x.lender && v < 0 {
		return 0
	}
	return v
}

// breaks are the times (µs from now) at which the source's part may step or change
// slope: when it may be drawn from, when its level passes its keep, when it is full.
func (x source) breaks() [3]float64 {
	return [3]float64{x.from, (x.keep - x.level) / x.r.PerMicro, (x.r.Burst - x.level) / x.r.PerMicro}
}

// insertSorted inserts w into the ascending list ws.
func insertSorted(ws []float64, w float64) []float64 {
	i := len(ws)
	ws = append(ws, w)
	for i > 0 && ws[i-1] > w {
		ws[i] = ws[i-1]
		i--
	}
	ws[i] = w
	return ws
}

// Outage is one replica's copy of the cluster side while Redis cannot decide (rule 12):
// Replicas is how many replicas share the cluster budget now.
type Outage struct {
	State    *State
	Replicas int
}

// Decide decides the cluster side of c alone at now on the copy, its cost taken
// Replicas times: the Decision's Cluster side is the replica's share (a Replicas-th of
// the copy), and it says nothing of the client.
func (o *Outage) Decide(lim Limits, c space.Charge, now float64) Decision {
	k := float64(max(o.Replicas, 1))
	n := k * float64(c.Cost)
	p := plan(o.State, lim, c, now)
	// More replicas than a copy's tokens: a full copy admits, into debt.
	need := n
	if most := p.most(); need > most {
		need = most
	}
	var d Decision
	if d.Admitted = p.draws(need); d.Admitted {
		d.Drawn = p.take(need, now)
		if debt := n - need; debt > 0 {
			p.owe(debt, now)
		}
		p.mark(now)
	} else {
		p.checkAll(now)
		p.mark(now)
		d.Bucket = space.BucketClusterActivation
	}
	avail := p.avail()
	d.Cluster = Side{Remaining: avail / k, Wait: p.wait(avail, need)}
	d.RetryAfter = d.Cluster.Wait
	if d.Admitted {
		d.RetryAfter = 0
	}
	return d
}

// Most is the largest cost a charge of tier can ever draw on the cluster side under
// lim (rules 5 and 6): every source it may draw on full, less what each keeps. A cost
// above it is refused for ever; the activation flow answers it 422 at once instead.
func Most(lim Limits, tier string) float64 {
	if lim.Reservations == nil {
		// plan's one source, the cluster bucket, of which a charge without a floor
		// keeps nothing: no state to build, as every create asks this.
		return RateOf(lim.Cluster).Burst
	}
	return plan(NewState(), lim, space.Charge{Tier: tier}, 0).most()
}

// most is what the sources could ever give at once: each full, less its keep.
func (p *clusterPlan) most() float64 {
	m := 0.0
	for _, x := range p.sources {
		m = m + (x.r.Burst - x.keep)
	}
	return m
}

// owe takes debt from the shared remainder (the cluster key), below zero.
func (p *clusterPlan) owe(debt, now float64) {
	for i := range p.sources {
		if x := &p.sources[i]; x.kind == kindShared {
			x.level = x.level - debt
			x.b.write(x.level, now, FullAt(x.level, x.r, now))
		}
	}
}
