package admission

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// gate is a go-redis hook that can hold the first script sent on its own, and the
// first batch of decisions or pipeline of scripts, until they are let go; it records
// every pipeline's size and every batch's, and counts the scripts sent on their own.
//
// It counts calls, not attempts: a call answered NOSCRIPT (the script cache of a node
// is empty: a fresh server, or another test's SCRIPT FLUSH on the shared Redis) is
// sent again as EVAL, alone or in a pipeline of its own, and that second attempt is
// the same call. Singles count EVALSHA of one decision only; batches, pipelines and
// the EVAL of batches are recorded apart.
type gate struct {
	mu          sync.Mutex
	hold        bool
	held        chan struct{} // closed once the first script is held
	open        chan struct{}
	holdPipe    bool
	pipeHeld    chan struct{} // closed once the first pipeline or batch is held
	pipeOpen    chan struct{}
	pipelines   []int // of EVALSHA: the calls of each
	retries     []int // of EVAL after NOSCRIPT, in a pipeline: the calls of each
	batches     []int // EVALSHA of the batch script: the decisions of each
	evalBatches []int // EVAL of the batch script, after NOSCRIPT: the decisions of each
	singles     atomic.Int64
}

// newGate returns a gate holding the first script (hold) or holding nothing.
func newGate(hold bool) *gate {
	return &gate{hold: hold, held: make(chan struct{}), open: make(chan struct{}), pipeHeld: make(chan struct{}), pipeOpen: make(chan struct{})}
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

// batchDecisions is the number of decisions cmd carries when it is a call of the batch
// script (EVALSHA or EVAL), 0 otherwise: it reads batch.lua's header.
func batchDecisions(cmd redis.Cmder) int {
	args := cmd.Args()
	if len(args) < 3 {
		return 0
	}
	switch cmd.Name() {
	case "evalsha":
		if args[1] != batchScript.Hash() {
			return 0
		}
	case "eval":
		if args[1] != batchSource {
			return 0
		}
	default:
		return 0
	}
	var keys int
	switch n := args[2].(type) {
	case int:
		keys = n
	case int64:
		keys = int(n)
	default:
		return 0
	}
	head := args[3+keys].(string)
	// The key lists, then the argument lists, then five bytes a decision.
	h := 0
	for range 2 {
		lists := int(head[h]) + int(head[h+1])<<8
		h += 2
		for range lists {
			h += 1 + 2*int(head[h])
		}
	}
	return (len(head) - h) / 5
}

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch n := batchDecisions(cmd); {
		case n > 0 && cmd.Name() == "eval":
			g.mu.Lock()
			g.evalBatches = append(g.evalBatches, n)
			g.mu.Unlock()
		case n > 0:
			g.mu.Lock()
			g.batches = append(g.batches, n)
			hold := g.holdPipe
			g.holdPipe = false
			g.mu.Unlock()
			if hold {
				close(g.pipeHeld)
				<-g.pipeOpen
			}
		case cmd.Name() == "evalsha":
			g.singles.Add(1)
			g.mu.Lock()
			hold := g.hold
			g.hold = false
			g.mu.Unlock()
			if hold {
				close(g.held)
				<-g.open
			}
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook records pipelines of scripts and the batches in them: go-redis's
// own (the handshake of a new connection) are not the coalescer's.
func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		switch cmds[0].Name() {
		case "eval":
			g.mu.Lock()
			g.retries = append(g.retries, len(cmds))
			for _, c := range cmds {
				if n := batchDecisions(c); n > 0 {
					g.evalBatches = append(g.evalBatches, n)
				}
			}
			g.mu.Unlock()
		case "evalsha":
			g.mu.Lock()
			g.pipelines = append(g.pipelines, len(cmds))
			for _, c := range cmds {
				if n := batchDecisions(c); n > 0 {
					g.batches = append(g.batches, n)
				}
			}
			hold := g.holdPipe
			g.holdPipe = false
			g.mu.Unlock()
			if hold {
				close(g.pipeHeld)
				<-g.pipeOpen
			}
		}
		return next(ctx, cmds)
	}
}

// sizes are the pipelines of EVALSHA sent, in order; retried those of EVAL; batched
// the decisions of each batch, in order; evalBatched those of each batch sent again
// as EVAL.
func (g *gate) sizes() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.pipelines...)
}

func (g *gate) retried() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.retries...)
}

func (g *gate) batched() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.batches...)
}

func (g *gate) evalBatched() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.evalBatches...)
}

// holdNext holds the next pipeline or batch until pipeOpen is closed.
func (g *gate) holdNext() {
	g.mu.Lock()
	g.holdPipe = true
	g.mu.Unlock()
}

// coalescerBundle is an Admitter whose Redis client goes through a gate, and a count
// of the calls its coalescer queued.
type coalescerBundle struct {
	*bundle
	gate   *gate
	queued chan struct{}
}

// coalescerSetup builds an Admitter batching above batchAbove, on a client of the
// standalone Redis or of the cluster built as space-api builds its own (its calls run
// directly under their deadlines), with a cluster bucket that never runs dry.
func coalescerSetup(t *testing.T, cluster bool, batchAbove int, hold bool) *coalescerBundle {
	t.Helper()
	opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: 1 << 40})
	opts.BatchAbove = batchAbove
	return coalescerSetupWith(t, cluster, opts, hold)
}

// coalescerSetupWith is coalescerSetup with the Admitter's options of the test's choice.
func coalescerSetupWith(t *testing.T, cluster bool, opts Options, hold bool) *coalescerBundle {
	t.Helper()
	return coalescerSetupOnWith(t, dialDirect(t, cluster), opts, hold)
}

// dialDirect is a client of the standalone Redis or of the cluster built as space-api
// builds its own: its calls run directly under their deadlines.
func dialDirect(t *testing.T, cluster bool) redis.UniversalClient {
	t.Helper()
	if cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisClusterAddrs(t), ContextTimeoutEnabled: true})
	}
	return redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t), ContextTimeoutEnabled: true})
}

// coalescerSetupOn is coalescerSetup on a client of the test's choice, which it closes.
func coalescerSetupOn(t *testing.T, rdb redis.UniversalClient, batchAbove int, hold bool) *coalescerBundle {
	t.Helper()
	opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: 1 << 40})
	opts.BatchAbove = batchAbove
	return coalescerSetupOnWith(t, rdb, opts, hold)
}

func coalescerSetupOnWith(t *testing.T, rdb redis.UniversalClient, opts Options, hold bool) *coalescerBundle {
	t.Helper()
	t.Cleanup(func() { rdb.Close() })
	g := newGate(hold)
	rdb.AddHook(g)
	b := &coalescerBundle{bundle: setup(t, rdb, opts), gate: g, queued: make(chan struct{}, 1024)}
	b.adm.run.scripts.queuedHook = func() {
		select {
		case b.queued <- struct{}{}:
		default: // nobody awaits this many
		}
	}
	return b
}

// await waits for n calls to join the queue.
func (b *coalescerBundle) await(n int) {
	b.t.Helper()
	for range n {
		select {
		case <-b.queued:
		case <-b.ctx.Done():
			b.t.Fatal("calls never queued")
		}
	}
}

// idle reports whether the coalescer has nothing in flight and nothing queued.
func (b *coalescerBundle) idle() bool {
	p := b.adm.run.scripts
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running == 0 && len(p.queue) == 0
}

// settled checks what the coalescer sent, once every call has returned: batches of
// the sizes want and no pipeline (an Admitter's decisions share one hash tag, so a
// round trip of them is one batch), acme's client bucket holding tokens, and nothing
// in flight or queued.
func (b *coalescerBundle) settled(want []int, tokens float64, why string) {
	b.t.Helper()
	if got := b.gate.batched(); !slices.Equal(got, want) {
		b.t.Fatalf("batches of %v, want %v: %s", got, want, why)
	}
	if got := b.gate.sizes(); len(got) != 0 {
		b.t.Fatalf("pipelines of %v, want none: %s", got, why)
	}
	if s := b.stored(b.clientKey("acme")); !near(s.tokens, tokens, 1e-6) {
		b.t.Fatalf("the client bucket holds %v, want %v: %s", s.tokens, tokens, why)
	}
	if !b.idle() {
		b.t.Fatal("the coalescer is not idle after every call returned")
	}
}

// bothTopologies runs test on the standalone Redis and on the cluster, in parallel.
func bothTopologies(t *testing.T, test func(t *testing.T, cluster bool)) {
	t.Helper()
	for _, cluster := range []bool{false, true} {
		name := "standalone"
		if cluster {
			name = "cluster"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, cluster)
		})
	}
}

func TestCoalescer(t *testing.T) {
	t.Parallel()

	t.Run("calls made while the round trips in flight are out go together as one batch in the next", func(t *testing.T) {
		t.Parallel()
		bothTopologies(t, func(t *testing.T, cluster bool) {
			b := coalescerSetup(t, cluster, 1, true)
			r := rate(neverRefills, 100)
			var wg sync.WaitGroup
			decisions := make(chan Decision, 21)
			wg.Go(func() { decisions <- b.admit("acme", r) })
			<-b.gate.held
			for range 20 {
				wg.Go(func() { decisions <- b.admit("acme", r) })
			}
			b.await(20)
			close(b.gate.open)
			wg.Wait()
			close(decisions)
			admitted := 0
			for d := range decisions {
				if d.Admitted {
					admitted++
				}
			}
			if admitted != 21 {
				t.Fatalf("admitted %d of 21", admitted)
			}
			if singles := b.gate.singles.Load(); singles != 1 {
				t.Fatalf("%d scripts went on their own, want the first alone", singles)
			}
			b.settled([]int{20}, 79, "the 20 that waited go as one batch, each taking its token")
		})
	})

	t.Run("a burst of concurrent decisions through batches admits exactly the burst", func(t *testing.T) {
		t.Parallel()
		bothTopologies(t, func(t *testing.T, cluster bool) {
			b := coalescerSetup(t, cluster, 2, false)
			r := rate(neverRefills, 300)
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for range 64 {
				wg.Go(func() {
					for range 10 {
						if d := b.admit("acme", r); d.Admitted {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if got := admitted.Load(); got != 300 {
				t.Fatalf("admitted %d of 640 against a burst of 300", got)
			}
			deep := 0
			for _, n := range b.gate.batched() {
				if n > 1 {
					deep++
				}
			}
			if deep == 0 {
				t.Fatal("64 callers above 2 in flight sent no batch of more than one decision")
			}
			if got := b.gate.sizes(); len(got) != 0 {
				t.Fatalf("pipelines of %v: one Admitter's decisions go as one batch a round trip", got)
			}
			if !b.idle() {
				t.Fatal("the coalescer is not idle after every call returned")
			}
		})
	})

	t.Run("a caller waiting for a batch returns at its own deadline and is never sent", func(t *testing.T) {
		t.Parallel()
		b := coalescerSetup(t, false, 1, true)
		r := rate(neverRefills, 100)
		first := make(chan Decision, 1)
		go func() { first <- b.admit("acme", r) }()
		<-b.gate.held
		ctx, cancel := context.WithTimeout(b.ctx, 20*time.Millisecond)
		defer cancel()
		_, err := b.adm.admit(ctx, "acme", r)
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Admit past its deadline = %v, want ErrUnavailable for the deadline (fail closed)", err)
		}
		close(b.gate.open)
		if d := <-first; !d.Admitted {
			t.Fatalf("the first decision = %+v", d)
		}
		b.settled(nil, 99, "the only waiting call gave up, and took nothing")
		if n := b.gate.singles.Load(); n != 1 {
			t.Fatalf("%d scripts on their own, want the first alone: the one that gave up was never sent", n)
		}
	})

	t.Run("scripts a server lost are sent again with their source", func(t *testing.T) {
		t.Parallel()
		// A private server: the shared one's scripts are every parallel test's.
		srv := testenv.StartRedis(t)
		b := coalescerSetupOn(t, redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true}), 1, true)
		r := rate(neverRefills, 100)
		var wg sync.WaitGroup
		var admitted atomic.Int64
		admit := func() {
			if d := b.admit("acme", r); d.Admitted {
				admitted.Add(1)
			}
		}
		wg.Go(admit)
		<-b.gate.held
		for range 5 {
			wg.Go(admit)
		}
		b.await(5)
		b.gate.holdNext()
		close(b.gate.open)
		// The five wait as one batch while the server loses its scripts.
		<-b.gate.pipeHeld
		if err := b.rdb.ScriptFlush(b.ctx).Err(); err != nil {
			t.Fatal(err)
		}
		close(b.gate.pipeOpen)
		wg.Wait()
		if admitted.Load() != 6 {
			t.Fatalf("admitted %d of 6 after SCRIPT FLUSH", admitted.Load())
		}
		b.settled([]int{5}, 94, "the five went as one batch")
		if got := b.gate.evalBatched(); !slices.Equal(got, []int{5}) {
			t.Fatalf("batches sent as EVAL %v, want [5]: the batch was refused NOSCRIPT and went again as EVAL", got)
		}
	})

	t.Run("callers giving up at any moment never stall the others", func(t *testing.T) {
		t.Parallel()
		b := coalescerSetup(t, false, 1, false)
		b.adm.failClosed = false // a call given up fails open, as space-api's default does
		r := rate(1e6, 1e6)
		var wg sync.WaitGroup
		for range 48 {
			wg.Go(func() {
				for range 40 {
					ctx, cancel := context.WithTimeout(b.ctx, time.Duration(rand.IntN(3000))*time.Microsecond)
					_, _ = b.adm.admit(ctx, "acme", r)
					cancel()
				}
			})
		}
		wg.Wait()
		// A caller chosen to lead as it gave up hands the lead to a goroutine, which
		// may still be finishing.
		testenv.Eventually(t, 5*time.Second, "the coalescer idle", b.idle)
		if d := b.admit("acme", r); !d.Admitted {
			t.Fatalf("a decision after the storm = %+v", d)
		}
	})

	t.Run("a BatchAbove of 0, a zero Options', sends every decision on its own", func(t *testing.T) {
		t.Parallel()
		b := coalescerSetup(t, false, 0, false)
		r := rate(neverRefills, 100)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() { b.admit("acme", r) })
		}
		wg.Wait()
		if got, batches := b.gate.sizes(), b.gate.batched(); len(got) != 0 || len(batches) != 0 || b.gate.singles.Load() != 16 {
			t.Fatalf("pipelines %v, batches %v and %d on their own, want none, none and 16", got, batches, b.gate.singles.Load())
		}
	})
}
