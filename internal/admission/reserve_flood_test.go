package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
)

// The cluster of these tests: 20 activations a second (burst 20), of which pro
// reserves 40%.
var (
	floodCluster = space.Rate{RefillRPS: 20, Burst: 20}
	floodReserve = &space.Reservations{
		Shared:   space.Rate{RefillRPS: 12, Burst: 12},
		Reserves: []space.TierReserve{{Tier: "pro", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 8, Burst: 8}, Lendable: 1}}},
	}
	// freeRate is each free client's own rate: fifty of them want 50/s together.
	freeRate = space.Rate{RefillRPS: 1, Burst: 1}
)

// flood is fifty free clients, each charging as fast as its own bucket allows (a
// refusal waits its Retry-After), until stop is called; admitted counts what the
// cluster let through.
type flood struct {
	admitted atomic.Int64
	stop     func()
}

func (b *bundle) flood() *flood {
	ctx, cancel := context.WithCancel(b.ctx)
	f := &flood{}
	var wg sync.WaitGroup
	for i := range 50 {
		client := space.ClientKey(fmt.Sprintf("free-%d", i))
		wg.Go(func() {
			for ctx.Err() == nil {
				wait := time.Second // the client's own next token
				_, err := b.adm.Charge(ctx, space.Charge{Key: client, Rate: &freeRate, Tier: "free", Cost: 1})
				var le *space.LimitError
				switch {
				case err == nil:
					f.admitted.Add(1)
				case errors.As(err, &le):
					wait = max(le.RetryAfter, 10*time.Millisecond)
				case ctx.Err() == nil:
					b.t.Errorf("flood: %v", err)
					return
				}
				select {
				case <-ctx.Done():
				case <-time.After(wait):
				}
			}
		})
	}
	f.stop = func() { cancel(); wg.Wait() }
	return f
}

// proAsk is one of paced's charges: when it was sent, when it was answered, and
// whether it was admitted.
type proAsk struct {
	sent, answered time.Time
	admitted       bool
}

// paced charges n times as a pro client, one ask at each tick of gap, and returns
// each ask. A count, not a duration: a loaded machine drops ticks, and asks slower
// than gap are still within pro's rate.
func (b *bundle) paced(gap time.Duration, n int) []proAsk {
	b.t.Helper()
	proRate := &space.Rate{RefillRPS: 100, Burst: 100}
	tick := time.NewTicker(gap)
	defer tick.Stop()
	var asks []proAsk
	for i := 0; i < n; i++ {
		if i > 0 {
			<-tick.C
		}
		sent := time.Now()
		_, err := b.adm.Charge(b.ctx, space.Charge{Key: "pro-client", Rate: proRate, Tier: "pro", Cost: 1})
		var le *space.LimitError
		if err != nil && !errors.As(err, &le) {
			b.t.Fatal(err)
		}
		asks = append(asks, proAsk{sent: sent, answered: time.Now(), admitted: err == nil})
	}
	return asks
}

// proInterval is pro's reserve interval (burst/rate): a tier with no ask for that long
// is idle (model rule 7), and the flood may borrow its whole reserve meanwhile.
var proInterval = time.Duration(float64(time.Second) * float64(floodReserve.Reserves[0].Rate.Burst) / floodReserve.Reserves[0].Rate.RefillRPS)

// afterIdle reports whether pro may have been idle when asks[i] was decided: the
// ask before it was sent at least proInterval before this one was answered. Only a
// machine that stalls the asking goroutine for that long makes such a gap; the first
// ask after it may find the reserve lent out, which the model allows.
func afterIdle(asks []proAsk, i int) bool {
	return i > 0 && asks[i].answered.Sub(asks[i-1].sent) >= proInterval
}

func TestReservedCapacityUnderFlood(t *testing.T) {
	t.Parallel()
	// pro paces at 90% of its reserved 8/s: an ask at exactly the refill would find
	// the reserve a hair short whenever the timer fires early.
	proGap := time.Second / 8 * 10 / 9
	reservedSetupRefilling := func(t *testing.T, rdb redis.UniversalClient) *bundle {
		opts := enabled(floodCluster)
		opts.Reservations = func() *space.Reservations { return floodReserve }
		return setup(t, rdb, opts)
	}
	// within is the most the cluster bucket allows over elapsed: its burst and its rate.
	within := func(t *testing.T, total int64, elapsed time.Duration) {
		t.Helper()
		if most := float64(floodCluster.Burst) + floodCluster.RefillRPS*elapsed.Seconds() + 1; float64(total) > most {
			t.Fatalf("%d admitted in %v, more than the cluster's %.0f", total, elapsed, most)
		}
	}

	t.Run("a pro client at its reserved rate is always admitted while fifty free clients flood, and the total stays within the cluster's", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := reservedSetupRefilling(t, rdb)
			start := time.Now()
			asks := b.paced(proGap, 1) // one ask: pro is active before the flood
			f := b.flood()
			asks = append(asks, b.paced(proGap, 24)...) // 3.3 s and more
			f.stop()
			elapsed := time.Since(start)
			atRate := 0
			for i, a := range asks {
				switch {
				case afterIdle(asks, i):
					if !a.admitted {
						t.Logf("pro's ask %d, %v after the one before was sent, refused: pro was idle", i, a.answered.Sub(asks[i-1].sent))
					}
				case !a.admitted:
					t.Fatalf("pro's ask %d, %v after the one before was sent, refused: want every ask at its reserved rate admitted", i, a.answered.Sub(asks[i-1].sent))
				default:
					atRate++
				}
			}
			if atRate < len(asks)/2 {
				t.Fatalf("only %d of pro's %d asks came at its rate: the machine stalled the test", atRate, len(asks))
			}
			if f.admitted.Load() < 30 {
				t.Fatalf("the flood was admitted %d times in %v: it did not flood", f.admitted.Load(), elapsed)
			}
			within(t, f.admitted.Load()+int64(len(asks)), elapsed)
		})
	})

	t.Run("an idle pro lends its reserve, so the flood gets more than the shared remainder could ever give, within the cluster's; pro gets its rate back within one refill interval", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := reservedSetupRefilling(t, rdb)
			from := time.Now()
			f := b.flood()
			time.Sleep(4 * time.Second)
			got, window := f.admitted.Load(), time.Since(from)
			// Bounds, not a rate to reach: a machine that stalls the flood's goroutines
			// leaves tokens unasked at the bucket's cap, but never lets the shared
			// remainder give more than its burst and its rate. Past that, the reserve
			// was lent (the cluster's rate is 20/s, the shared 12/s: the flood needs
			// three fifths of the cluster's to show it, and gets all of it on an idle
			// machine).
			shared := float64(floodReserve.Shared.Burst) + floodReserve.Shared.RefillRPS*window.Seconds() + 1
			cluster := float64(floodCluster.Burst) + floodCluster.RefillRPS*window.Seconds() + 1
			if float64(got) <= shared || float64(got) > cluster {
				t.Fatalf("pro idle: the flood was admitted %d in %v, want more than the shared remainder's %.0f (its reserve lent) and at most the cluster's %.0f",
					got, window, shared, cluster)
			}

			asks := b.paced(proGap, 24)
			f.stop()
			late := 0
			for i, a := range asks {
				if a.answered.Sub(asks[0].answered) > proInterval && !afterIdle(asks, i) {
					late++
					if !a.admitted {
						t.Fatalf("pro's ask %v after its first was refused: want its reserved rate back within %v", a.answered.Sub(asks[0].answered), proInterval)
					}
				}
			}
			if late < 5 {
				t.Fatalf("only %d asks after the refill interval", late)
			}
		})
	})
}
