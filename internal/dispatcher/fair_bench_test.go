package dispatcher_test

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/testenv"
)

// BenchmarkFairQueue measures the queue's fairness from outside the dispatcher, on
// real Postgres and Redis with the default workers and lanes (make bench reports it):
//
//   - second-op-s: one owner has a thousand creates queued behind its bucket (20/s);
//     another, with the same rate, queues one: how long until it has succeeded;
//   - fifth-in-unknown-s: the same with five owners off the allowlist, who share the
//     bucket of unknown: four with 250 queued each, then the fifth's one;
//   - job-updates/s and backlog-served/s: what that snoozed backlog costs River per
//     second (a fetch and an outcome per run, one update per move into a lane) and how
//     fast it drains, over a three-second window;
//   - quiet-p99-ms, loaded-p99-ms and p99-ratio: the p99 queue wait (accepted to
//     succeeded) of a well-behaved owner queueing 10/s, alone and beside the flood.
func BenchmarkFairQueue(b *testing.B) {
	rate := space.Rate{RefillRPS: 20, Burst: 20}
	for range b.N {
		// A thousand, then one.
		f := setup(b, setupOptions{workers: -1})
		f.limits.set("flood", &rate, 0)
		f.limits.set("quiet", &rate, 0)
		f.enqueueMany(map[space.ClientID]int{"flood": 1000})
		f.dispatcher(setupOptions{workers: 10})
		time.Sleep(2 * time.Second) // the burst spent: the backlog is snoozing
		u0, s0 := f.queueCost("flood")
		time.Sleep(3 * time.Second)
		u1, s1 := f.queueCost("flood")
		start := time.Now()
		op, _, err := f.enqueueCreate("quiet", sandbox.CreateRequest{Shape: python})
		if err != nil {
			b.Fatal(err)
		}
		f.waitDone(op.ID)
		b.ReportMetric(time.Since(start).Seconds(), "second-op-s")
		b.ReportMetric(float64(u1-u0)/3, "job-updates/s")
		b.ReportMetric(float64(s1-s0)/3, "backlog-served/s")

		// Five owners off the allowlist, sharing the bucket of unknown: four with 250
		// queued each, then the fifth's one.
		u := setup(b, setupOptions{workers: -1})
		backlog := map[space.ClientID]int{}
		for i := range 5 {
			id := space.ClientID(fmt.Sprintf("agent-%d", i))
			u.limits.mu.Lock()
			u.limits.m[id] = space.Caller{ID: id, Key: space.Unknown, ClientRate: &rate}
			u.limits.mu.Unlock()
			if i < 4 {
				backlog[id] = 250
			}
		}
		u.enqueueMany(backlog)
		u.dispatcher(setupOptions{workers: 10})
		time.Sleep(2 * time.Second)
		start = time.Now()
		if op, _, err = u.enqueueCreate("agent-4", sandbox.CreateRequest{Shape: python}); err != nil {
			b.Fatal(err)
		}
		u.waitDone(op.ID)
		b.ReportMetric(time.Since(start).Seconds(), "fifth-in-unknown-s")

		quiet := f.paced("quiet", 40, 100*time.Millisecond)
		alone := setup(b, setupOptions{})
		alone.limits.set("quiet", &rate, 0)
		unloaded := alone.paced("quiet", 40, 100*time.Millisecond)
		b.ReportMetric(float64(unloaded.Milliseconds()), "quiet-p99-ms")
		b.ReportMetric(float64(quiet.Milliseconds()), "loaded-p99-ms")
		b.ReportMetric(float64(quiet)/float64(unloaded), "p99-ratio")
	}
}

// queueCost is the River job updates owner's operations have cost so far (each run
// is a fetch and an outcome; each move into a lane one more) and how many succeeded.
func (b *bundle) queueCost(owner space.ClientID) (updates, served int) {
	b.t.Helper()
	var snoozes, done, moved int
	if err := b.db.QueryRow(b.ctx, `SELECT coalesce(sum(snoozes), 0), count(*) FILTER (WHERE state = 'succeeded'),
			count(*) FILTER (WHERE NOT parked)
		FROM operations WHERE client = $1`, string(owner)).Scan(&snoozes, &done, &moved); err != nil {
		b.t.Fatal(err)
	}
	return 2*(snoozes+done) + moved, done
}

// paced queues n creates of owner, one every gap, and returns the p99 of their waits
// from accepted to succeeded.
func (b *bundle) paced(owner space.ClientID, n int, gap time.Duration) time.Duration {
	b.t.Helper()
	var ids []string
	for range n {
		op, _, err := b.enqueueCreate(owner, sandbox.CreateRequest{Shape: python})
		if err != nil {
			b.t.Fatal(err)
		}
		ids = append(ids, op.ID)
		time.Sleep(gap)
	}
	testenv.Eventually(b.t, time.Minute, fmt.Sprintf("%s's %d creates to succeed", owner, n), func() bool {
		return b.count("SELECT count(*) FROM operations WHERE id = ANY($1) AND state = 'succeeded'", ids) == n
	})
	rows, err := b.db.Query(b.ctx, "SELECT extract(epoch FROM finished_at - created_at)::float8 FROM operations WHERE id = ANY($1)", ids)
	if err != nil {
		b.t.Fatal(err)
	}
	defer rows.Close()
	var waits []time.Duration
	for rows.Next() {
		var s float64
		if err := rows.Scan(&s); err != nil {
			b.t.Fatal(err)
		}
		waits = append(waits, time.Duration(s*float64(time.Second)))
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	return waits[min(len(waits)-1, len(waits)*99/100)]
}
