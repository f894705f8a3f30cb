package admission

import (
	"context"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
)

const (
	// DefaultPipelineAbove is SPACE_REDIS_PIPELINE_ABOVE's default (config's table
	// writes the same number, which its tests hold equal to this), which space-api
	// gives ConcurrencyOptions.PipelineAbove and LimiterOptions.PipelineAbove: how
	// many scripts of a component go to Redis each on its own at once before the next
	// wait to go together. Those options' own zero, as the variable's, never
	// coalesces. Below the threshold a script costs what it would without the
	// coalescer; measured on 2 cores (docs/benchmarks.md), pipelining at 8 callers or
	// fewer lost more to waking the waiting callers than it saved in round trips, and
	// at 32 it took about half the CPU a decision costs.
	DefaultPipelineAbove = 8
	// DefaultBatchAbove is SPACE_REDIS_BATCH_ABOVE's default (config's table writes
	// the same number, which its tests hold equal to this), which space-api gives
	// Options.BatchAbove: how many of the Admitter's decisions go to Redis each on its
	// own at once before the next wait and go together as one batch script call.
	// Options' own zero, as the variable's, never batches. Below the threshold
	// nothing waits, so a replica under light load costs what it did without batches.
	// Why 8, the pipelines' number, and not 2 as before: measured on 2 cores, the
	// machine otherwise idle (docs/benchmarks.md, "Batches above eight"), 2 held 8
	// callers to two round trips at once, each waiting for the next leader to wake:
	// a fifth fewer decisions a second at 8 goroutines, and no more at 32. It did
	// cost Redis less there (3.5 µs a decision in batches of 9, against 4.5 µs in
	// batches of 3), but when Redis is what is short its round trips slow, more
	// callers wait for each, and the batches deepen by themselves.
	DefaultBatchAbove = 8
	// maxBatch bounds one round trip, so that a burst of calls is never written as one
	// unbounded message: a batch's last call waits for every decision before it.
	maxBatch = 128
)

// coalescer runs the scripts of one admission component (the Admitter, the
// ConcurrencyLimiter, a Limiter) and joins the ones callers start while many are
// already on their way into one round trip: the token-bucket decisions among them as
// one call of the batch script (batch.lua), any other script beside it in one
// pipeline.
//
// Why: on the request path each decision is one EVALSHA, and a round trip costs far
// more than the script: every message is a write and a read system call and a wake-up
// on both sides, on a small VM most of a decision's CPU, the Redis thread's included,
// and the Redis thread is what every replica shares. A pipeline of n scripts pays
// those once; a batch of n decisions in one script call also pays once what Redis
// spends on each call (its dispatch, its arguments, its reply, TIME, reading and
// writing the keys), which is most of what a decision costs it (docs/benchmarks.md).
// Nothing about a decision changes: a script runs to its end before Redis runs
// anything else, so each decision is as atomic inside a batch as on its own; they run
// in the order the callers queued, each reading what the one before wrote; and each
// caller gets its own reply or error.
//
// How: while fewer than inFlight scripts are out, a call goes out at once on its own,
// as it would without the coalescer, so a replica under light load waits for nothing.
// Calls made while inFlight are out wait in a queue; when a round trip comes back, the
// call that has waited longest is woken to lead the next one: it sends everything
// queued (up to maxBatch), itself included, as one round trip, and hands the round
// trip on in turn. No goroutine of its own, no timer and no linger: a batch is
// whatever arrived during the last round trip, so its depth follows the load.
//
// Every caller keeps its own deadline: one waiting for a batch returns at its context's
// end whatever the batch does, as a call whose reply never came (which fail-open and
// fail-closed admission already handle). A call given up before its batch is written is
// left out of it, so it is never sent. A batch is written under its leader's context,
// the longest waiting, whose deadline (the runner's, counted from the start of a call)
// comes first.
type coalescer struct {
	rdb      redis.UniversalClient
	inFlight int

	mu      sync.Mutex
	running int
	queue   []*queuedScript

	// queuedHook, when set (by tests), is called each time a call joins the queue.
	queuedHook func()
}

// queuedScript is one caller's script waiting for a batch, and then its result.
type queuedScript struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
	// lead is set, under the coalescer's lock, when the call is taken from the queue
	// to lead the next round trip rather than to ride in one.
	lead bool
	// done receives once: the call's result is in cmd, or it leads.
	done chan struct{}
}

// newCoalescer returns a coalescer allowing inFlight round trips at once; inFlight 0
// sends every call on its own.
func newCoalescer(rdb redis.UniversalClient, inFlight int) *coalescer {
	return &coalescer{rdb: rdb, inFlight: inFlight}
}

// run runs script on keys and args, as script.Run would: EVALSHA, and EVAL when the
// server does not hold the script. It returns by ctx's end.
func (p *coalescer) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	if p.inFlight <= 0 {
		return script.Run(ctx, p.rdb, keys, args...)
	}
	p.mu.Lock()
	if p.running < p.inFlight {
		p.running++
		p.mu.Unlock()
		cmd := script.Run(ctx, p.rdb, keys, args...)
		p.mu.Lock()
		p.handOn()
		return cmd
	}
	q := &queuedScript{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{}, 1)}
	p.queue = append(p.queue, q)
	p.mu.Unlock()
	if p.queuedHook != nil {
		p.queuedHook()
	}
	select {
	case <-q.done:
		if q.lead {
			p.lead(q)
		}
		return q.cmd
	case <-ctx.Done():
	}
	p.mu.Lock()
	if i := slices.Index(p.queue, q); i >= 0 {
		p.queue = slices.Delete(p.queue, i, i+1)
		p.mu.Unlock()
	} else if q.lead {
		// Chosen to lead as it gave up: the round trip is led from another goroutine,
		// so that this caller still returns now.
		p.mu.Unlock()
		go func() {
			<-q.done
			p.lead(nil)
		}()
	} else {
		// Riding in a batch on its way: its reply, when it comes, is dropped.
		p.mu.Unlock()
	}
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(ctx.Err())
	return cmd
}

// lead sends q (nil: none) and the queued calls as one round trip, hands the round
// trip on, and then wakes the others with their answers. The next leader is woken
// first so that the next round trip does not wait behind the riders of this one
// (BenchmarkAdmission at 32 goroutines: a median of 119,437 decisions/s against
// 112,651 with the riders woken first, ten alternating runs, eight of them faster;
// docs/benchmarks.md).
func (p *coalescer) lead(q *queuedScript) {
	p.mu.Lock()
	n := min(len(p.queue), maxBatch)
	batch := make([]*queuedScript, 0, n+1)
	if q != nil {
		batch = append(batch, q)
	}
	batch = append(batch, p.queue[:n]...)
	p.queue = slices.Delete(p.queue, 0, n)
	p.mu.Unlock()
	p.send(batch)
	p.mu.Lock()
	p.handOn()
	for _, r := range batch {
		if r.done != nil && !r.lead {
			r.done <- struct{}{}
		}
	}
}

// handOn hands a round trip that came back to the call that has waited longest,
// woken to lead the next one, or gives it up when none waits. It is called with p.mu
// held, and releases it.
func (p *coalescer) handOn() {
	if len(p.queue) == 0 {
		p.running--
		p.mu.Unlock()
		return
	}
	next := p.queue[0]
	p.queue = slices.Delete(p.queue, 0, 1)
	next.lead = true
	p.mu.Unlock()
	next.done <- struct{}{}
}

// send sends batch's live calls as one round trip, under the context of the first
// live call, and puts every call's answer in its cmd (lead wakes the callers): the
// decisions sharing a hash tag as one batch script, any other call on its own, all of
// it one pipeline when it is more than one call (planCalls).
func (p *coalescer) send(batch []*queuedScript) {
	var ctx context.Context
	live := batch[:0:0]
	for _, q := range batch {
		if err := q.ctx.Err(); err != nil {
			q.cmd = redis.NewCmd(q.ctx)
			q.cmd.SetErr(err)
			continue
		}
		if ctx == nil {
			ctx = q.ctx
		}
		live = append(live, q)
	}
	if len(live) > 0 {
		calls := planCalls(live)
		sendCalls(ctx, p.rdb, calls)
		for _, c := range calls {
			c.answer()
		}
	}
}
