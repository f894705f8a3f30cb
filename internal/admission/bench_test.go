package admission

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// BenchmarkAdmission measures our decision on one private Redis:
//
//	go test -run '^$' -bench Admission -benchtime 2s ./internal/admission/
//
// Names are <implementation>/<path>/goroutines=<n>:
//
//   - space: Admit with a client rate, the two-bucket atomic decision (two keys), at
//     SPACE_REDIS_BATCH_ABOVE's default (DefaultBatchAbove): decisions that wait go
//     together as one batch script call;
//   - space_unbatched: the same with BatchAbove 0, every decision a call of its own;
//   - space_batch_above_2: the same batching above 2 in flight, the default before
//     it was 8 (docs/benchmarks.md, "Batches above eight");
//   - space_one_key: Admit without a client rate (the cluster key alone), batched.
//
// The peer library redis_rate (single-key GCRA) is measured beside these, in the same
// run and on the same private Redis, by the bench module's script and decisions
// scenarios (`BENCH_ARGS='-only script,decisions' make bench`): the product module
// carries no peer limiter.
//
// The allow path admits every call (a bucket too large to empty) and writes; the
// reject path rejects every call (an empty bucket that never refills) and writes
// nothing. Metrics: decisions/s from Go; redis-us/op, the Redis CPU per decision from
// INFO commandstats (cmdstat_evalsha usec over the decisions, the script and the
// commands it ran), counted from a CONFIG RESETSTAT on the private server, so nothing
// else pollutes it; and decisions/call, the decisions an EVALSHA carried (more than
// one when decisions waited together and went as one batch).
func BenchmarkAdmission(b *testing.B) {
	srv := testenv.StartRedis(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	b.Cleanup(func() { rdb.Close() })
	ctx := testenv.Context(b)

	big := space.Rate{RefillRPS: 1e6, Burst: 1e6}
	empty := space.Rate{RefillRPS: neverRefills, Burst: 1}
	newAdmitter := func(cluster space.Rate, batchAbove int) *Admitter {
		a, err := New(Options{Redis: rdb, Prefix: testenv.Prefix(b), Enabled: true, FailClosed: true, Cluster: cluster, Timeout: time.Second, BatchAbove: batchAbove})
		if err != nil {
			b.Fatal(err)
		}
		return a
	}
	// admitter returns a decide function whose every call takes the given path.
	admitter := func(withClient, allow bool, batchAbove int) func() (bool, error) {
		r := big
		if !allow {
			r = empty
		}
		a := newAdmitter(r, batchAbove)
		var clientRate *space.Rate
		if withClient {
			clientRate = &r
		}
		if !allow { // empty both buckets
			if _, err := a.admit(ctx, "acme", clientRate); err != nil {
				b.Fatal(err)
			}
		}
		return func() (bool, error) {
			d, err := a.admit(ctx, "acme", clientRate)
			return d.Admitted && !d.FailedOpen, err
		}
	}
	for _, path := range []string{"allow", "reject"} {
		allow := path == "allow"
		for _, goroutines := range []int{1, 8, 32} {
			for _, impl := range []struct {
				name   string
				decide func() (bool, error)
			}{
				{"space", admitter(true, allow, DefaultBatchAbove)},
				{"space_unbatched", admitter(true, allow, 0)},
				{"space_batch_above_2", admitter(true, allow, 2)},
				{"space_one_key", admitter(false, allow, DefaultBatchAbove)},
			} {
				b.Run(fmt.Sprintf("%s/%s/goroutines=%d", impl.name, path, goroutines), func(b *testing.B) {
					benchDecisions(b, ctx, rdb, goroutines, allow, impl.decide)
				})
			}
		}
	}
}

// benchDecisions runs decide b.N times on the given number of goroutines, checks that
// every decision took the expected path, and reports decisions/s and redis-us/op.
func benchDecisions(b *testing.B, ctx context.Context, rdb *redis.Client, goroutines int, allow bool, decide func() (bool, error)) {
	check := func(admitted bool, err error) {
		if err != nil {
			b.Fatal(err)
		}
		if admitted != allow {
			b.Fatalf("admitted = %v on the %v path", admitted, allow)
		}
	}
	check(decide()) // loads the script, so that the measured calls are all EVALSHA
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	if goroutines == 1 {
		for b.Loop() {
			check(decide())
		}
	} else {
		b.SetParallelism((goroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				admitted, err := decide()
				if err != nil || admitted != allow {
					b.Errorf("admitted = %v, err = %v on the allow=%v path", admitted, err, allow)
					return
				}
			}
		})
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	calls, usec := commandStat(b, ctx, rdb, "evalsha")
	if calls == 0 {
		b.Fatalf("EVALSHA never ran for %d decisions", b.N)
	}
	// Decisions that wait together go as one batch script call (coalescer): Redis's
	// time is per decision, and decisions/call says how many a call carried.
	b.ReportMetric(float64(usec)/float64(b.N), "redis-us/op")
	b.ReportMetric(float64(b.N)/float64(calls), "decisions/call")
}

// commandStat reads one command's calls and total microseconds from INFO
// commandstats.
func commandStat(b *testing.B, ctx context.Context, rdb *redis.Client, command string) (calls, usec int64) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":")
		if !ok {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			name, value, _ := strings.Cut(field, "=")
			switch name {
			case "calls":
				calls, _ = strconv.ParseInt(value, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(value, 10, 64)
			}
		}
	}
	return calls, usec
}
