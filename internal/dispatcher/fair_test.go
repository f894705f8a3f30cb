package dispatcher_test

import (
	"fmt"
	"math"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestFairQueue(t *testing.T) {
	t.Parallel()
	lanes := config.Default().Dispatcher.OwnerLanes

	t.Run("one owner's thousand queued creates wait parked, and another owner's one starts ahead of them", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1}) // accept now, run later
		rate := space.Rate{RefillRPS: 20, Burst: int64(lanes)}
		b.limits.set("acme", &rate, 0)
		b.limits.set("globex", &rate, 0)
		b.enqueueMany(map[space.ClientID]int{"acme": 1000})
		if got := b.laneCounts("acme"); got != [2]int{lanes, 1000 - lanes} {
			t.Fatalf("acme's 1000 creates: %d in a lane and %d parked, want %d and %d", got[0], got[1], lanes, 1000-lanes)
		}
		if n := b.count(`SELECT count(*) FROM river_job j JOIN operations o ON o.job_id = j.id
			WHERE o.client = 'acme' AND o.parked AND j.state = 'scheduled' AND j.scheduled_at > now() + interval '50 years'`); n != 1000-lanes {
			t.Fatalf("%d of acme's parked creates have a job scheduled out of River's reach, want all %d", n, 1000-lanes)
		}
		one := b.create("globex", "")

		b.dispatcher(setupOptions{workers: 4})
		done := b.waitDone(one.ID)
		if done.State != space.OperationSucceeded {
			t.Fatalf("globex's create: %+v, want succeeded", done)
		}
		// Ahead of globex's create were acme's lanes; what acme's ends moved into a
		// lane queued behind it.
		if n := b.count(`SELECT count(*) FROM operations WHERE client = 'acme' AND state = 'succeeded' AND finished_at <= (SELECT finished_at FROM operations WHERE id = $1)`, one.ID); n > 2*lanes {
			t.Fatalf("%d of acme's creates finished before globex's one, want at most two rounds of its %d lanes", n, lanes)
		}
		// acme's bucket now turns its lanes away: its parked creates are never fetched,
		// run or updated while they wait.
		time.Sleep(time.Second)
		var served, touched int
		if err := b.db.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE o.state = 'succeeded'), count(*) FILTER (WHERE j.attempt > 0 OR j.metadata ? 'snoozes')
			FROM operations o JOIN river_job j ON j.id = o.job_id WHERE o.client = 'acme'`).Scan(&served, &touched); err != nil {
			t.Fatal(err)
		}
		if touched > served+lanes {
			t.Fatalf("%d of acme's jobs were fetched, %d served: want only the served and the %d in a lane", touched, served, lanes)
		}
	})

	t.Run("owners off the allowlist share the bucket of unknown, not a place in the queue", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1})
		rate := space.Rate{RefillRPS: 60, Burst: 1}
		backlog := map[space.ClientID]int{}
		for i, n := range []int{200, 100, 20, 1, 200, 100, 20, 1, 200, 100} {
			id := space.ClientID(fmt.Sprintf("agent-%d", i))
			backlog[id] = n
			b.limits.mu.Lock()
			b.limits.m[id] = space.Caller{ID: id, Key: space.Unknown, ClientRate: &rate}
			b.limits.mu.Unlock()
		}
		b.enqueueMany(backlog)
		start := time.Now()
		b.dispatcher(setupOptions{workers: 6})

		// The window: until the first owner of a hundred is served them all, while every
		// owner of a hundred or more is still backlogged. About ten seconds of a bucket
		// of 60/s: long enough that one lane's fetch delayed on a loaded machine (a
		// second, beside make test's other packages) does not read as unfairness.
		var served map[space.ClientID][]time.Time
		testenv.Eventually(t, time.Minute, "an owner of a hundred to be served them all", func() bool {
			served = b.served()
			for id, n := range backlog {
				if n == 100 && len(served[id]) == 100 {
					return true
				}
			}
			return false
		})
		end := time.Now()
		for id, n := range backlog {
			if n == 100 && len(served[id]) == 100 && served[id][99].Before(end) {
				end = served[id][99]
			}
		}
		var rates []float64
		for id, n := range backlog {
			if n < 100 {
				continue
			}
			in := sort.Search(len(served[id]), func(i int) bool { return served[id][i].After(end) })
			rates = append(rates, float64(in)/end.Sub(start).Seconds())
		}
		if j := jain(rates); j < 0.9 {
			t.Fatalf("Jain's index of the backlogged owners' served rates is %.3f (%v /s), want at least 0.9", j, rates)
		}
		// The owners of one were served in the first rounds, not behind the backlogs.
		for id, n := range backlog {
			if n != 1 {
				continue
			}
			if len(served[id]) != 1 {
				t.Fatalf("%s's one create not served by the end of the window", id)
			}
			for other := range backlog {
				if ahead := sort.Search(len(served[other]), func(i int) bool { return served[other][i].After(served[id][0]) }); ahead >= 40 {
					t.Fatalf("%d of %s's creates were served before %s's one", ahead, other, id)
				}
			}
		}
		t.Logf("served rates of the backlogged owners: %v /s, Jain %.3f", rates, jain(rates))
	})

	t.Run("queue weights of 1, 2 and 4 serve their owners at 1:2:4 while all are backlogged", func(t *testing.T) {
		t.Parallel()
		// The workers are the bottleneck: lanes 1, 2 and 4 against three workers.
		b := setup(t, setupOptions{workers: -1, ownerLanes: 1, latency: 20 * time.Millisecond})
		weights := map[space.ClientID]int{"free": 1, "pro": 2, "enterprise": 4}
		for id, w := range weights {
			b.limits.mu.Lock()
			b.limits.m[id] = space.Caller{ID: id, Key: space.ClientKey(id), Tier: string(id), QueueWeight: w}
			b.limits.mu.Unlock()
		}
		b.enqueueMany(map[space.ClientID]int{"free": 120, "pro": 120, "enterprise": 120})
		b.dispatcher(setupOptions{workers: 3, ownerLanes: 1})

		var served map[space.ClientID][]time.Time
		testenv.Eventually(t, time.Minute, "the heaviest owner to be served its backlog", func() bool {
			served = b.served()
			return len(served["enterprise"]) == 120
		})
		end := served["enterprise"][119]
		count := map[space.ClientID]float64{}
		for id := range weights {
			count[id] = float64(sort.Search(len(served[id]), func(i int) bool { return served[id][i].After(end) }))
		}
		unit := (count["free"] + count["pro"] + count["enterprise"]) / 7
		for id, w := range weights {
			if want := unit * float64(w); math.Abs(count[id]-want) > 0.1*want {
				t.Errorf("%s (weight %d) was served %v while all were backlogged, want %.1f within 10%% (all: %v)", id, w, count[id], want, count)
			}
		}
		t.Logf("served while all were backlogged: %v", count)
	})

	t.Run("no operation is lost, run twice or left waiting, with two dispatchers and limits in the way", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1, ownerLanes: 2})
		slow := space.Rate{RefillRPS: 25, Burst: 2}
		b.limits.set("limited-1", &slow, 0)
		b.limits.set("limited-2", &slow, 0)
		backlog := map[space.ClientID]int{"limited-1": 30, "limited-2": 20, "free-1": 40, "free-2": 3, "free-3": 1}
		b.enqueueMany(backlog)
		b.dispatcher(setupOptions{workers: 3, ownerLanes: 2})
		b.dispatcher(setupOptions{workers: 3, ownerLanes: 2})
		// More while they run, some parked behind the first.
		b.enqueueMany(map[space.ClientID]int{"limited-1": 10, "free-2": 10})
		testenv.Eventually(t, 2*time.Minute, "every operation to end", func() bool {
			return b.count("SELECT count(*) FROM operations WHERE state IN ('queued', 'running')") == 0
		})
		if n := b.count("SELECT count(*) FROM operations WHERE state <> 'succeeded'"); n != 0 {
			t.Fatalf("%d operations did not succeed", n)
		}
		starts := map[string]int{}
		for _, c := range b.sim.Calls() {
			if c.Op == substrate.OpStartCold {
				starts[c.SandboxID]++
			}
		}
		if len(starts) != 114 {
			t.Fatalf("%d sandboxes started, want the 114 operations'", len(starts))
		}
		for id, n := range starts {
			if n != 1 {
				t.Fatalf("sandbox %s started %d times", id, n)
			}
		}
	})

	t.Run("the reconciler's tidy fails a parked operation past its deadline and fills a lane freed without a move", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1, ownerLanes: 1})
		first := b.create("acme", "")
		second := b.create("acme", "")
		third := b.create("acme", "")
		if got := b.laneCounts("acme"); got != [2]int{1, 2} {
			t.Fatalf("in a lane and parked: %v, want 1 and 2", got)
		}
		// The first ends without the move a worker makes (a reconciler settling a lost
		// job does this), and the third's deadline passes while it waits.
		for sql, id := range map[string]string{
			"UPDATE operations SET state = 'failed', error_code = 'internal', finished_at = now() WHERE id = $1": first.ID,
			"UPDATE operations SET admission_deadline = now() - interval '1 second' WHERE id = $1":               third.ID,
		} {
			if _, err := b.db.Exec(b.ctx, sql, id); err != nil {
				t.Fatal(err)
			}
		}
		n, err := b.d.Tidy(b.ctx)
		if err != nil || n != 2 {
			t.Fatalf("tidy = %d, %v; want the expired one failed and the other moved", n, err)
		}
		if op := b.get(third.ID); op.State != space.OperationFailed || op.ErrorCode != space.CodeAdmissionTimeout {
			t.Fatalf("the expired parked operation: %+v, want failed as %s", op, space.CodeAdmissionTimeout)
		}
		if got := b.laneCounts("acme"); got != [2]int{1, 0} {
			t.Fatalf("after the tidy: %v in a lane and parked, want the second in the lane", got)
		}
		if j := b.job(second.ID); j.State != "available" {
			t.Fatalf("the moved operation's job is %s, want available", j.State)
		}
		if j := b.job(third.ID); j.State != "cancelled" {
			t.Fatalf("the expired operation's job is %s, want cancelled", j.State)
		}
		if n, err := b.d.Tidy(b.ctx); err != nil || n != 0 {
			t.Fatalf("a second tidy = %d, %v; want nothing left to do", n, err)
		}
	})
}

// enqueueMany queues each owner's count of creates, the owners side by side.
func (b *bundle) enqueueMany(backlog map[space.ClientID]int) {
	b.t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(backlog))
	for owner, n := range backlog {
		wg.Go(func() {
			for range n {
				if _, _, err := b.enqueueCreate(owner, sandbox.CreateRequest{Shape: python}); err != nil {
					errs <- fmt.Errorf("enqueue for %s: %w", owner, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.t.Fatal(err)
	}
}

// laneCounts is how many of owner's queued operations are in a lane and how many parked.
func (b *bundle) laneCounts(owner space.ClientID) [2]int {
	b.t.Helper()
	return [2]int{
		b.count("SELECT count(*) FROM operations WHERE client = $1 AND NOT parked AND state IN ('queued', 'running')", string(owner)),
		b.count("SELECT count(*) FROM operations WHERE client = $1 AND parked AND state = 'queued'", string(owner)),
	}
}

// served is when each owner's succeeded operations finished, in order.
func (b *bundle) served() map[space.ClientID][]time.Time {
	b.t.Helper()
	rows, err := b.db.Query(b.ctx, "SELECT client, finished_at FROM operations WHERE state = 'succeeded' ORDER BY finished_at")
	if err != nil {
		b.t.Fatal(err)
	}
	defer rows.Close()
	out := map[space.ClientID][]time.Time{}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			b.t.Fatal(err)
		}
		out[space.ClientID(id)] = append(out[space.ClientID(id)], at)
	}
	if err := rows.Err(); err != nil {
		b.t.Fatal(err)
	}
	return out
}

// jain is Jain's fairness index of xs: 1 when all are equal, 1/len(xs) when one has all.
func jain(xs []float64) float64 {
	var sum, squares float64
	for _, x := range xs {
		sum += x
		squares += x * x
	}
	if squares == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * squares)
}
