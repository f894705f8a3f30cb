package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/config"
)

// KeysResult is the scale-with-keys scenario.
type KeysResult struct {
	// MemoryKeys idle client keys made by real decisions; BytesPerKey is the growth
	// of INFO memory used_memory divided by their number.
	MemoryKeys  int
	BytesPerKey float64
	// BytesPerKeyAtMax is the same for the largest key count, written by the
	// prepopulating Lua loop.
	BytesPerKeyAtMax float64
	// Counts are the distinct client keys of each decisions/s row; PerSec their
	// decisions/s per run (8 goroutines, each decision for a random one of the keys).
	Counts []int
	PerSec map[int][]float64
	// PeerPerSec is the same for redis_rate's Allow over as many keys of its own,
	// in the same databases: the control that tells Redis's own cost of a larger
	// keyspace from the decision's.
	PeerPerSec map[int][]float64
	Goroutines int
	Duration   time.Duration
	// Expiry: ExpiryKeys idle keys of a bucket that refills fully in ExpiryTTL;
	// DBSIZE right after the last write, and how long after it DBSIZE was back to
	// what it was before.
	ExpiryKeys      int
	ExpiryTTL       time.Duration
	ExpiryPeak      int64
	ExpiryBaseline  int64
	ExpiryGoneAfter time.Duration
}

// keysClientRate is every scale-test client's rate, and the cluster rate of their
// Admitters: a bucket no run can empty (so every decision of every key count takes
// the same path, the allow path, and writes), which refills completely in 1000 s, so
// that a key lives longer than the scenario. The cluster bucket takes every decision
// of every arm and run: a hundred million tokens are a few hundred runs at today's
// rates (a burst of a million emptied in the third run of the scale scenario's four
// arms once one key passed 65k decisions/s).
var keysClientRate = space.Rate{RefillRPS: 100_000, Burst: 100_000_000}

// peerKeysLimit is redis_rate's equivalent of keysClientRate.
var peerKeysLimit = redis_rate.Limit{Rate: 100_000, Burst: 100_000_000, Period: time.Second}

// runKeys measures, on a private redis-server with one logical database per key
// count (so the runs of every count can be interleaved): the memory of an idle
// client key, decisions/s against 10, 10k and 1M keys, and the expiry of idle keys.
func runKeys(ctx context.Context, env *Env, runs int, sz sizes) (*KeysResult, error) {
	dbs := len(sz.keyCounts) + 2
	srv, err := startRedis(ctx, env.Dir, "--databases", strconv.Itoa(dbs))
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	client := func(db int) *redis.Client {
		return redis.NewClient(&redis.Options{Addr: srv.Addr, DB: db, ContextTimeoutEnabled: true, ReadTimeout: 5 * time.Second})
	}
	res := &KeysResult{MemoryKeys: sz.memoryKeys, Counts: sz.keyCounts, PerSec: map[int][]float64{}, PeerPerSec: map[int][]float64{}, Goroutines: 8, Duration: sz.keysDur}

	// Memory: real decisions for memoryKeys distinct clients, on a database of their
	// own. used_memory is server-wide, and nothing else writes meanwhile.
	memDB := client(dbs - 1)
	defer memDB.Close()
	adm, err := newAdmitter(memDB, keysPrefix, keysClientRate)
	if err != nil {
		return nil, err
	}
	if _, err := charge1(ctx, adm, "warmup", &keysClientRate); err != nil { // loads the script, makes the cluster key
		return nil, err
	}
	before, err := infoInt(ctx, memDB, "memory", "used_memory")
	if err != nil {
		return nil, err
	}
	if err := admitEach(ctx, adm, "c", &keysClientRate, sz.memoryKeys, 8); err != nil {
		return nil, err
	}
	after, err := infoInt(ctx, memDB, "memory", "used_memory")
	if err != nil {
		return nil, err
	}
	res.BytesPerKey = float64(after-before) / float64(sz.memoryKeys)
	env.logf("keys: %.0f bytes per idle client key", res.BytesPerKey)

	// One database per key count, each holding that many idle client keys.
	clients := make([]*redis.Client, len(sz.keyCounts))
	admitters := make([]*admission.Admitter, len(sz.keyCounts))
	for i, n := range sz.keyCounts {
		clients[i] = client(i)
		defer clients[i].Close()
		if admitters[i], err = newAdmitter(clients[i], keysPrefix, keysClientRate); err != nil {
			return nil, err
		}
		before, err := infoInt(ctx, clients[i], "memory", "used_memory")
		if err != nil {
			return nil, err
		}
		if err := populate(ctx, clients[i], n); err != nil {
			return nil, err
		}
		if i == len(sz.keyCounts)-1 {
			after, err := infoInt(ctx, clients[i], "memory", "used_memory")
			if err != nil {
				return nil, err
			}
			// Ours and redis_rate's keys: the two kinds differ by a few bytes of
			// name and value, so this is the mean of both.
			res.BytesPerKeyAtMax = float64(after-before) / float64(2*n)
		}
		size, err := clients[i].DBSize(ctx).Result()
		if err != nil {
			return nil, fmt.Errorf("DBSIZE: %w", err)
		}
		if size < int64(2*n) {
			return nil, fmt.Errorf("database %d holds %d keys after populating %d", i, size, n)
		}
	}
	env.logf("keys: populated %v", sz.keyCounts)

	for range runs {
		for i, n := range sz.keyCounts {
			a := admitters[i]
			decide := func(ctx context.Context) (bool, error) {
				return charge1(ctx, a, space.ClientKey("c"+strconv.Itoa(rand.IntN(n))), &keysClientRate)
			}
			count, elapsed, _, err := decideFor(ctx, decide, res.Goroutines, sz.keysDur)
			if err != nil {
				return nil, fmt.Errorf("%d keys: %w", n, err)
			}
			res.PerSec[n] = append(res.PerSec[n], float64(count)/elapsed.Seconds())

			lim := redis_rate.NewLimiter(clients[i])
			peer := func(ctx context.Context) (bool, error) {
				r, err := lim.Allow(ctx, "c"+strconv.Itoa(rand.IntN(n)), peerKeysLimit)
				return err == nil && r.Allowed == 1, err
			}
			count, elapsed, _, err = decideFor(ctx, peer, res.Goroutines, sz.keysDur)
			if err != nil {
				return nil, fmt.Errorf("redis_rate, %d keys: %w", n, err)
			}
			res.PeerPerSec[n] = append(res.PeerPerSec[n], float64(count)/elapsed.Seconds())
		}
	}
	env.logf("keys: decisions/s done")

	if err := measureExpiry(ctx, client(dbs-2), res, sz.expiryKeys); err != nil {
		return nil, err
	}
	env.logf("keys: %d idle keys gone %s after their last write", res.ExpiryKeys, res.ExpiryGoneAfter)
	return res, nil
}

// admitEach makes one decision for each of n distinct clients (prefix0..prefix<n-1>) on g
// goroutines.
func admitEach(ctx context.Context, a *admission.Admitter, prefix string, rate *space.Rate, n, g int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, g)
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if _, err := charge1(ctx, a, space.ClientKey(prefix+strconv.FormatInt(i, 10)), rate); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// populateScript writes idle client buckets "<prefix>0".."<prefix>n-1" from ARGV[2] to
// ARGV[3], each with ARGV[1] as its state and ARGV[4] ms to live, inside Redis: a
// million keys in a few seconds rather than a million round trips.
var populateScript = redis.NewScript(`
for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
  redis.call('SET', KEYS[1] .. i, ARGV[1], 'PX', ARGV[4])
end
return 1`)

// populate writes n idle client buckets, full (burst tokens), in the state format of
// bucket.lua (three little-endian doubles: tokens, the Redis time and the key's expiry
// in µs), under the
// production client keys ("{space:cluster_admission:sandbox_activation}:client:c<i>"),
// expiring in ten minutes. The decisions then find real, full buckets.
// keysPrefix is the production key prefix, so that the keys measured are the
// ones space-api writes.
var keysPrefix = config.Default().Redis.KeyPrefix

func populate(ctx context.Context, rdb *redis.Client, n int) error {
	now, err := redisTime(ctx, rdb)
	if err != nil {
		return err
	}
	var state [24]byte
	binary.LittleEndian.PutUint64(state[:8], math.Float64bits(float64(keysClientRate.Burst)))
	binary.LittleEndian.PutUint64(state[8:16], math.Float64bits(float64(now.UnixMicro())))
	binary.LittleEndian.PutUint64(state[16:], math.Float64bits(float64(now.Add(10*time.Minute).UnixMicro())))
	const chunk = 100_000
	for _, k := range []struct{ prefix, state string }{
		{admission.ClientKey(keysPrefix, "c"), string(state[:])},
		// redis_rate's key holds its GCRA theoretical arrival time; 0 is "now".
		{"rate:c", "0"},
	} {
		for from := 0; from < n; from += chunk {
			to := min(from+chunk, n) - 1
			// The key is built inside the script; it is declared here so that a
			// cluster would route it (the private server is standalone).
			if err := populateScript.Run(ctx, rdb, []string{k.prefix}, k.state, from, to, 600_000).Err(); err != nil {
				return fmt.Errorf("populate %s %d..%d: %w", k.prefix, from, to, err)
			}
		}
	}
	return nil
}

// measureExpiry makes n idle client keys whose bucket refills fully in a short time
// (burst 1 at 1 token/s: 1 s, longer than making them takes), then polls DBSIZE until
// it is back to what it was before (the cluster key alone).
func measureExpiry(ctx context.Context, rdb *redis.Client, res *KeysResult, n int) error {
	defer rdb.Close()
	rate := space.Rate{RefillRPS: 1, Burst: 1}
	res.ExpiryKeys = n
	res.ExpiryTTL = time.Duration(float64(rate.Burst) / rate.RefillRPS * float64(time.Second))
	// The cluster bucket's key is there before and after (it lives 1000 s): what
	// must go is the client keys.
	a, err := newAdmitter(rdb, keysPrefix, keysClientRate)
	if err != nil {
		return err
	}
	if _, err := charge1(ctx, a, "", nil); err != nil {
		return err
	}
	base, err := rdb.DBSize(ctx).Result()
	if err != nil {
		return fmt.Errorf("DBSIZE: %w", err)
	}
	res.ExpiryBaseline = base
	if err := admitEach(ctx, a, "idle", &rate, n, 8); err != nil {
		return err
	}
	last := time.Now()
	if res.ExpiryPeak, err = rdb.DBSize(ctx).Result(); err != nil {
		return fmt.Errorf("DBSIZE: %w", err)
	}
	deadline := last.Add(30 * time.Second)
	for {
		size, err := rdb.DBSize(ctx).Result()
		if err != nil {
			return fmt.Errorf("DBSIZE: %w", err)
		}
		if size <= base {
			res.ExpiryGoneAfter = time.Since(last)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d idle keys still there 30s after their last write (TTL %s)", size-base, n, res.ExpiryTTL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
