package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

// topologies runs test on the standalone Redis and on the 3-node cluster, in parallel.
func topologies(t *testing.T, test func(t *testing.T, rdb redis.UniversalClient)) {
	t.Helper()
	eachTopology(t, func(t *testing.T, dial func(testing.TB) redis.UniversalClient) { test(t, dial(t)) })
}

// eachTopology is topologies for a test that dials more than one connection (two
// replicas): it is handed the topology's dialer.
func eachTopology(t *testing.T, test func(t *testing.T, dial func(testing.TB) redis.UniversalClient)) {
	t.Helper()
	for _, topo := range []struct {
		name string
		dial func(testing.TB) redis.UniversalClient
	}{{"standalone", testenv.Redis}, {"cluster", testenv.RedisCluster}} {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			test(t, topo.dial)
		})
	}
}

// cuttableDial reaches the shared test Redis through proxies a test can cut.
type cuttableDial = func(testing.TB) *testenv.CuttableRedis

// cuttable runs test as subtest name on the standalone Redis and on the 3-node
// cluster, each reached through proxies it can cut, in parallel.
func cuttable(t *testing.T, name string, test func(t *testing.T, dial cuttableDial)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		t.Parallel()
		for _, topo := range testenv.CuttableTopologies {
			t.Run(topo.Name, func(t *testing.T) {
				t.Parallel()
				test(t, topo.Dial)
			})
		}
	})
}

func TestBothBucketsOrNeither(t *testing.T) {
	t.Parallel()

	t.Run("an empty client bucket takes no cluster token", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: neverRefills, Burst: 100}))
			acme := rate(neverRefills, 2)
			if n, _ := b.drain("acme", acme); n != 2 {
				t.Fatalf("acme admitted %d, want its burst 2", n)
			}
			cluster, client := b.stored(b.clusterKey()), b.stored(b.clientKey("acme"))
			if !near(cluster.tokens, 98, 1e-3) || !near(client.tokens, 0, 1e-3) {
				t.Fatalf("before: cluster %v, client %v tokens; want 98 and 0", cluster.tokens, client.tokens)
			}

			d := b.admit("acme", acme)

			if d.Admitted || d.Bucket != space.BucketClientActivation {
				t.Fatalf("decision = %+v, want rejected by client_activation", d)
			}
			if after := b.stored(b.clusterKey()); after != cluster {
				t.Fatalf("the cluster key changed from %q to %q: a token was taken for a rejected activation", cluster.raw, after.raw)
			}
			if after := b.stored(b.clientKey("acme")); after != client {
				t.Fatalf("the client key changed from %q to %q", client.raw, after.raw)
			}
			if !near(d.Cluster.Remaining, 98, 1e-3) {
				t.Fatalf("decision reports %v cluster tokens, want 98", d.Cluster.Remaining)
			}
		})
	})

	t.Run("an empty cluster bucket takes no client token", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: neverRefills, Burst: 2}))
			clientRate := rate(neverRefills, 10)
			if n, _ := b.drain("acme", clientRate); n != 2 {
				t.Fatalf("admitted %d, want the cluster burst 2", n)
			}
			acme := b.stored(b.clientKey("acme"))
			if !near(acme.tokens, 8, 1e-3) {
				t.Fatalf("acme holds %v tokens, want 8", acme.tokens)
			}
			cluster := b.stored(b.clusterKey())

			for _, client := range []space.ClientKey{"acme", "globex"} {
				d := b.admit(client, clientRate)
				if d.Admitted || d.Bucket != space.BucketClusterActivation {
					t.Fatalf("%s: decision = %+v, want rejected by cluster_activation", client, d)
				}
			}

			if after := b.stored(b.clientKey("acme")); after != acme {
				t.Fatalf("acme's key changed from %q to %q: a client token was taken for a rejected activation", acme.raw, after.raw)
			}
			if globex := b.stored(b.clientKey("globex")); globex.exists {
				t.Fatalf("globex's bucket was written (%q) by a rejected activation", globex.raw)
			}
			if after := b.stored(b.clusterKey()); after != cluster {
				t.Fatalf("the cluster key changed from %q to %q", cluster.raw, after.raw)
			}
		})
	})

	t.Run("both empty names the client bucket", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: neverRefills, Burst: 1}))
			acme := rate(neverRefills, 1)
			b.admit("acme", acme)
			cluster, client := b.stored(b.clusterKey()), b.stored(b.clientKey("acme"))

			d := b.admit("acme", acme)

			if d.Admitted || d.Bucket != space.BucketClientActivation {
				t.Fatalf("decision = %+v, want rejected by client_activation", d)
			}
			if b.stored(b.clusterKey()) != cluster || b.stored(b.clientKey("acme")) != client {
				t.Fatal("a rejected activation wrote a bucket")
			}
		})
	})
}

func TestDecision(t *testing.T) {
	t.Parallel()

	t.Run("a new bucket starts full", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: neverRefills, Burst: 5}))
		d := b.admit("acme", rate(neverRefills, 3))
		if !d.Admitted || !near(d.Cluster.Remaining, 4, 1e-6) || !near(d.Client.Remaining, 2, 1e-6) {
			t.Fatalf("first decision = %+v (client %+v), want admitted with 4 and 2 left", d, d.Client)
		}
	})

	t.Run("without a client rate only the cluster key is charged", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: neverRefills, Burst: 5}))
		d := b.admit("", nil)
		if !d.Admitted || d.Client != nil || !near(d.Cluster.Remaining, 4, 1e-6) {
			t.Fatalf("decision = %+v, want admitted, no client state, 4 cluster tokens left", d)
		}
		keys, err := b.rdb.Keys(b.ctx, "*"+b.prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 1 || keys[0] != b.clusterKey() {
			t.Fatalf("keys written: %v, want only %s", keys, b.clusterKey())
		}
	})

	t.Run("an exempt client is charged on the cluster bucket alone", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: neverRefills, Burst: 3}))
		if n, d := b.drain("globex", nil); n != 3 || d.Bucket != space.BucketClusterActivation {
			t.Fatalf("admitted %d then %+v, want 3 then a cluster_activation rejection", n, d)
		}
		if s := b.stored(b.clientKey("globex")); s.exists {
			t.Fatalf("an exempt client got a bucket: %q", s.raw)
		}
	})

	t.Run("retry after is the refill of the empty bucket that refills last", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name                string
			clusterRPS, client  float64
			clusterBurst, burst int64
			bucket              space.Bucket
			want                time.Duration
		}{
			{"cluster refills last", 0.001, 0.01, 1, 1, space.BucketClientActivation, 1000 * time.Second},
			{"client refills last", 0.01, 0.001, 1, 1, space.BucketClientActivation, 1000 * time.Second},
			{"only the cluster is empty", 0.01, 0.001, 1, 5, space.BucketClusterActivation, 100 * time.Second},
			{"only the client is empty", 0.001, 0.01, 5, 1, space.BucketClientActivation, 100 * time.Second},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: tc.clusterRPS, Burst: tc.clusterBurst}))
				clientRate := rate(tc.client, tc.burst)
				b.admit("acme", clientRate)
				d := b.admit("acme", clientRate)
				if d.Admitted || d.Bucket != tc.bucket {
					t.Fatalf("decision = %+v, want rejected by %s", d, tc.bucket)
				}
				// The refill is counted from the first admit; a little time has passed.
				if d.RetryAfter > tc.want || d.RetryAfter < tc.want-5*time.Second {
					t.Fatalf("RetryAfter = %v, want just under %v", d.RetryAfter, tc.want)
				}
			})
		}
	})

	t.Run("a rejection turns into the limit error of its bucket", func(t *testing.T) {
		t.Parallel()
		cluster := space.Rate{RefillRPS: 0.5, Burst: 1}
		b := setup(t, testenv.Redis(t), enabled(cluster))
		acme := rate(0.25, 1)
		if le := b.admit("acme", acme).LimitError("acme"); le != nil {
			t.Fatalf("an admitted decision gave a limit error: %v", le)
		}
		d := b.admit("acme", acme)
		le := d.LimitError("acme")
		if le == nil || le.Bucket != space.BucketClientActivation || le.Client != "acme" || *le.Limit != *acme ||
			le.RetryAfter != d.RetryAfter || le.Remaining != d.Client.Remaining || le.Remaining >= 1 {
			t.Fatalf("limit error = %+v, want client_activation of acme with its rate, retry and remaining (%+v)", le, d)
		}
		if space.ErrorCode(le) != space.ELIMITED {
			t.Fatalf("code = %q, want %q", space.ErrorCode(le), space.ELIMITED)
		}

		d = b.admit("globex", acme)
		le = d.LimitError("globex")
		if le == nil || le.Bucket != space.BucketClusterActivation || *le.Limit != cluster || le.Remaining != d.Cluster.Remaining {
			t.Fatalf("limit error = %+v, want cluster_activation with the cluster rate", le)
		}
	})

	t.Run("peek takes nothing and writes nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: neverRefills, Burst: 3}))
		acme := rate(neverRefills, 1)

		d, err := b.adm.peekOne(b.ctx, "acme", acme)
		if err != nil || !d.Admitted || d.Cluster.Remaining != 3 || d.Client.Remaining != 1 {
			t.Fatalf("Peek on new buckets = %+v, %v; want admissible, full", d, err)
		}
		if s := b.stored(b.clusterKey()); s.exists {
			t.Fatalf("Peek wrote the cluster key: %q", s.raw)
		}
		b.admit("acme", acme)
		before := b.stored(b.clientKey("acme"))
		d, err = b.adm.peekOne(b.ctx, "acme", acme)
		if err != nil || d.Admitted || d.Bucket != space.BucketClientActivation || !near(d.Cluster.Remaining, 2, 1e-6) {
			t.Fatalf("Peek on an empty client = %+v, %v; want not admissible, client_activation, 2 cluster tokens", d, err)
		}
		if after := b.stored(b.clientKey("acme")); after != before {
			t.Fatalf("Peek changed the client key from %q to %q", before.raw, after.raw)
		}
		if n := b.decisions(decisionRejected, space.BucketClientActivation); n != 0 {
			t.Fatalf("Peek was counted as a rejection (%v)", n)
		}
	})

	t.Run("a client rate without a client key is refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: 1, Burst: 1}))
		if _, err := b.adm.admit(b.ctx, "", rate(1, 1)); err == nil {
			t.Fatal("Admit with a rate for client \"\" succeeded")
		}
		if _, err := b.adm.admit(b.ctx, "acme", rate(-1, 1)); err == nil {
			t.Fatal("Admit with a negative client rate succeeded")
		}
	})

	t.Run("new refuses what it cannot work with", func(t *testing.T) {
		t.Parallel()
		rdb := testenv.Redis(t)
		for name, opts := range map[string]Options{
			"no redis":            {Enabled: true, Cluster: space.Rate{RefillRPS: 1, Burst: 1}},
			"a prefix with brace": {Redis: rdb, Prefix: "a{b}", Enabled: true, Cluster: space.Rate{RefillRPS: 1, Burst: 1}},
			"a burst of zero":     {Redis: rdb, Enabled: true, Cluster: space.Rate{RefillRPS: 1}},
			"a negative rate":     {Redis: rdb, Enabled: true, Cluster: space.Rate{RefillRPS: -1, Burst: 1}},
		} {
			if _, err := New(opts); err == nil {
				t.Errorf("%s: New succeeded", name)
			}
		}
		for field, opts := range map[string]Options{
			"Prefix":  {Redis: rdb, Timeout: testTimeout},
			"Timeout": {Redis: rdb, Prefix: testenv.Prefix(t)},
		} {
			if _, err := New(opts); err == nil || !strings.Contains(err.Error(), field) {
				t.Errorf("New without %s = %v, want an error naming it", field, err)
			}
		}
		if a, err := New(Options{Redis: rdb, Prefix: testenv.Prefix(t), Timeout: testTimeout}); err != nil || a.Enabled() {
			t.Fatalf("a disabled Admitter without a rate: %v, enabled %v", err, a != nil && a.Enabled())
		}
	})

	t.Run("the default prefix gives the keys of the design", func(t *testing.T) {
		t.Parallel()
		prefix := config.Default().Redis.KeyPrefix
		if got := ClusterKey(prefix); got != "space:cluster_admission:sandbox_activation" {
			t.Fatalf("cluster key %q", got)
		}
		if got := ClientKey(prefix, "acme"); got != "{space:cluster_admission:sandbox_activation}:client:acme" {
			t.Fatalf("client key %q", got)
		}
		a, err := New(Options{Redis: testenv.Redis(t), Prefix: prefix, Timeout: testTimeout, Enabled: true, Cluster: space.Rate{RefillRPS: 1, Burst: 1}})
		if err != nil || a.clusterKey != ClusterKey(prefix) || a.clientPrefix+"acme" != ClientKey(prefix, "acme") {
			t.Fatalf("New with the default prefix: %v, keys %q %q", err, a.clusterKey, a.clientPrefix)
		}
		if a.ClusterRate() != (space.Rate{RefillRPS: 1, Burst: 1}) {
			t.Fatalf("ClusterRate = %+v", a.ClusterRate())
		}
	})
}

func TestModes(t *testing.T) {
	t.Parallel()

	t.Run("disabled admission admits and charges nothing without calling redis", func(t *testing.T) {
		t.Parallel()
		// A server that never answers: a Redis call would fail the decision or hang.
		rdb := redis.NewClient(&redis.Options{Addr: testenv.Blackhole(t)})
		t.Cleanup(func() { rdb.Close() })
		b := setup(t, rdb, Options{Enabled: false, Cluster: space.Rate{RefillRPS: 1, Burst: 7}, Timeout: time.Second})
		start := time.Now()
		d, err := b.adm.admit(b.ctx, "acme", rate(1, 2))
		if err != nil || !d.Admitted || d.FailedOpen || d.Cluster.Remaining != 7 || d.Client.Remaining != 2 {
			t.Fatalf("disabled Admit = %+v, %v; want admitted with full buckets", d, err)
		}
		if _, err := b.adm.peekOne(b.ctx, "acme", rate(1, 2)); err != nil {
			t.Fatalf("disabled Peek: %v", err)
		}
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Fatalf("disabled Admit took %v: it called Redis", took)
		}
		if b.adm.Enabled() {
			t.Fatal("Enabled() is true")
		}
		for _, dec := range []string{decisionAdmitted, decisionError} {
			if n := b.decisions(dec, space.BucketClusterActivation); n != 0 {
				t.Fatalf("a disabled decision was counted as %s", dec)
			}
		}
	})

	t.Run("shadow mode admits a rejection and counts it as shadow_rejected", func(t *testing.T) {
		t.Parallel()
		opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: 1})
		opts.Shadow = true
		b := setup(t, testenv.Redis(t), opts)
		acme := rate(neverRefills, 5)
		b.admit("acme", acme)
		before := b.stored(b.clientKey("acme"))

		d := b.admit("acme", acme)

		if !d.Admitted || !d.Shadow || d.Bucket != space.BucketClusterActivation || d.RetryAfter <= 0 {
			t.Fatalf("shadow decision = %+v, want admitted, shadow, cluster_activation, a retry", d)
		}
		if d.LimitError("acme") != nil {
			t.Fatal("a shadow-admitted decision gave a limit error")
		}
		if after := b.stored(b.clientKey("acme")); after != before {
			t.Fatal("a shadow rejection took a client token")
		}
		if n := b.decisions(decisionShadowRejected, space.BucketClusterActivation); n != 1 {
			t.Fatalf("shadow_rejected{cluster_activation} = %v, want 1", n)
		}
		if n := b.decisions(decisionRejected, space.BucketClusterActivation); n != 0 {
			t.Fatalf("rejected{cluster_activation} = %v, want 0", n)
		}
	})
}

func TestConcurrentConsumers(t *testing.T) {
	t.Parallel()

	// Client bursts sum to 16. Every goroutine keeps trying well past its client's
	// burst, so a decision that charged one bucket without the other would show.
	bursts := map[space.ClientKey]int64{"acme": 3, "globex": 5, "initech": 7, "umbrella": 1}

	// race runs 64 goroutines, each admitting attempts times for one client through
	// one of the admitters, and returns the admissions per client.
	race := func(t *testing.T, admitters []*bundle) map[space.ClientKey]int {
		t.Helper()
		clients := []space.ClientKey{"acme", "globex", "initech", "umbrella"}
		const goroutines, attempts = 64, 6
		var mu sync.Mutex
		admitted := map[space.ClientKey]int{}
		errs := make(chan error, goroutines)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range goroutines {
			b := admitters[g%len(admitters)]
			client := clients[g%len(clients)]
			r := rate(neverRefills, bursts[client])
			wg.Go(func() {
				<-start
				for range attempts {
					d, err := b.adm.admit(b.ctx, client, r)
					if err == nil && d.FailedOpen {
						err = errors.New("failed open")
					}
					if err != nil {
						errs <- err
						return
					}
					if d.Admitted {
						mu.Lock()
						admitted[client]++
						mu.Unlock()
					}
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("Admit: %v", err)
		}
		return admitted
	}

	// check reads the buckets back: the cluster bucket lost exactly one token per
	// admission, and so did each client bucket.
	check := func(t *testing.T, b *bundle, clusterBurst int64, admitted map[space.ClientKey]int) {
		t.Helper()
		total := 0
		for client, n := range admitted {
			total += n
			s := b.stored(b.clientKey(client))
			if want := float64(bursts[client]) - float64(n); !near(s.tokens, want, 1e-3) {
				t.Errorf("%s: bucket holds %v tokens after %d admissions, want %v", client, s.tokens, n, want)
			}
		}
		if s := b.stored(b.clusterKey()); !near(s.tokens, float64(clusterBurst)-float64(total), 1e-3) {
			t.Errorf("cluster bucket holds %v tokens after %d admissions, want %v", s.tokens, total, float64(clusterBurst)-float64(total))
		}
	}

	t.Run("64 goroutines admit exactly every client's burst and the cluster burst", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: neverRefills, Burst: 16}))
			admitted := race(t, []*bundle{b})
			total := 0
			for client, burst := range bursts {
				if admitted[client] != int(burst) {
					t.Errorf("%s admitted %d, want its burst %d", client, admitted[client], burst)
				}
				total += admitted[client]
			}
			if total != 16 {
				t.Errorf("admitted %d in total, want the cluster burst 16", total)
			}
			check(t, b, 16, admitted)
		})
	})

	t.Run("a cluster burst below the clients' sum charges both buckets or neither", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: neverRefills, Burst: 10}))
			admitted := race(t, []*bundle{b})
			total := 0
			for client, n := range admitted {
				if n > int(bursts[client]) {
					t.Errorf("%s admitted %d, over its burst %d", client, n, bursts[client])
				}
				total += n
			}
			if total != 10 {
				t.Errorf("admitted %d in total, want the cluster burst 10", total)
			}
			check(t, b, 10, admitted)
		})
	})

	t.Run("two replicas on two connections admit exactly the bursts", func(t *testing.T) {
		t.Parallel()
		eachTopology(t, func(t *testing.T, dial func(testing.TB) redis.UniversalClient) {
			one := setup(t, dial(t), enabled(space.Rate{RefillRPS: neverRefills, Burst: 16}))
			opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: 16})
			opts.Prefix = one.prefix
			two := setup(t, dial(t), opts)
			admitted := race(t, []*bundle{one, two})
			for client, burst := range bursts {
				if admitted[client] != int(burst) {
					t.Errorf("%s admitted %d, want its burst %d", client, admitted[client], burst)
				}
			}
			check(t, one, 16, admitted)
		})
	})
}

func TestRefill(t *testing.T) {
	t.Parallel()

	t.Run("after waiting for k tokens the k refilled are admitted and no more", func(t *testing.T) {
		t.Parallel()
		// 3 tokens/s, a wait for k+½ tokens. Each decision after it is checked against
		// the tokens refilled by its own Redis time, from the refusal that emptied the
		// bucket, less one a take, capped at the burst: a machine that stalls the drain
		// (make test-stress did, 167 ms and more) refills more, and the bucket admits
		// exactly what it refilled.
		const rps, burst, k = 3.0, 3, 2
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: 1000, Burst: 1000}))
		acme := rate(rps, burst)
		n, d := b.drain("acme", acme)
		if n != burst {
			t.Fatalf("drained %d, want the burst %d", n, burst)
		}
		left := d.Client.Remaining
		if want := time.Duration((1 - left) / rps * float64(time.Second)); d.Client.Refill < want-time.Millisecond || d.Client.Refill > want+time.Millisecond {
			t.Fatalf("client refill %v with %v tokens, want about %v", d.Client.Refill, left, want)
		}

		time.Sleep(time.Duration((k + 0.5 - left) / rps * float64(time.Second)))

		tokens, at, admitted := left, d.redisNow, 0
		for {
			d := b.admit("acme", acme)
			tokens = min(burst, tokens+rps*(d.redisNow-at)/1e6)
			at = d.redisNow
			if d.Admitted != (tokens >= 1) && !near(tokens, 1, 1e-6) {
				t.Fatalf("after %d admitted, admitted %v with %v tokens refilled", admitted, d.Admitted, tokens)
			}
			if d.Admitted {
				tokens--
				admitted++
			}
			if !near(d.Client.Remaining, tokens, 1e-6) {
				t.Fatalf("after %d admitted, %v left, want the %v refilled less one a take", admitted, d.Client.Remaining, tokens)
			}
			if !d.Admitted {
				break
			}
		}
		if admitted < k {
			t.Fatalf("admitted %d after waiting for %d tokens", admitted, k)
		}
	})

	t.Run("a stored bucket refills by the elapsed redis time", func(t *testing.T) {
		t.Parallel()
		// Empty 1.25 s ago by the server's clock, at 2 tokens/s: 2.5 tokens now, and
		// more by the time the drain ends (however slow the machine, read at the
		// Redis time of its refusal).
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: 1000, Burst: 1000}))
		at := b.redisTime().Add(-1250 * time.Millisecond)
		b.writeStored(b.clientKey("acme"), 0, at, time.Hour)
		n, d := b.drain("acme", rate(2, 10))
		refilled := 2 * (d.redisNow - float64(at.UnixMicro())) / 1e6
		if n < 2 || !near(d.Client.Remaining, refilled-float64(n), 1e-6) || d.Client.Remaining >= 1 {
			t.Fatalf("admitted %d, %v left; want the %v refilled since, less one a take, under 1", n, d.Client.Remaining, refilled)
		}
		if want := time.Duration((1 - d.Client.Remaining) / 2 * float64(time.Second)); d.Client.Refill < want-time.Millisecond || d.Client.Refill > want+time.Millisecond {
			t.Fatalf("refill %v with %v tokens, want %v", d.Client.Refill, d.Client.Remaining, want)
		}
	})

	t.Run("a clock that went backwards refills nothing", func(t *testing.T) {
		t.Parallel()
		// A state written an hour in the future, as after a failover to a server whose
		// clock is behind.
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: 1000, Burst: 2}))
		b.writeStored(b.clusterKey(), 0.5, b.redisTime().Add(time.Hour), 2*time.Hour)
		if n, d := b.drain("", nil); n != 0 || !near(d.Cluster.Remaining, 0.5, 1e-6) {
			t.Fatalf("admitted %d with %v tokens after the clock went back", n, d.Cluster.Remaining)
		}
	})

	t.Run("an unreadable stored value reads as a full bucket", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: neverRefills, Burst: 3}))
		if err := b.rdb.Set(b.ctx, b.clusterKey(), "3:1700000000000000", time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		if d := b.admit("", nil); !d.Admitted || d.Cluster.Remaining != 2 {
			t.Fatalf("decision = %+v, want admitted from a full bucket", d)
		}
	})

	t.Run("a lower burst caps a bucket that held more", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: 1000, Burst: 1000}))
		b.admit("acme", rate(neverRefills, 10)) // 9 left
		if d := b.admit("acme", rate(neverRefills, 3)); !d.Admitted || !near(d.Client.Remaining, 2, 1e-6) {
			t.Fatalf("decision = %+v (client %+v), want 2 left under the new burst 3", d, d.Client)
		}
	})

	t.Run("a bucket never holds more than its burst", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: 1e6, Burst: 3}))
		b.admit("", nil)
		time.Sleep(10 * time.Millisecond) // 10^4 tokens' worth of refill
		d, err := b.adm.peekOne(b.ctx, "", nil)
		if err != nil || d.Cluster.Remaining != 3 {
			t.Fatalf("Peek = %+v, %v; want 3 tokens", d, err)
		}
	})
}

// expiryMargin is what a script adds to every expiry it sets beyond the refill: two
// milliseconds, for Redis's clock of an expiry lagging TIME (bucket.lua says why).
const expiryMargin = 2 * time.Millisecond

func TestExpiry(t *testing.T) {
	t.Parallel()

	t.Run("a slow bucket outlives its refill", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: 1e-8, Burst: 1}))
			b.admit("acme", rate(1e-6, 4))
			// Burst 1 at 1e-8 tokens/s refills in 1e8 s.
			if ttl := b.pttl(b.clusterKey()); ttl > 1e8*time.Second+expiryMargin || ttl < 1e8*time.Second-time.Minute {
				t.Fatalf("cluster key PTTL = %v, want 1e8 s", ttl)
			}
			// A burst of 4 at 1e-6 tokens/s refills completely in 4e6 s.
			if ttl := b.pttl(b.clientKey("acme")); ttl > 4e6*time.Second+expiryMargin || ttl < 4e6*time.Second-time.Minute {
				t.Fatalf("client key PTTL = %v, want 4e6 s", ttl)
			}
			secs, err := b.rdb.TTL(b.ctx, b.clusterKey()).Result()
			if err != nil || secs > 1e8*time.Second+time.Second || secs < 1e8*time.Second-time.Minute {
				t.Fatalf("cluster key TTL = %v, %v; want 1e8 s", secs, err)
			}
		})
	})

	t.Run("an unbounded bucket is capped at 10^12 seconds", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: 1e-20, Burst: 2}))
			d := b.admit("acme", rate(0, 2))
			if !d.Admitted {
				t.Fatalf("first decision = %+v, want admitted", d)
			}
			const capped = 1e12 // seconds; beyond time.Duration, so compare in seconds
			for _, key := range []string{b.clusterKey(), b.clientKey("acme")} {
				ms, err := b.rdb.Do(b.ctx, "PTTL", key).Int64()
				if err != nil || float64(ms)/1000 > capped || float64(ms)/1000 < capped-60 {
					t.Fatalf("%s PTTL = %d ms, %v; want 10^12 s", key, ms, err)
				}
			}
		})
	})

	t.Run("a rate of zero works and never refills", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: 0, Burst: 2}))
		n, d := b.drain("acme", rate(0, 5))
		if n != 2 || d.Bucket != space.BucketClusterActivation {
			t.Fatalf("admitted %d then %+v, want 2 then a cluster_activation rejection", n, d)
		}
		if d.RetryAfter != time.Duration(math.MaxInt64) || d.Cluster.Refill != time.Duration(math.MaxInt64) {
			t.Fatalf("a bucket that never refills reports retry %v, refill %v; want the longest Duration", d.RetryAfter, d.Cluster.Refill)
		}
		if d.Client.Refill != 0 || !near(d.Client.Remaining, 3, 1e-9) {
			t.Fatalf("client state %+v, want 3 tokens and no wait", *d.Client)
		}
		if s := b.stored(b.clusterKey()); s.tokens != 0 {
			t.Fatalf("cluster bucket holds %v tokens", s.tokens)
		}
	})

	t.Run("a client rate of zero charges both buckets and never refills", func(t *testing.T) {
		t.Parallel()
		// The client key is written second: a failing expiry there would leave the
		// cluster bucket charged for an activation that returned an error.
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: 1, Burst: 100}))
		zero := rate(0, 1)
		if d := b.admit("acme", zero); !d.Admitted {
			t.Fatalf("first decision = %+v, want admitted", d)
		}
		if ttl := b.pttl(b.clusterKey()); ttl > 100*time.Second+expiryMargin || ttl < 99*time.Second {
			t.Fatalf("cluster key PTTL = %v, want 100 s", ttl)
		}
		if ms, err := b.rdb.Do(b.ctx, "PTTL", b.clientKey("acme")).Int64(); err != nil || ms < 1e15-60000 || ms > 1e15 {
			t.Fatalf("client key PTTL = %d ms, %v; want 10^12 s", ms, err)
		}
		d := b.admit("acme", zero)
		if d.Admitted || d.Bucket != space.BucketClientActivation || d.RetryAfter != time.Duration(math.MaxInt64) {
			t.Fatalf("second decision = %+v, want rejected by client_activation, never refilling", d)
		}
	})
}

func TestExpiryFollowsTheRateInForce(t *testing.T) {
	t.Parallel()

	t.Run("a refusal under a lowered rate extends an empty bucket's key to its new refill", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: 10, Burst: 10}))
			fast, slow := rate(10, 10), rate(0.001, 10)
			// At least the burst: a slow machine refills a token or two while it drains.
			if n, _ := b.drain("acme", fast); n < 10 {
				t.Fatalf("drained %d, want at least the burst of 10", n)
			}
			if ttl := b.pttl(b.clientKey("acme")); ttl > time.Second+expiryMargin {
				t.Fatalf("after the fast rate the key lives %v, want at most 1s and the margin", ttl)
			}
			if d := b.admit("acme", slow); d.Admitted {
				t.Fatalf("admitted at the lowered rate: %+v", d)
			}
			// Refilling the bucket's 10 tokens at 0.001/s from what it holds (a little
			// over 0: it refilled at the fast rate while the drain ran) takes nearly
			// 10,000 s; the key must outlive that, where the fast rate gave it 1s. It
			// is set, as every new expiry, to a whole refill (10,000 s) and the margin.
			s := b.stored(b.clientKey("acme"))
			need := time.Duration((10 - s.tokens) / 0.001 * float64(time.Second))
			if ttl := b.pttl(b.clientKey("acme")); s.tokens >= 1 || ttl < need || ttl > 10000*time.Second+expiryMargin {
				t.Fatalf("after a refusal at the lowered rate the key lives %v holding %v tokens, want at least the %v its refill takes", ttl, s.tokens, need)
			}
			if full := time.Duration((s.full - s.micros) * float64(time.Microsecond)); full < need-time.Millisecond || full > need+time.Millisecond {
				t.Fatalf("F is %v after the refusal, want the %v its refill takes", full, need)
			}
		})
	})

	t.Run("refusals at an unchanged rate write nothing", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: neverRefills, Burst: 100}))
			r := rate(0.5, 2)
			b.drain("acme", r)
			before := b.stored(b.clientKey("acme"))
			for range 5 {
				if d := b.admit("acme", r); d.Admitted {
					t.Fatal("admitted an empty bucket")
				}
				if d, err := b.adm.peekOne(b.ctx, "acme", r); err != nil || d.Admitted {
					t.Fatalf("peek = %+v, %v", d, err)
				}
			}
			if after := b.stored(b.clientKey("acme")); after.raw != before.raw {
				t.Fatalf("a refusal rewrote the key: %+v -> %+v", before, after)
			}
		})
	})

	t.Run("a bucket that never refills is not rewritten by every refusal", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: neverRefills, Burst: 100}))
		zero := rate(0, 1)
		b.admit("acme", zero)
		before := b.stored(b.clientKey("acme"))
		time.Sleep(2 * time.Millisecond) // a later Redis TIME, which a rewrite would record
		b.admit("acme", zero)
		if after := b.stored(b.clientKey("acme")); after.raw != before.raw {
			t.Fatalf("a refusal of a never-refilling bucket rewrote it: %+v -> %+v", before, after)
		}
	})

}

func TestFailure(t *testing.T) {
	t.Parallel()

	// outage is an Admitter on a Redis that is down in one of two ways.
	type outage struct {
		name string
		dial func(t *testing.T) redis.UniversalClient
	}
	outages := []outage{
		{"redis is stopped", func(t *testing.T) redis.UniversalClient {
			srv, rdb := privateRedis(t)
			if err := rdb.Ping(testenv.Context(t)).Err(); err != nil {
				t.Fatal(err)
			}
			srv.Stop()
			return rdb
		}},
		{"redis never answers", func(t *testing.T) redis.UniversalClient {
			rdb := redis.NewClient(&redis.Options{Addr: testenv.Blackhole(t)})
			t.Cleanup(func() { rdb.Close() })
			return rdb
		}},
		{"redis never answers a client with context deadlines", func(t *testing.T) redis.UniversalClient {
			rdb := redis.NewClient(&redis.Options{Addr: testenv.Blackhole(t), ContextTimeoutEnabled: true})
			t.Cleanup(func() { rdb.Close() })
			return rdb
		}},
	}
	const timeout = 50 * time.Millisecond
	// within is how long a failed call may take: the timeout and scheduling slack on a
	// busy machine, far below go-redis's own timeouts of seconds.
	const within = 750 * time.Millisecond

	for _, o := range outages {
		t.Run("fail open admits and counts an error when "+o.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, o.dial(t), Options{Enabled: true, Cluster: space.Rate{RefillRPS: 1, Burst: 1}, Timeout: timeout})
			start := time.Now()
			d, err := b.adm.admit(b.ctx, "acme", rate(1, 1))
			took := time.Since(start)
			if err != nil || !d.Admitted || !d.FailedOpen {
				t.Fatalf("Admit = %+v, %v; want admitted, failed open", d, err)
			}
			if took > within {
				t.Fatalf("Admit took %v with a %v timeout", took, timeout)
			}
			for _, bucket := range []space.Bucket{space.BucketClusterActivation, space.BucketClientActivation} {
				if n := b.decisions(decisionError, bucket); n != 1 {
					t.Fatalf("error{%s} = %v, want 1", bucket, n)
				}
			}
			if n := b.decisions(decisionAdmitted, space.BucketClusterActivation); n != 0 {
				t.Fatalf("a failed-open decision was counted as admitted")
			}
		})

		t.Run("fail closed rejects with ErrUnavailable when "+o.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, o.dial(t), Options{Enabled: true, FailClosed: true, Cluster: space.Rate{RefillRPS: 1, Burst: 1}, Timeout: timeout})
			start := time.Now()
			d, err := b.adm.admit(b.ctx, "", nil)
			took := time.Since(start)
			if !errors.Is(err, ErrUnavailable) || space.ErrorCode(err) != space.EUNAVAILABLE || d.Admitted {
				t.Fatalf("Admit = %+v, %v; want an ErrUnavailable with code %s", d, err, space.EUNAVAILABLE)
			}
			if took > within {
				t.Fatalf("Admit took %v with a %v timeout", took, timeout)
			}
			if n := b.decisions(decisionError, space.BucketClusterActivation); n != 1 {
				t.Fatalf("error{cluster_activation} = %v, want 1", n)
			}
			if _, err := b.adm.peekOne(b.ctx, "", nil); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("Peek = %v, want ErrUnavailable", err)
			}
		})
	}

	t.Run("shadow mode admits on a redis error even when failing closed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, outages[0].dial(t), Options{Enabled: true, FailClosed: true, Shadow: true, Cluster: space.Rate{RefillRPS: 1, Burst: 1}, Timeout: timeout})
		d, err := b.adm.admit(b.ctx, "acme", nil)
		if err != nil || !d.Admitted || !d.FailedOpen {
			t.Fatalf("Admit = %+v, %v; want admitted, failed open", d, err)
		}
	})

	t.Run("a cancelled caller fails like a timeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), Options{Enabled: true, FailClosed: true, Cluster: space.Rate{RefillRPS: 1, Burst: 1}})
		ctx, cancel := context.WithCancel(b.ctx)
		cancel()
		if _, err := b.adm.admit(ctx, "", nil); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Admit with a cancelled context = %v, want ErrUnavailable", err)
		}
	})
}

func TestScriptCache(t *testing.T) {
	t.Parallel()

	t.Run("noscript after script flush still decides correctly", func(t *testing.T) {
		t.Parallel()
		// A private server: flushing the shared one's scripts would only slow others
		// down, but its command statistics must be ours to read.
		_, rdb := privateRedis(t)
		b := setup(t, rdb, enabled(space.Rate{RefillRPS: neverRefills, Burst: 3}))
		acme := rate(neverRefills, 2)
		b.admit("acme", acme)
		if err := rdb.ScriptFlush(b.ctx).Err(); err != nil {
			t.Fatal(err)
		}
		evals := commandCalls(t, b, "eval")

		d := b.admit("acme", acme)
		if !d.Admitted || !near(d.Cluster.Remaining, 1, 1e-6) || !near(d.Client.Remaining, 0, 1e-6) {
			t.Fatalf("after SCRIPT FLUSH: %+v (client %+v), want admitted with 1 and 0 left", d, d.Client)
		}
		if d := b.admit("acme", acme); d.Admitted || d.Bucket != space.BucketClientActivation {
			t.Fatalf("third decision = %+v, want rejected by client_activation", d)
		}
		if got := commandCalls(t, b, "eval"); got != evals+1 {
			t.Fatalf("EVAL calls went from %d to %d: want one EVAL fallback after NOSCRIPT", evals, got)
		}
	})
}

func TestMetrics(t *testing.T) {
	t.Parallel()

	t.Run("decisions are counted per bucket as documented", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: neverRefills, Burst: 3}))
		acme := rate(neverRefills, 1)
		b.admit("acme", acme) // admitted: cluster and client
		b.admit("", nil)      // admitted: cluster alone
		b.admit("acme", acme) // rejected by the client bucket
		b.admit("globex", acme)
		b.admit("initech", acme) // rejected by the cluster bucket

		want := map[string]float64{
			"admitted/cluster_activation":        3,
			"admitted/client_activation":         2,
			"rejected/client_activation":         1,
			"rejected/cluster_activation":        1,
			"error/cluster_activation":           0,
			"error/client_activation":            0,
			"shadow_rejected/cluster_activation": 0,
			"shadow_rejected/client_activation":  0,
		}
		for series, n := range want {
			decision, bucket, _ := strings.Cut(series, "/")
			if got := b.decisions(decision, space.Bucket(bucket)); got != n {
				t.Errorf("decisions{decision=%q,bucket=%q} = %v, want %v", decision, bucket, got, n)
			}
		}
		if n := metricValue(t, b.reg, "space_sandbox_admission_script_seconds"); n != 5 {
			t.Errorf("script_seconds observed %v calls, want 5", n)
		}
		families, err := b.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() != "decision" && l.GetName() != "bucket" && l.GetName() != "tier" {
						t.Errorf("%s has a label %q", f.GetName(), l.GetName())
					}
				}
			}
		}
	})

	t.Run("two admitters on one registry share the series", func(t *testing.T) {
		t.Parallel()
		one := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: 1, Burst: 5}))
		two, err := New(Options{Redis: one.rdb, Prefix: one.prefix, Enabled: true, Cluster: space.Rate{RefillRPS: 1, Burst: 5}, Registerer: one.reg, Timeout: testTimeout})
		if err != nil {
			t.Fatalf("a second Admitter on the same registry: %v", err)
		}
		one.admit("", nil)
		if _, err := two.admit(one.ctx, "", nil); err != nil {
			t.Fatal(err)
		}
		if n := one.decisions(decisionAdmitted, space.BucketClusterActivation); n != 2 {
			t.Fatalf("admitted = %v, want 2", n)
		}
	})
}

// commandCalls reads the calls of one command from INFO commandstats.
func commandCalls(t *testing.T, b *bundle, command string) int {
	t.Helper()
	info, err := b.rdb.Info(b.ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":")
		if !ok {
			continue
		}
		var calls int
		if _, err := fmt.Sscanf(rest, "calls=%d,", &calls); err != nil {
			t.Fatalf("parse %q: %v", line, err)
		}
		return calls
	}
	return 0
}
