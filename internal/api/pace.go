package api

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/metric"
)

// maxPacedRefusals bounds the refusals delayed at once on a replica: past it a refusal
// is answered at once. A delayed refusal is a parked goroutine and an open connection;
// an open-loop flood of R creates a second delays about R × the pace of them, so the
// bound is reached only by a flood of about 100,000 a second at the default pace.
const maxPacedRefusals = 1024

// refusalPace delays a create refused from memory (sandbox.Service.refuseFromMemory) before it is
// answered, while a request of another budget key is at work on this replica (a
// create past its own refusal from memory, or any request on a route that takes a
// concurrency place: a restore, a pause, a delete, a read): until no request at all is
// at work here, or for the pace, whichever comes first. At any other moment a refusal
// is answered at once.
//
// A client flooding over its rate costs the replica the CPU of every refusal, and a
// client that sends its next create as soon as it is answered (a closed loop, as most
// do) sends as fast as the replica answers: on a saturated replica, that CPU is what
// another client's create or restore waits behind at each of its round trips to
// Postgres and Redis. Delayed, the flooder's connections send nothing while the
// neighbour's request runs (a closed loop over N connections sends at most N a pace),
// and the replica's CPU goes to that request; answered at once otherwise, a flood
// alone on the replica is refused as fast as it can be. A delayed refusal is answered as
// soon as the replica has nothing else at work, not at the end of a fixed wait: the
// writes of a flood's answers, most of a refusal's CPU (a system call that carries the
// answer through the kernel), then fall in the gaps between the neighbour's requests
// instead of on the next one. The flooder loses nothing it was owed: it was refused
// either way and is told to retry after a second or more. Refusals from Redis and
// every other answer are never delayed.
type refusalPace struct {
	pace time.Duration // 0: never delay
	// after is time.NewTimer's channel and stop, for tests to decide when a delay ends.
	after func(time.Duration) (<-chan time.Time, func() bool)
	// onDelay, when set, is told each delay as it starts (tests).
	onDelay func()

	working atomic.Int64 // requests at work on this replica, every key's
	// byKey is the same by key, in a fixed table of paceSlots counts: a key counts in
	// the slot its hash names, with whichever keys share it. A neighbour that shares
	// the flooder's slot is taken for the flooder's own work, and its refusal is then
	// answered at once, as without a pace: the table can only make a refusal faster,
	// never hold one back for the flooder's own requests. No per-key state: a replica
	// that met 100,000 tenants holds the same 32 KiB as one that met one.
	byKey   [paceSlots]atomic.Int64
	seed    maphash.Seed
	delayed atomic.Int64
	// idle is closed, and replaced, when the last request at work here ends while
	// refusals are delayed: they are answered then, before their pace.
	idle  atomic.Pointer[chan struct{}]
	paced prometheus.Counter
}

func newRefusalPace(pace time.Duration, reg prometheus.Registerer) *refusalPace {
	p := &refusalPace{
		pace: pace,
		seed: maphash.MakeSeed(),
		after: func(d time.Duration) (<-chan time.Time, func() bool) {
			t := time.NewTimer(d)
			return t.C, t.Stop
		},
		paced: metric.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "space_refusals_paced_total",
			Help: "Creates refused from memory whose answer was delayed (for SPACE_REFUSAL_PACE at most) because another budget key's request was at work on the replica.",
		})),
	}
	idle := make(chan struct{})
	p.idle.Store(&idle)
	return p
}

// begin counts a request of key at work (a create past the refusal from memory, a
// request past the identity on a route with a concurrency place) until end is called
// with what it returns.
func (p *refusalPace) begin(key space.ClientKey) *atomic.Int64 {
	c := p.slot(key)
	c.Add(1)
	p.working.Add(1)
	return c
}

// end ends a request begun with begin; the last at work lets the delayed refusals go.
func (p *refusalPace) end(c *atomic.Int64) {
	if p.working.Add(-1) == 0 && p.delayed.Load() > 0 {
		next := make(chan struct{})
		close(*p.idle.Swap(&next))
	}
	c.Add(-1)
}

// neighbours reports whether a request of a key other than key is at work here. The
// two counts are read one after the other, not at one instant: a request that begins
// or ends between them decides only whether this one refusal waits.
func (p *refusalPace) neighbours(key space.ClientKey) bool {
	all := p.working.Load()
	if all <= 0 {
		return false
	}
	return all > p.slot(key).Load()
}

// paceSlots is the size of refusalPace's table of counts by key: with k keys at work
// beside a flooder, its slot is another's with a chance of about k/paceSlots.
const paceSlots = 4096

// slot is key's count of requests at work (shared with the keys of its hash).
func (p *refusalPace) slot(key space.ClientKey) *atomic.Int64 {
	return &p.byKey[maphash.String(p.seed, string(key))%paceSlots]
}

// delay waits before key's refusal from memory is answered, when another key's request
// is at work here and fewer than maxPacedRefusals are delayed: until no request is at
// work here, for the pace at most; it returns early when the caller goes.
func (p *refusalPace) delay(ctx context.Context, key space.ClientKey) {
	if p.pace <= 0 || !p.neighbours(key) {
		return // a flood alone on the replica: one atomic load (neighbours')
	}
	// The order matters: the channel is read before this delay is counted, and the
	// count before the requests at work are; end counts the requests first, then the
	// delays. Whichever way the two interleave, a delay that sees a request at work is
	// seen by the end of the last one, which closes this channel or a later one (this
	// one then already closed): no delay waits its whole pace for an end it missed.
	// Hence neighbours is asked again once the delay is counted.
	idle := *p.idle.Load()
	if p.delayed.Add(1) > maxPacedRefusals || !p.neighbours(key) {
		p.delayed.Add(-1)
		return
	}
	defer p.delayed.Add(-1)
	p.paced.Inc()
	if p.onDelay != nil {
		p.onDelay()
	}
	c, stop := p.after(p.pace)
	select {
	case <-c:
	case <-idle:
		stop()
	case <-ctx.Done():
		stop()
	}
}

// pacedPlaces is the concurrency cap as a create takes it (sandbox.Places): the
// limiter's place, and the create counted at work (refusalPace.begin) from the moment
// it asks for its place, past its refusal from memory, until the place is given back.
type pacedPlaces struct {
	leases Leases
	pace   *refusalPace
}

func (p pacedPlaces) Acquire(ctx context.Context, key space.ClientKey, cap int) (space.Lease, error) {
	at := p.pace.begin(key)
	l, err := p.leases.Acquire(ctx, key, cap)
	if err != nil {
		p.pace.end(at)
		return l, err
	}
	var once sync.Once
	return space.NewLease(func() {
		once.Do(func() {
			l.Release()
			p.pace.end(at)
		})
	}, l.Roomy), nil
}

func (p pacedPlaces) Alongside(key space.ClientKey, cap int) (func(), bool) {
	return p.leases.Alongside(key, cap)
}
