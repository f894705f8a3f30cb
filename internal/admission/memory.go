package admission

import (
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission/model"
	"github.com/space-sandbox/space/internal/keyed"
)

// memory holds, per bucket, its state as this replica last learnt it from Redis, so
// that CachedRefusal can refuse without asking. Keys are the cluster key, the tier
// reserves' and the budget keys', at most Options.MaxKeys of them: a bucket forgotten
// for room is one this replica asks Redis about again, so forgetting never admits (a
// refusal it would have made from memory, Redis makes). maxAge is
// Options.RefusalMaxAge; now the replica's clock.
type memory struct {
	known  *keyed.Map[atomic.Pointer[knownBucket]]
	now    func() time.Time
	maxAge time.Duration
}

// knownBucket is one bucket as a decision found it: at most Tokens at time At (the
// replica's clock before the decision was sent, so no later than Redis's), under Rate.
// Tokens only come back at Rate, and other replicas only take them, so Tokens plus the
// refill since At bounds the bucket from above for as long as the rate holds.
type knownBucket struct {
	Rate   space.Rate
	Tokens float64
	At     time.Time
	// claimed is the tokens held by the charges CachedRefusal let through to Redis
	// since this state was learnt and not yet released (see CachedRefusal); the next
	// state learnt starts again from none.
	claimed atomic.Int64
	// asked is when CachedRefusal last let a charge through to relearn this state once
	// it was older than RefusalMaxAge (Unix nanoseconds; 0 never).
	asked atomic.Int64
}

// CachedRefusal returns the refusal that a Charge of c now would meet, when this
// replica knows it without asking Redis: a bucket that its last decision found too
// empty to hold c's cost by now, even with every token refilled since and none
// taken. It answers from memory, in nanoseconds, so a client flooding over its rate
// costs no Redis call (envoyproxy/ratelimit's local cache of keys over the limit, with
// the time a key stays over it counted from the bucket's own refill).
//
// It only ever refuses; no refusal means "ask Redis" (Charge does). A bucket is known
// under the rate it was decided with: a flag that changes the client's rate, exempts
// it or moves it on or off the allowlist makes the entry not apply, so the next create
// is Redis's. The known tokens are an upper bound as long as other replicas only take
// tokens, so a refusal here is never wrong beyond the instant of the refill itself,
// and its Retry-After is counted from that refill. What gives tokens back (a key reset
// by hand) is seen once the entry is older than Options.RefusalMaxAge, when the next
// charge asks Redis and learns the bucket afresh. Nothing is refused in shadow mode or
// with admission disabled. A refusal is counted as Charge counts one.
//
// With tiers reserving shares of the cluster bucket, the cluster side is known per
// tier: an upper bound of everything the tier's charge could draw on (its reserve, the
// shared remainder, what other reserves could ever lend), so that a shared remainder
// known empty never refuses a tier whose reserve holds tokens.
//
// A charge it lets through holds its cost against that upper bound (the Hold) until
// the flow releases it, once the charge is decided or the create ends without one;
// a charge the holds leave short is refused here too, until a decision teaches the
// replica the bucket afresh. Without it, a flood that finds its bucket holding N
// tokens would send every create in flight down the whole create path (a lease,
// Postgres, the script) until the first refusal came back: thousands a second for N
// tokens, and the slower the replica gets the more of them go, until it is
// overloaded by refusals and its Redis calls time out.
//
// A bucket this replica knows nothing of yet (its first charge, or a new rate) lets
// every charge through until the first decision comes back. Making the others wait
// for that one was built and measured: a cold replica under an open-loop flood of
// 2,500/s then answered late, the load generator opened connections for the answers
// it waited for, and the replica's Redis calls timed out (1,400 to 1,800 decisions
// failed open in the flood's first second, against none without the wait).
func (a *Admitter) CachedRefusal(c space.Charge) (space.Hold, *space.LimitError) {
	if !a.enabled || a.shadow || a.maxAge <= 0 {
		return nil, nil
	}
	key, rate, cost := c.Key, c.Rate, c.Cost
	now := a.now()
	var le *space.LimitError
	var client, cluster known
	if rate != nil && key != "" {
		var buf [192]byte
		client = a.knownState(joined(&buf, a.clientPrefix, string(key)), *rate, cost, now)
		le = client.refusal(space.BucketClientActivation, key)
	}
	clusterKey, clusterRate := a.knownCluster(c.Tier)
	cluster = a.knownState(clusterKey, clusterRate, cost+int(c.Floor), now)
	if refused := cluster.refusal(space.BucketClusterActivation, key); refused != nil {
		if le == nil {
			le = refused
		} else {
			// Both short: the client bucket is named, the retry waits for both.
			le.RetryAfter = max(le.RetryAfter, refused.RetryAfter)
		}
	}
	if le == nil {
		// Neither is short by what refilled: the charge holds its tokens in each
		// bucket, which refuses it if earlier holds took them.
		var fromClient, fromCluster *knownBucket
		if fromClient, le = client.claim(cost, space.BucketClientActivation, key); le == nil {
			if fromCluster, le = cluster.claim(cost, space.BucketClusterActivation, key); le == nil {
				return holding(cost, fromClient, fromCluster), nil
			}
			if fromClient != nil {
				fromClient.claimed.Add(-int64(cost))
			}
		}
	}
	a.metrics.count(decisionRejected, le.Bucket, c.Tier)
	a.metrics.refusedLocally(le.Bucket)
	return nil, le
}

// knownCluster is the entry under which a replica knows the cluster side of a charge
// of tier: the cluster bucket, or with tiers reserving shares of it, the tier's upper
// bound of all it could draw on.
func (a *Admitter) knownCluster(tier string) (string, space.Rate) {
	if a.reservations != nil {
		if res := a.reservations(); res != nil {
			t := a.plan(res).of(tier)
			return t.knownKey, t.drawable
		}
	}
	return a.clusterKey, a.cluster
}

// hold is a let-through charge's Hold: its cost claimed from the client's and the
// cluster's known states (either nil when not known).
type hold struct {
	cost            int64
	client, cluster *knownBucket
	released        atomic.Bool
}

// holding is the Hold of a charge of cost claimed from client and cluster: nil (no
// allocation) when neither was known, so nothing is held.
func holding(cost int, client, cluster *knownBucket) space.Hold {
	if client == nil && cluster == nil {
		return nil
	}
	return &hold{cost: int64(cost), client: client, cluster: cluster}
}

// Release implements space.Hold: the claims are given back, to states a decision may
// since have replaced, which is harmless.
func (h *hold) Release() {
	if h.released.Swap(true) {
		return
	}
	for _, k := range [2]*knownBucket{h.client, h.cluster} {
		if k != nil {
			k.claimed.Add(-h.cost)
		}
	}
}

// known is what a replica knows of one bucket for one charge: nothing (k nil), or its
// state and the most it can hold now.
//
// A state older than RefusalMaxAge is relearnt by the next charge, which is let
// through to Redis whatever the state says; the charges that come while that one is
// on its way are judged by the old state meanwhile (it is still an upper bound, unless
// someone gave tokens back by hand, which the charge let through learns): otherwise a
// client that floods again after a pause would send its whole flood to Redis and
// Postgres at once. Another charge is let through if no decision came within another
// RefusalMaxAge.
type known struct {
	k      *knownBucket
	tokens float64 // the most the bucket holds now: the known tokens and all refill since
	need   float64 // what the charge needs left in it: its cost, and a warm-up's floor
}

// joined is a and b as one string in buf (or on the heap, when they do not fit), for a
// lookup that keeps no reference to it: the client bucket's key is looked up at every
// refusal from memory, and a + b was an allocation of its own there (Go builds a
// concatenation that stays on the stack only up to 32 bytes, and the default prefix
// alone, "{space:cluster_admission:sandbox_activation}:client:", is 53; 192 bytes hold
// it and a client key of space.MaxClientIDLen, 128). The string shares buf's bytes, which
// nothing writes again; should a lookup ever keep it, escape analysis moves buf to the
// heap rather than let the string outlive it.
func joined(buf *[192]byte, a, b string) string {
	s := append(append(buf[:0], a...), b...)
	return unsafe.String(unsafe.SliceData(s), len(s))
}

// knownState is what this replica knows of bucket key for a charge needing need
// tokens at now: nothing when it has no state of the bucket under rate, or for the
// charge that relearns one too old.
func (m *memory) knownState(key string, rate space.Rate, need int, now time.Time) known {
	cell := m.known.LoadAt(key, now.Unix()) // the map's clock is now().Unix() (newKnownBuckets)
	if cell == nil {
		return known{}
	}
	k := cell.Load()
	if k == nil || k.Rate != rate {
		return known{}
	}
	age := now.Sub(k.At)
	if age > m.maxAge {
		asked, at := k.asked.Load(), now.UnixNano()
		if at-asked > int64(m.maxAge) && k.asked.CompareAndSwap(asked, at) {
			return known{}
		}
	}
	// A bucket may reach its burst up to model.MemorySlack early after a rate change
	// (model rule 3): what it may hold is read that much later.
	return known{k: k, tokens: k.upTo(now.Add(memorySlack)), need: float64(need)}
}

// refusal is the bucket's refusal if it cannot hold what the charge needs yet.
func (b known) refusal(bucket space.Bucket, client space.ClientKey) *space.LimitError {
	if b.k == nil || b.tokens >= b.need {
		return nil
	}
	return b.limitError(bucket, client, b.tokens)
}

// claim takes cost from what a known bucket can serve now, for a charge let through
// to Redis, and returns the state it claimed from, or the refusal of a charge that
// earlier claims leave short. A bucket not known claims nothing.
func (b known) claim(cost int, bucket space.Bucket, client space.ClientKey) (*knownBucket, *space.LimitError) {
	if b.k == nil {
		return nil, nil
	}
	claimed := b.k.claimed.Add(int64(cost))
	if left := b.tokens - float64(claimed-int64(cost)); left < b.need {
		b.k.claimed.Add(-int64(cost))
		return nil, b.limitError(bucket, client, left)
	}
	return b.k, nil
}

// limitError is the refusal of a charge that finds left of what it needs. The error
// and the rate it names are one allocation, not two: one is made per refusal.
func (b known) limitError(bucket space.Bucket, client space.ClientKey, left float64) *space.LimitError {
	e := &struct {
		le    space.LimitError
		limit space.Rate
	}{limit: b.k.Rate}
	left = max(left, 0)
	e.le = space.LimitError{Bucket: bucket, Client: client, RetryAfter: micros((b.need - left) / e.limit.RefillRPS * 1e6), Limit: &e.limit, Remaining: left, FromMemory: true}
	return &e.le
}

// idleBuckets is how long memory keeps a bucket no charge asked about (keyed's
// IdleFor) once it is full again by its refill: it then knows nothing a charge would
// not learn (CachedRefusal refuses no charge of a full bucket; spendLocally takes a
// bucket it never learnt for full). A bucket not yet full again, or holding a
// let-through charge's claim, stays until the bound needs the room: forgetting it
// would give a client tokens back while Redis cannot be asked. So a replica holds the
// buckets of the tenants active in the last 10 seconds and of those still refilling,
// not of every tenant it ever met.
const idleBuckets = 10 * time.Second

// newKnownBuckets is memory's map of buckets: at most max (keyed.DefaultMax when 0),
// those full again forgotten after idleBuckets.
func newKnownBuckets(max int, now func() time.Time) *keyed.Map[atomic.Pointer[knownBucket]] {
	return keyed.New(keyed.Options[atomic.Pointer[knownBucket]]{
		Max:     max,
		IdleFor: idleBuckets,
		Worth: func(cell *atomic.Pointer[knownBucket]) bool {
			k := cell.Load()
			return k != nil && (k.claimed.Load() > 0 || k.upTo(now()) < float64(k.Rate.Burst))
		},
		Now: func() int64 { return now().Unix() },
	})
}

// remember records what a decision found of the bucket under key, for CachedRefusal.
func (m *memory) remember(key string, st BucketState, at time.Time) {
	m.cell(key).Store(&knownBucket{Rate: st.Rate, Tokens: st.Remaining, At: at})
}

// cell is where this replica keeps what it knows of the bucket under key.
func (m *memory) cell(key string) *atomic.Pointer[knownBucket] {
	return m.known.LoadOrNew(key, nil)
}

// upTo is the most the bucket can hold at now: the known tokens and every refill
// since, up to its burst.
func (k *knownBucket) upTo(now time.Time) float64 {
	tokens := k.Tokens
	if age := now.Sub(k.At); age > 0 {
		tokens += age.Seconds() * k.Rate.RefillRPS
	}
	return math.Min(tokens, float64(k.Rate.Burst))
}

// memorySlack is model.MemorySlack as a Duration.
const memorySlack = time.Duration(model.MemorySlack) * time.Microsecond
