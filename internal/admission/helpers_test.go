package admission

import (
	"context"
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// testTimeout is the per-call timeout of tests that are not about timeouts: generous,
// because a fail-open admit caused by a slow shared machine would look like a wrong
// count. Those tests also fail closed, so that a script error surfaces as an error.
const testTimeout = 5 * time.Second

// neverRefills is a refill rate so small that no token comes back during a test.
const neverRefills = 1e-9

// bundle is an Admitter on a real Redis with its own key prefix and registry.
type bundle struct {
	t      *testing.T
	ctx    context.Context
	rdb    redis.UniversalClient
	prefix string
	reg    *prometheus.Registry
	adm    *Admitter
}

// setup builds an Admitter on rdb. Unset options get test defaults: a fresh prefix,
// enabled, fail closed, testTimeout, a cluster bucket of 100 that never refills.
func setup(t *testing.T, rdb redis.UniversalClient, opts Options) *bundle {
	t.Helper()
	b := &bundle{t: t, ctx: testenv.Context(t), rdb: rdb, prefix: opts.Prefix, reg: prometheus.NewRegistry()}
	if b.prefix == "" {
		b.prefix = testenv.Prefix(t)
	}
	opts.Redis, opts.Prefix, opts.Registerer = rdb, b.prefix, b.reg
	if opts.Cluster == (space.Rate{}) {
		opts.Cluster = space.Rate{RefillRPS: neverRefills, Burst: 100}
	}
	if opts.Timeout == 0 {
		opts.Timeout = testTimeout
	}
	adm, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	b.adm = adm
	return b
}

// privateRedis starts a redis-server of the test's own (one it may stop, pause or
// flush) and a client of it, closed when the test ends.
func privateRedis(t *testing.T) (*testenv.RedisServer, *redis.Client) {
	t.Helper()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	return srv, rdb
}

// enabled is the Options of most tests: admission on, failing closed.
func enabled(cluster space.Rate) Options {
	return Options{Enabled: true, FailClosed: true, Cluster: cluster, RefusalMaxAge: time.Hour, BatchAbove: DefaultBatchAbove}
}

func rate(rps float64, burst int64) *space.Rate { return &space.Rate{RefillRPS: rps, Burst: burst} }

// admit admits and fails the test on an error or a fail-open decision.
func (b *bundle) admit(client space.ClientKey, r *space.Rate) Decision {
	b.t.Helper()
	d, err := b.adm.admit(b.ctx, client, r)
	if err != nil {
		b.t.Fatalf("Admit(%q): %v", client, err)
	}
	if d.FailedOpen {
		b.t.Fatalf("Admit(%q) failed open", client)
	}
	return d
}

// drain admits until the first rejection and returns how many were admitted.
func (b *bundle) drain(client space.ClientKey, r *space.Rate) (int, Decision) {
	b.t.Helper()
	for n := 0; n < 10000; n++ {
		if d := b.admit(client, r); !d.Admitted {
			return n, d
		}
	}
	b.t.Fatal("the bucket never ran dry")
	return 0, Decision{}
}

func (b *bundle) clusterKey() string                      { return ClusterKey(b.prefix) }
func (b *bundle) clientKey(client space.ClientKey) string { return ClientKey(b.prefix, client) }

// stored is a bucket's state as it is in Redis: its tokens and the Redis time they
// were counted at; exists is false when there is no key (a full bucket).
type stored struct {
	exists bool
	raw    string
	tokens float64
	micros float64
	// expires is when the script last set the key to expire (microseconds); full is
	// the bucket's F, when it is full (model rule 1); fourth is a client key's soft
	// tokens (1e300: none) or a reserve's idle time, 0 for a bucket.
	expires, full, fourth float64
}

func (b *bundle) stored(key string) stored {
	b.t.Helper()
	return readStored(b.t, b.ctx, b.rdb, key)
}

// readStored decodes the script's state: little-endian doubles, tokens, the Redis time
// they were counted at and the key's expiry, both in microseconds, then F for a bucket
// (32 bytes), or a fourth double and F for a client key or a reserve (40 bytes).
func readStored(t *testing.T, ctx context.Context, rdb redis.UniversalClient, key string) stored {
	t.Helper()
	raw, err := rdb.Get(ctx, key).Result()
	if err == redis.Nil {
		return stored{}
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	at := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[8*i : 8*i+8]))) }
	s := stored{exists: true, raw: raw}
	switch len(raw) {
	case 32:
		s.full = at(3)
	case 40:
		s.fourth, s.full = at(3), at(4)
	default:
		t.Fatalf("GET %s = %q, not 32 or 40 bytes of state", key, raw)
	}
	s.tokens, s.micros, s.expires = at(0), at(1), at(2)
	return s
}

// writeStored sets a bucket's state as the script would have written it, expiring in
// ttl, with F at the expiry (a bucket full no sooner than its key vanishes): 32 bytes
// for a bucket, 40 for a client key (no soft tokens yet) or a reserve (never asked).
func (b *bundle) writeStored(key string, tokens float64, at time.Time, ttl time.Duration) {
	b.t.Helper()
	expires := float64(at.Add(ttl).UnixMicro())
	doubles := []float64{tokens, float64(at.UnixMicro()), expires, expires}
	switch {
	case strings.Contains(key, ":client:"):
		doubles = []float64{tokens, float64(at.UnixMicro()), expires, 1e300, expires}
	case strings.Contains(key, ":tier:"):
		doubles = []float64{tokens, float64(at.UnixMicro()), expires, math.Inf(-1), expires}
	}
	raw := make([]byte, 0, 8*len(doubles))
	for _, d := range doubles {
		raw = binary.LittleEndian.AppendUint64(raw, math.Float64bits(d))
	}
	if err := b.rdb.Set(b.ctx, key, string(raw), ttl).Err(); err != nil {
		b.t.Fatalf("SET %s: %v", key, err)
	}
}

// redisTime is the server's clock, the one the script reads.
func (b *bundle) redisTime() time.Time {
	b.t.Helper()
	now, err := b.rdb.Time(b.ctx).Result()
	if err != nil {
		b.t.Fatalf("TIME: %v", err)
	}
	return now
}

// pttl is the key's remaining time to live.
func (b *bundle) pttl(key string) time.Duration {
	b.t.Helper()
	d, err := b.rdb.PTTL(b.ctx, key).Result()
	if err != nil {
		b.t.Fatalf("PTTL %s: %v", key, err)
	}
	return d
}

// metricValue reads a counter's or a gauge's value, or a histogram's sample count, from reg by name and
// labels; 0 when the series does not exist.
func metricValue(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !hasLabels(m, want) {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	got := map[string]string{}
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// decisions reads space_sandbox_admission_rate_decisions_total{decision, bucket}.
func (b *bundle) decisions(decision string, bucket space.Bucket) float64 {
	b.t.Helper()
	return metricValue(b.t, b.reg, "space_sandbox_admission_rate_decisions_total", "decision", decision, "bucket", string(bucket))
}

// near reports whether a and b differ by less than eps.
func near(a, b, eps float64) bool { return math.Abs(a-b) < eps }

// charge is a Charge of cost by client on r, as the activation flow makes one.
func (b *bundle) charge(client space.ClientKey, r *space.Rate, cost int) error {
	_, err := b.adm.Charge(b.ctx, space.Charge{Key: client, Rate: r, Cost: cost})
	return err
}

// refusal is a create asking a's refusal cache for c that ends there: what it is let
// through with is given back at once.
func refusal(a *Admitter, c space.Charge) *space.LimitError {
	h, le := a.CachedRefusal(c)
	if h != nil {
		h.Release()
	}
	return le
}

// onItsWay is a create asking a's refusal cache for c that goes on to its charge: what
// it is let through with stays held until the test ends.
func onItsWay(t *testing.T, a *Admitter, c space.Charge) *space.LimitError {
	h, le := a.CachedRefusal(c)
	if h != nil {
		t.Cleanup(h.Release)
	}
	return le
}

// clocked is opts on a replica clock the test moves, and the clock.
func clocked(opts Options) (Options, *testenv.Clock) {
	c := testenv.NewClock(time.Unix(1_000_000, 0))
	opts.Now = c.Now
	return opts, c
}

// admit decides one activation of cost 1 and returns the whole Decision: one token
// from the cluster bucket and, when clientRate is not nil, one from client's bucket,
// both or neither. The product charges through Charge; the tests read decisions.
func (a *Admitter) admit(ctx context.Context, client space.ClientKey, clientRate *space.Rate) (Decision, error) {
	return a.decide(ctx, space.Charge{Key: client, Rate: clientRate, Cost: 1}, take)
}

// peekOne reports the buckets as a charge of one token would find them now, taking
// nothing (Report without the enforcement).
func (a *Admitter) peekOne(ctx context.Context, client space.ClientKey, clientRate *space.Rate) (Decision, error) {
	return a.peek(ctx, space.Charge{Key: client, Rate: clientRate, Cost: 1})
}
