package admission

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission/model"
	"github.com/space-sandbox/space/internal/testenv"
)

// inOneRoundTrip makes the calls go to Redis together, in the order given: a round
// trip of p (which lets one at a time: BatchAbove 1) is held out while each call
// joins the queue (queued receives once a call has), then comes back, and the first
// call leads the rest. It returns once every call has returned.
func inOneRoundTrip(t *testing.T, p *coalescer, queued <-chan struct{}, calls ...func()) {
	t.Helper()
	if p.inFlight != 1 {
		t.Fatalf("inOneRoundTrip needs a threshold of 1, got %d", p.inFlight)
	}
	p.mu.Lock()
	p.running++
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, call := range calls {
		wg.Go(call)
		select {
		case <-queued:
		case <-time.After(10 * time.Second):
			t.Fatal("a call never joined the queue")
		}
	}
	p.mu.Lock()
	p.handOn()
	wg.Wait()
}

// queueHook makes p report each call that joins its queue on the channel returned
// (up to 1024 not yet received).
func queueHook(p *coalescer) chan struct{} {
	queued := make(chan struct{}, 1024)
	p.queuedHook = func() {
		select {
		case queued <- struct{}{}:
		default:
		}
	}
	return queued
}

// The batch differential test: the reference test's configurations and sequences of
// asks (reference_test.go), the asks between two pauses sent as batches of 1 to 12
// decisions, each batch one script call, and every decision compared with the model's
// in the order of its batch, at the Redis time the batch read; after each batch,
// every key's expiry is checked against the one its value records (expiriesAgree).
func TestBatchesAgainstTheModel(t *testing.T) {
	t.Parallel()
	sizes := map[string]struct{ configs, steps int }{"standalone": {300, 70}, "cluster": {120, 60}}
	only := onlySeed(t)
	base := rand.Uint64()
	topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
		size := sizes[t.Name()[strings.LastIndex(t.Name(), "/")+1:]]
		seeds := seedsFor(only, nil, base, size.configs)
		var failed atomic.Bool
		var seen coverage
		var batched, batches atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for seed := range seeds {
					if failed.Load() {
						continue
					}
					sc := newScenario(seed, size.steps)
					if f := sc.playBatched(t, rdb, &seen, &batched, &batches); f != nil {
						if !failed.Swap(true) {
							t.Errorf("seed %d (SPACE_REFERENCE_SEED=%d runs it alone): step %d: %s", seed, seed, f.step, f.what)
						}
					}
				}
			})
		}
		wg.Wait()
		t.Logf("%d decisions in %d batches of two or more compared with the model: %s", batched.Load(), batches.Load(), &seen)
		for what, n := range seen.counts() {
			if n == 0 && only == nil && what != "refused from memory" {
				t.Errorf("no decision in a batch was %s", what)
			}
		}
	})
}

// playBatched plays the scenario's steps as play does, but sends the asks that come
// without a pause between them (and without asking the memory first) as batches, and
// compares each decision of a batch with the model in the batch's order. seen counts
// what the decisions of batches of two or more did; batched and batches count them.
func (sc *scenario) playBatched(t *testing.T, rdb redis.UniversalClient, seen *coverage, batched, batches *atomic.Int64) *mismatch {
	ctx := testenv.Context(t)
	var table atomic.Pointer[space.Reservations]
	adm, err := New(Options{
		Redis: rdb, Prefix: testenv.Prefix(t), Enabled: true, FailClosed: true, Cluster: sc.cluster,
		Timeout: testTimeout, BatchAbove: 1,
		Reservations: func() *space.Reservations { return table.Load() },
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	p := adm.run.scripts
	queued := queueHook(p)
	keys := []string{adm.clusterKey}
	for _, c := range sc.clients {
		keys = append(keys, adm.clientPrefix+string(c.key))
	}
	for _, tier := range sc.tiers {
		keys = append(keys, adm.tierPrefix+tier)
	}
	// cur is the tier table the steps have switched to; each ask stores its own
	// before it decides, since the asks of a batch decide after all are gathered.
	cur := sc.tables[0]
	table.Store(cur)
	state := model.NewState()
	r := rand.New(rand.NewPCG(sc.seed, 0xba7c4))

	type ask struct {
		step int
		s    step
		lim  model.Limits
		d    Decision
		e    Enforcement
		err  error
	}
	for i := 0; i < len(sc.steps); {
		s := sc.steps[i]
		if s.pause > 0 {
			time.Sleep(s.pause)
		}
		// A batch: this ask and the next ones up to a pause or an ask of the memory,
		// the tier table and the rates switched between them as they come.
		limit := 1 + r.IntN(12)
		var asks []*ask
		for ; i < len(sc.steps) && len(asks) < limit; i++ {
			s := sc.steps[i]
			if len(asks) > 0 && (s.pause > 0 || s.memory) {
				break
			}
			if s.table >= 0 {
				cur = sc.tables[s.table]
				continue
			}
			if s.rates >= 0 {
				continue
			}
			asks = append(asks, &ask{step: i, s: s, lim: model.Limits{Cluster: sc.cluster, Reservations: cur}})
			if s.memory {
				i++
				break
			}
		}
		if len(asks) == 0 {
			table.Store(cur)
			continue
		}
		if len(asks) == 1 && asks[0].s.memory {
			table.Store(cur)
			a := asks[0]
			hold, le := adm.CachedRefusal(a.s.charge)
			if hold != nil {
				hold.Release()
			}
			if le != nil {
				continue // the reference test compares the memory's refusals
			}
		}
		calls := make([]func(), len(asks))
		for j, a := range asks {
			calls[j] = func() {
				// The previous ask has read its table: it is queued.
				table.Store(a.lim.Reservations)
				if a.s.take {
					a.d, a.err = adm.decide(ctx, a.s.charge, take)
				} else {
					a.d, a.e, a.err = adm.Report(ctx, a.s.charge)
				}
			}
		}
		inOneRoundTrip(t, p, queued, calls...)
		table.Store(cur)
		if len(asks) > 1 {
			batches.Add(1)
			batched.Add(int64(len(asks)))
		}
		for _, a := range asks {
			if a.err != nil {
				return &mismatch{a.step, fmt.Sprintf("error: %v", a.err)}
			}
			if !a.s.take && a.e != Enforced {
				return &mismatch{a.step, fmt.Sprintf("report says %s", a.e)}
			}
			if a.d.redisNow != asks[0].d.redisNow {
				return &mismatch{a.step, fmt.Sprintf("decided at %v in a batch decided at %v", a.d.redisNow, asks[0].d.redisNow)}
			}
			md := model.Decide(state, a.lim, a.s.charge, a.s.take, a.d.redisNow)
			if what := compare(a.d, md, a.s.charge); what != "" {
				return &mismatch{a.step, fmt.Sprintf("decision %d of a batch of %d: %s", slices.Index(asks, a)+1, len(asks), what)}
			}
			if len(asks) > 1 {
				seen.observe(a.s, md)
			}
		}
		if what := expiriesAgree(ctx, rdb, keys); what != "" {
			return &mismatch{asks[len(asks)-1].step, fmt.Sprintf("after a batch of %d: %s", len(asks), what)}
		}
	}
	return nil
}

// expiriesAgree checks that each of keys that exists expires when its value records,
// "" when they all do. The scripts write both from one figure (a PX of x ms beside now
// + x ms, or KEEPTTL beside the expiry stored before), so a decision on its own keeps
// them together; a batch writes each key once, at its end, and must give it the last
// PX its decisions set. The model sees only the values: a batch that kept an earlier
// decision's PX would decide as the model does until Redis forgot the bucket before
// its F, when it reads full.
func expiriesAgree(ctx context.Context, rdb redis.UniversalClient, keys []string) string {
	pipe := rdb.Pipeline()
	values := make([]*redis.StringCmd, len(keys))
	expiries := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		values[i], expiries[i] = pipe.Get(ctx, k), pipe.PExpireTime(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Sprintf("reading the keys: %v", err)
	}
	for i, k := range keys {
		raw, err := values[i].Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil || len(raw) < 24 {
			return fmt.Sprintf("%s: %q, %v", k, raw, err)
		}
		recorded := math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[16:24])))
		// Redis counts a PX from its clock at the SET, in whole ms: from up to a ms
		// before the script's TIME (the truncation) to as long after as the script ran
		// until its writes (a few ms; tens on a loaded machine). Earlier is the bound
		// that matters, a key forgotten before its recorded expiry reading full; later
		// is bounded loosely, at 5 s.
		switch expiries[i].Val() {
		case -2: // gone since the GET
			continue
		case -1:
			return fmt.Sprintf("%s has no expiry, its value records %.0f µs", k, recorded)
		}
		at := float64(expiries[i].Val().Milliseconds()) * 1e3
		if at < recorded-1e3-1e-15*recorded || at > recorded+5e6 {
			return fmt.Sprintf("%s expires at %.0f µs, its value records %.0f", k, at, recorded)
		}
	}
	return ""
}

func TestBatches(t *testing.T) {
	t.Parallel()

	t.Run("64 goroutines in batches admit exactly every client's burst and the cluster's", func(t *testing.T) {
		t.Parallel()
		for _, clusterBurst := range []int64{16, 10} {
			t.Run(fmt.Sprintf("cluster burst %d", clusterBurst), func(t *testing.T) {
				t.Parallel()
				bothTopologies(t, func(t *testing.T, cluster bool) {
					opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: clusterBurst})
					opts.BatchAbove = 1
					b := coalescerSetupWith(t, cluster, opts, false)
					bursts := map[space.ClientKey]int64{"acme": 3, "globex": 5, "initech": 7, "umbrella": 1}
					clients := []space.ClientKey{"acme", "globex", "initech", "umbrella"}
					var mu sync.Mutex
					admitted := map[space.ClientKey]int{}
					start := make(chan struct{})
					var wg sync.WaitGroup
					for g := range 64 {
						client := clients[g%len(clients)]
						r := rate(neverRefills, bursts[client])
						wg.Go(func() {
							<-start
							for range 6 {
								if d := b.admit(client, r); d.Admitted {
									mu.Lock()
									admitted[client]++
									mu.Unlock()
								}
							}
						})
					}
					close(start)
					wg.Wait()
					total := 0
					for _, client := range clients {
						n := admitted[client]
						total += n
						if n > int(bursts[client]) || (clusterBurst >= 16 && n != int(bursts[client])) {
							t.Errorf("%s admitted %d against its burst %d", client, n, bursts[client])
						}
						if s := b.stored(b.clientKey(client)); n > 0 && !near(s.tokens, float64(bursts[client]-int64(n)), 1e-6) {
							t.Errorf("%s's bucket holds %v after %d admissions, want %d", client, s.tokens, n, bursts[client]-int64(n))
						}
					}
					if total != int(min(clusterBurst, 16)) {
						t.Errorf("admitted %d in all, want %d", total, min(clusterBurst, 16))
					}
					if s := b.stored(b.clusterKey()); !near(s.tokens, float64(clusterBurst)-float64(total), 1e-6) {
						t.Errorf("the cluster bucket holds %v after %d admissions, want %v", s.tokens, total, float64(clusterBurst)-float64(total))
					}
					if !slices.ContainsFunc(b.gate.batched(), func(n int) bool { return n > 1 }) {
						t.Fatal("64 goroutines above 1 in flight sent no batch of more than one decision")
					}
				})
			})
		}
	})

	t.Run("tiers drawing on reserves in batches admit exactly the cluster's burst", func(t *testing.T) {
		t.Parallel()
		bothTopologies(t, func(t *testing.T, cluster bool) {
			res := proReserve(0.5) // shared 6, pro's reserve 4 (2 of them lendable)
			opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: 10})
			opts.BatchAbove = 1
			opts.Reservations = func() *space.Reservations { return res }
			b := coalescerSetupWith(t, cluster, opts, false)
			var pro, free atomic.Int64
			start := make(chan struct{})
			var wg sync.WaitGroup
			for g := range 48 {
				tier, count := "free", &free
				if g%3 == 0 {
					tier, count = "pro", &pro
				}
				client := space.ClientKey(fmt.Sprintf("c%d", g%6))
				wg.Go(func() {
					<-start
					for range 4 {
						d, err := b.adm.decide(b.ctx, space.Charge{Key: client, Rate: rate(neverRefills, 100), Tier: tier, Cost: 1}, take)
						if err != nil || d.FailedOpen {
							t.Errorf("decide: %+v, %v", d, err)
							return
						}
						if d.Admitted {
							count.Add(1)
						}
					}
				})
			}
			close(start)
			wg.Wait()
			// Free draws on the shared 6 and what pro lends (2, pro being busy or not);
			// pro on its own 4 and the shared: 10 in all, never more.
			if got := pro.Load() + free.Load(); got != 10 {
				t.Errorf("admitted %d (pro %d, free %d), want the cluster's 10", got, pro.Load(), free.Load())
			}
			if pro.Load() < 2 {
				t.Errorf("pro admitted %d, less than the half of its reserve nobody may borrow", pro.Load())
			}
			if !slices.ContainsFunc(b.gate.batched(), func(n int) bool { return n > 1 }) {
				t.Fatal("48 goroutines above 1 in flight sent no batch of more than one decision")
			}
		})
	})

	t.Run("a batch of one client's takes decides them in its order, each seeing the ones before", func(t *testing.T) {
		t.Parallel()
		bothTopologies(t, func(t *testing.T, cluster bool) {
			b := coalescerSetup(t, cluster, 1, false)
			queued := b.queued
			r := rate(neverRefills, 5)
			// Costs 2, 2, 2, 1, 1, a report, 1: the third is refused (1 left), the
			// fourth takes the last, then nothing is left for the fifth, the report or
			// the last. In the reverse order the last three would be admitted.
			costs := []int{2, 2, 2, 1, 1, 0, 1}
			ds := make([]Decision, len(costs))
			errs := make([]error, len(costs))
			calls := make([]func(), len(costs))
			for i, cost := range costs {
				calls[i] = func() {
					if cost == 0 {
						ds[i], _, errs[i] = b.adm.Report(b.ctx, space.Charge{Key: "acme", Rate: r, Cost: 1})
						return
					}
					_, errs[i] = b.adm.Charge(b.ctx, space.Charge{Key: "acme", Rate: r, Cost: cost})
					if le := new(space.LimitError); errors.As(errs[i], &le) {
						ds[i], errs[i] = Decision{Bucket: le.Bucket, Client: &BucketState{Remaining: le.Remaining}}, nil
					} else if errs[i] == nil {
						ds[i] = Decision{Admitted: true}
					}
				}
			}
			inOneRoundTrip(t, b.adm.run.scripts, queued, calls...)
			want := []bool{true, true, false, true, false, false, false}
			for i := range costs {
				if errs[i] != nil {
					t.Fatalf("decision %d: %v", i, errs[i])
				}
				if ds[i].Admitted != want[i] {
					t.Errorf("decision %d (cost %d): admitted %v, want %v", i, costs[i], ds[i].Admitted, want[i])
				}
			}
			if ds[2].Bucket != space.BucketClientActivation || !near(ds[2].Client.Remaining, 1, 1e-9) {
				t.Errorf("the third = %+v, want refused by the client bucket holding 1", ds[2])
			}
			if !near(ds[5].Client.Remaining, 0, 1e-9) {
				t.Errorf("the report says the client bucket holds %v, want 0", ds[5].Client.Remaining)
			}
			b.settled([]int{len(costs)}, 0, "one batch of seven, the client's 5 tokens taken by the first, second and fourth")
			if s := b.stored(b.clusterKey()); !near(s.tokens, float64(1<<40)-5, 1e-3) {
				t.Errorf("the cluster bucket holds %v, want 5 taken", s.tokens)
			}
		})
	})

	t.Run("a batch leaves each key the value and the expiry one call each would have", func(t *testing.T) {
		t.Parallel()
		bothTopologies(t, func(t *testing.T, cluster bool) {
			// A client rate of 1 token per 1000 s, burst 3, on a key that does not
			// exist: the first take sets it with a PX (the 3000 s a refill from empty
			// takes), the next two keep that expiry (KEEPTTL), which still covers their
			// F. One call each would leave the key with the first one's expiry; so
			// must the batch, which writes the key once, at its end.
			b := coalescerSetup(t, cluster, 1, false)
			queued := b.queued
			r := rate(0.001, 3)
			calls := make([]func(), 3)
			for i := range calls {
				calls[i] = func() { b.admit("acme", r) }
			}
			inOneRoundTrip(t, b.adm.run.scripts, queued, calls...)
			s := b.stored(b.clientKey("acme"))
			if !near(s.tokens, 0, 1e-9) {
				t.Fatalf("the client bucket holds %v, want 0", s.tokens)
			}
			// Empty at a rate of 0.001/s: full 3000 s after the batch's time; the key
			// expires then and 2 ms after, its stored expiry saying so.
			if want := s.micros + 3000e6; !near(s.full, want, 1) || s.expires < want || s.expires > want+3000 {
				t.Fatalf("client key F %v expiry %v, want F %v and the expiry 2 to 3 ms after", s.full, s.expires, want)
			}
			if ttl := b.pttl(b.clientKey("acme")); ttl < 2990*time.Second || ttl > 3001*time.Second {
				t.Fatalf("the client key expires in %v, want about 3000 s", ttl)
			}
			b.settled([]int{3}, 0, "the three in one batch")
		})
	})

	t.Run("a key two decisions of a batch set expiries on keeps the last one's", func(t *testing.T) {
		t.Parallel()
		bothTopologies(t, func(t *testing.T, cluster bool) {
			// A take at 1 token/s, burst 3, sets the new key to expire in 3 s (a refill
			// from empty); a report at 0.001/s then puts its F 1000 s away, past that
			// expiry, and sets it again to the 3000 s a refill from empty now takes.
			// One call each would leave the key expiring in 3000 s, the second's; a
			// batch writing the first's would have Redis forget the bucket (reading
			// full) 2997 s before its F.
			b := coalescerSetup(t, cluster, 1, false)
			var took Decision
			var reported Decision
			var errs [2]error
			inOneRoundTrip(t, b.adm.run.scripts, b.queued,
				func() {
					took, errs[0] = b.adm.decide(b.ctx, space.Charge{Key: "acme", Rate: rate(1, 3), Cost: 1}, take)
				},
				func() {
					reported, _, errs[1] = b.adm.Report(b.ctx, space.Charge{Key: "acme", Rate: rate(0.001, 3), Cost: 1})
				},
			)
			if errs[0] != nil || errs[1] != nil || !took.Admitted || !near(reported.Client.Remaining, 2, 1e-6) {
				t.Fatalf("take %+v, %v; report %+v, %v: want 1 taken of 3, 2 left", took, errs[0], reported, errs[1])
			}
			if took.redisNow != reported.redisNow {
				t.Fatalf("decided at %v and %v: not one batch", took.redisNow, reported.redisNow)
			}
			s := b.stored(b.clientKey("acme"))
			if want := s.micros + 1000e6; !near(s.full, want, 1) {
				t.Fatalf("client key F %v, want %v (the report's rate)", s.full, want)
			}
			if ttl := b.pttl(b.clientKey("acme")); ttl < 2990*time.Second || ttl > 3001*time.Second {
				t.Fatalf("the client key expires in %v, want about 3000 s, the later decision's", ttl)
			}
			b.settled([]int{2}, 2, "the two in one batch")
		})
	})

	t.Run("a caller whose deadline comes while its batch is on its way returns then, and the others get their replies", func(t *testing.T) {
		t.Parallel()
		b := coalescerSetup(t, false, 1, false)
		queued := b.queued
		r := rate(neverRefills, 100)
		b.gate.holdNext()
		ctx, cancel := context.WithTimeout(b.ctx, 50*time.Millisecond)
		defer cancel()
		late := make(chan error, 1)
		admitted := make(chan bool, 2)
		done := make(chan struct{})
		go func() {
			defer close(done)
			inOneRoundTrip(t, b.adm.run.scripts, queued,
				func() { admitted <- b.admit("acme", r).Admitted },
				func() {
					_, err := b.adm.admit(ctx, "acme", r)
					late <- err
				},
				func() { admitted <- b.admit("acme", r).Admitted },
			)
		}()
		<-b.gate.pipeHeld
		// The batch is held on its way; the caller with 50 ms returns at its deadline.
		select {
		case err := <-late:
			if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("the caller past its deadline got %v, want ErrUnavailable for the deadline (fail closed)", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the caller past its deadline did not return while its batch was held")
		}
		close(b.gate.pipeOpen)
		<-done
		close(admitted)
		for a := range admitted {
			if !a {
				t.Fatal("a decision riding with the one that gave up was refused")
			}
		}
		// The one that gave up rode in the batch: its token was taken, its reply dropped.
		b.settled([]int{3}, 97, "the three went as one batch")
	})

	t.Run("a caller that gives up before its batch is written is left out of it", func(t *testing.T) {
		t.Parallel()
		b := coalescerSetup(t, false, 1, false)
		queued := b.queued
		r := rate(neverRefills, 100)
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Millisecond)
		defer cancel()
		var gone error
		inOneRoundTrip(t, b.adm.run.scripts, queued,
			func() { b.admit("acme", r) },
			func() { _, gone = b.adm.admit(ctx, "acme", r) },
			func() {
				// Queued last, once the one before it is past its deadline, while the
				// round trip is still out.
				<-ctx.Done()
				b.admit("acme", r)
			},
		)
		if !errors.Is(gone, context.DeadlineExceeded) {
			t.Fatalf("the caller that gave up got %v", gone)
		}
		b.settled([]int{2}, 98, "the two that waited went as one batch, the one that gave up was never sent")
	})

	t.Run("a batch a server lost its scripts for is sent again with its source, alone or in a pipeline", func(t *testing.T) {
		t.Parallel()
		srv := testenv.StartRedis(t)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		g := newGate(false)
		rdb.AddHook(g)
		lim, err := NewLimiter(LimiterOptions{Redis: rdb, Prefix: "auth", Rate: space.Rate{RefillRPS: neverRefills, Burst: 10}, Timeout: testTimeout, PipelineAbove: 1})
		if err != nil {
			t.Fatal(err)
		}
		queued := queueHook(lim.run.scripts)
		ctx := testenv.Context(t)
		// Two keys, each its own hash tag: two batches, one pipeline.
		allowed := map[string]*atomic.Int64{"a": {}, "b": {}}
		allow := func(key string) func() {
			return func() {
				ok, _, err := lim.Allow(ctx, key)
				if err != nil {
					t.Errorf("Allow(%s): %v", key, err)
				}
				if ok {
					allowed[key].Add(1)
				}
			}
		}
		g.holdNext()
		done := make(chan struct{})
		go func() {
			defer close(done)
			inOneRoundTrip(t, lim.run.scripts, queued, allow("a"), allow("b"), allow("a"), allow("b"), allow("a"))
		}()
		<-g.pipeHeld
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		close(g.pipeOpen)
		<-done
		if allowed["a"].Load() != 3 || allowed["b"].Load() != 2 {
			t.Fatalf("allowed a %d and b %d, want 3 and 2", allowed["a"].Load(), allowed["b"].Load())
		}
		if got := g.sizes(); !slices.Equal(got, []int{2}) {
			t.Fatalf("pipelines %v, want one of the two batches", got)
		}
		if got := g.batched(); !slices.Equal(got, []int{3, 2}) {
			t.Fatalf("batches %v, want a's three and b's two", got)
		}
		if got, again := g.retried(), g.evalBatched(); !slices.Equal(got, []int{2}) || !slices.Equal(again, []int{3, 2}) {
			t.Fatalf("pipelines of EVAL %v of batches %v, want one of both batches again", got, again)
		}
		// And a batch alone.
		queuedAlone := queued
		inOneRoundTrip(t, lim.run.scripts, queuedAlone, allow("a"), allow("a"))
		if allowed["a"].Load() != 5 {
			t.Fatalf("a allowed %d, want 5", allowed["a"].Load())
		}
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		inOneRoundTrip(t, lim.run.scripts, queuedAlone, allow("a"), allow("a"), allow("a"))
		if allowed["a"].Load() != 8 {
			t.Fatalf("a allowed %d after SCRIPT FLUSH, want 8", allowed["a"].Load())
		}
		if again := g.evalBatched(); !slices.Equal(again, []int{3, 2, 3}) {
			t.Fatalf("batches sent again as EVAL %v, want the last of three too", again)
		}
	})

	t.Run("a decision that fails in a batch fails alone", func(t *testing.T) {
		t.Parallel()
		bothTopologies(t, func(t *testing.T, cluster bool) {
			b := coalescerSetup(t, cluster, 1, false)
			keys := []string{b.clusterKey(), b.clientKey("acme")}
			rates := string(b.adm.clusterArgs + argsOf(space.Rate{RefillRPS: neverRefills, Burst: 10}))
			qs := []*queuedScript{
				{ctx: b.ctx, script: bucketScript, keys: keys, args: []any{"1", rates}},
				{ctx: b.ctx, script: bucketScript, keys: keys, args: []any{"one", rates}},   // no number
				{ctx: b.ctx, script: bucketScript, keys: keys, args: []any{"1", rates[:9]}}, // no rates
				{ctx: b.ctx, script: bucketScript, keys: keys, args: []any{"1", rates}},
			}
			b.adm.run.scripts.send(qs)
			for i, q := range qs {
				reply, err := q.cmd.Text()
				if bad := i == 1 || i == 2; bad != (err != nil) {
					t.Fatalf("decision %d: %q, %v", i, reply, err)
				}
				if err != nil {
					continue
				}
				if admitted, _, _, _, err := parseReply(reply, 2); err != nil || !admitted {
					t.Fatalf("decision %d: admitted %v, %v", i, admitted, err)
				}
			}
			if s := b.stored(b.clientKey("acme")); !near(s.tokens, 8, 1e-9) {
				t.Fatalf("the client bucket holds %v, want the two good decisions' 2 taken", s.tokens)
			}
			if got := b.gate.batched(); !slices.Equal(got, []int{4}) {
				t.Fatalf("batches %v, want the four as one", got)
			}
		})
	})

	t.Run("a batch that fails as a whole writes nothing and fails every decision", func(t *testing.T) {
		t.Parallel()
		srv := testenv.StartRedis(t)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		b := coalescerSetupOn(t, rdb, 1, false)
		queued := b.queued
		r := rate(neverRefills, 100)
		// Out of memory: Redis refuses a script's first write.
		if err := rdb.ConfigSet(b.ctx, "maxmemory", "1").Err(); err != nil {
			t.Fatal(err)
		}
		errs := make([]error, 4)
		calls := make([]func(), len(errs))
		for i := range calls {
			calls[i] = func() { _, errs[i] = b.adm.admit(b.ctx, "acme", r) }
		}
		inOneRoundTrip(t, b.adm.run.scripts, queued, calls...)
		for i, err := range errs {
			if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
				t.Fatalf("decision %d: %v, want the batch's OOM", i, err)
			}
		}
		if s := b.stored(b.clientKey("acme")); s.exists {
			t.Fatalf("the failed batch wrote the client key: %+v", s)
		}
		if err := rdb.ConfigSet(b.ctx, "maxmemory", "0").Err(); err != nil {
			t.Fatal(err)
		}
		inOneRoundTrip(t, b.adm.run.scripts, queued, calls...)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("decision %d after: %v", i, err)
			}
		}
		b.settled([]int{4, 4}, 96, "the second batch took its four tokens, the first none")
	})

	t.Run("a Limiter's keys, each its own slot, go in batches of their own", func(t *testing.T) {
		t.Parallel()
		bothTopologies(t, func(t *testing.T, cluster bool) {
			var rdb redis.UniversalClient
			if cluster {
				rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisClusterAddrs(t), ContextTimeoutEnabled: true})
			} else {
				rdb = redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t), ContextTimeoutEnabled: true})
			}
			t.Cleanup(func() { rdb.Close() })
			g := newGate(false)
			rdb.AddHook(g)
			lim, err := NewLimiter(LimiterOptions{Redis: rdb, Prefix: testenv.Prefix(t), Rate: space.Rate{RefillRPS: neverRefills, Burst: 7}, Timeout: testTimeout, PipelineAbove: 1})
			if err != nil {
				t.Fatal(err)
			}
			ctx := testenv.Context(t)
			keys := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"}
			var mu sync.Mutex
			allowed := map[string]int{}
			var wg sync.WaitGroup
			for i := range 40 {
				key := keys[i%len(keys)]
				wg.Go(func() {
					for range 3 {
						ok, _, err := lim.Allow(ctx, key)
						if err != nil {
							t.Errorf("Allow(%s): %v", key, err)
							return
						}
						if ok {
							mu.Lock()
							allowed[key]++
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			for _, key := range keys {
				if allowed[key] != 7 {
					t.Errorf("%s allowed %d, want its burst 7", key, allowed[key])
				}
			}
			if !slices.ContainsFunc(g.batched(), func(n int) bool { return n > 1 }) {
				t.Fatal("40 goroutines above 1 in flight sent no batch of more than one decision")
			}
		})
	})

	t.Run("one decision at a time goes on its own, never in a batch", func(t *testing.T) {
		t.Parallel()
		b := coalescerSetup(t, false, DefaultBatchAbove, false)
		r := rate(neverRefills, 100)
		for range 20 {
			b.admit("acme", r)
		}
		if got := b.gate.singles.Load(); got != 20 {
			t.Fatalf("%d on their own, want 20", got)
		}
		b.settled(nil, 80, "nothing waited")
	})
}

// TestPlanCalls checks how a round trip's calls are grouped: the decisions of one
// hash tag in one batch, in their order; other tags, other scripts and groups of one
// each a call on its own.
func TestPlanCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := func(script *redis.Script, keys ...string) *queuedScript {
		return &queuedScript{ctx: ctx, script: script, keys: keys, args: []any{"1", "rates"}}
	}
	a1 := q(bucketScript, "p:cluster", "{p:cluster}:client:a")
	a2 := q(reserveScript, "p:cluster", "{p:cluster}:client:b", "{p:cluster}:tier:pro")
	lease := q(acquireScript, "{p:concurrency}:a")
	a3 := q(bucketScript, "p:cluster")
	other := q(bucketScript, "auth:10.0.0.1")
	split := q(bucketScript, "p:cluster", "{q:cluster}:client:a")
	calls := planCalls([]*queuedScript{a1, a2, lease, a3, other, split})
	var got []string
	for _, c := range calls {
		var names []string
		for _, x := range c.of {
			switch x {
			case a1:
				names = append(names, "a1")
			case a2:
				names = append(names, "a2")
			case a3:
				names = append(names, "a3")
			case lease:
				names = append(names, "lease")
			case other:
				names = append(names, "other")
			case split:
				names = append(names, "split")
			}
		}
		kind := "alone"
		if c.script == batchScript {
			kind = "batch"
		}
		got = append(got, kind+":"+strings.Join(names, ","))
	}
	want := []string{"batch:a1,a2,a3", "alone:lease", "alone:other", "alone:split"}
	if !slices.Equal(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}
	batch := calls[0]
	wantKeys := []string{"p:cluster", "{p:cluster}:client:a", "{p:cluster}:client:b", "{p:cluster}:tier:pro"}
	if !slices.Equal(batch.keys, wantKeys) {
		t.Fatalf("the batch's keys %v, want each once %v", batch.keys, wantKeys)
	}
	if len(batch.args) != 3 || batch.args[1] != "1" || batch.args[2] != "rates" {
		t.Fatalf("the batch's arguments %q, want the header and each argument once", batch.args)
	}
	// Three key lists, one argument list, three decisions.
	head := batch.args[0].(string)
	wantHead := "\x03\x00" + "\x02\x01\x00\x02\x00" + "\x03\x01\x00\x03\x00\x04\x00" + "\x01\x01\x00" +
		"\x01\x00" + "\x02\x02\x00\x03\x00" +
		"b\x01\x00\x01\x00" + "r\x02\x00\x01\x00" + "b\x03\x00\x01\x00"
	if head != wantHead {
		t.Fatalf("header %q, want %q", head, wantHead)
	}
	if hashTag("{p:cluster}:client:a") != "p:cluster" || hashTag("p:cluster") != "p:cluster" || hashTag("{}x") != "{}x" {
		t.Fatal("hashTag is not Redis Cluster's")
	}
}
