package redisconn

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

// settings are the Redis settings of env (the SPACE_REDIS_* variables alone), read by
// config.Load as a replica reads them, so that the variables each came from are as in
// production; with a 2 s timeout.
func settings(t *testing.T, env map[string]string) config.Redis {
	t.Helper()
	vars := map[string]string{"SPACE_DATABASE_URL": "postgres://x@127.0.0.1:1/x", "SPACE_TEMPLATES_FILE": "/templates.json"}
	maps.Copy(vars, env)
	c, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	c.Redis.Timeout = 2 * time.Second
	return c.Redis
}

// open runs Open on the settings of env, and returns the client (closed when the test
// ends), what Open and the client logged (at debug level) and Open's error.
func open(t *testing.T, env map[string]string) (redis.UniversalClient, *testenv.Buffer, error) {
	t.Helper()
	logs := &testenv.Buffer{}
	rdb, err := Open(testenv.Context(t), settings(t, env), slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	switch {
	case err == nil && rdb == nil:
		t.Fatal("Open returned neither a client nor an error")
	case err != nil && rdb != nil:
		t.Fatalf("Open returned a client and the error %v", err)
	case rdb != nil:
		t.Cleanup(func() { rdb.Close() })
	}
	return rdb, logs, err
}

// opens runs Open on the settings of env and returns the client, failing the test on
// an error.
func opens(t *testing.T, env map[string]string) redis.UniversalClient {
	t.Helper()
	rdb, logs, err := open(t, env)
	if err != nil {
		t.Fatalf("Open: %v\n%s", err, logs)
	}
	return rdb
}

// openFails runs Open on the settings of env and returns its error, failing the test
// unless it is a setup error that names every one of want.
func openFails(t *testing.T, env map[string]string, want ...string) error {
	t.Helper()
	_, logs, err := open(t, env)
	if err == nil {
		t.Fatalf("Open returned a client; want a setup error naming %q\n%s", want, logs)
	}
	mustName(t, err, want...)
	return err
}

// mustName fails the test unless err is a setup error (one that stops the start,
// not an outage) naming every one of want.
func mustName(t *testing.T, err error, want ...string) {
	t.Helper()
	t.Logf("error: %v", err)
	var setup *setupError
	if !errors.As(err, &setup) {
		t.Errorf("%v is not a setup error: an outage would let the replica start", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q does not name %s", err, w)
		}
	}
}

// works checks that rdb runs commands: a key written through it reads back.
func works(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	ctx := testenv.Context(t)
	key := testenv.Prefix(t) + ":works"
	if err := rdb.Set(ctx, key, "1", time.Minute).Err(); err != nil {
		t.Fatalf("SET through the client: %v", err)
	}
	if v, err := rdb.Get(ctx, key).Result(); err != nil || v != "1" {
		t.Fatalf("GET through the client = %q, %v; want 1", v, err)
	}
}

func TestOpenFollowsWhatTheServerSaysItIs(t *testing.T) {
	t.Parallel()
	standalone := testenv.RedisAddr(t)
	cluster := testenv.RedisClusterAddrs(t)

	standaloneClient := func(t *testing.T, rdb redis.UniversalClient, addr string) {
		t.Helper()
		c, ok := rdb.(*redis.Client)
		if !ok {
			t.Fatalf("the client is a %T, want a standalone client", rdb)
		}
		if got := c.Options().Addr; got != addr {
			t.Fatalf("the client is of %s, want %s", got, addr)
		}
		works(t, rdb)
	}
	clusterClient := func(t *testing.T, rdb redis.UniversalClient) {
		t.Helper()
		if _, ok := rdb.(*redis.ClusterClient); !ok {
			t.Fatalf("the client is a %T, want a cluster client", rdb)
		}
		// Keys of every slot: a cluster node taken for a standalone server would
		// answer MOVED for two thirds of them.
		for range 12 {
			works(t, rdb) // a key of a random slot each time
		}
	}

	t.Run("one standalone address in auto mode gives a standalone client of it", func(t *testing.T) {
		t.Parallel()
		standaloneClient(t, opens(t, map[string]string{"SPACE_REDIS_ADDRS": standalone}), standalone)
	})

	t.Run("one cluster address in auto mode gives a cluster client", func(t *testing.T) {
		t.Parallel()
		clusterClient(t, opens(t, map[string]string{"SPACE_REDIS_ADDRS": cluster[0]}))
	})

	t.Run("every cluster address in auto mode gives a cluster client", func(t *testing.T) {
		t.Parallel()
		clusterClient(t, opens(t, map[string]string{"SPACE_REDIS_ADDRS": strings.Join(cluster, ",")}))
	})

	t.Run("standalone mode on a standalone server gives a standalone client", func(t *testing.T) {
		t.Parallel()
		standaloneClient(t, opens(t, map[string]string{"SPACE_REDIS_ADDRS": standalone, "SPACE_REDIS_MODE": "standalone"}), standalone)
	})

	t.Run("cluster mode on a cluster node gives a cluster client", func(t *testing.T) {
		t.Parallel()
		clusterClient(t, opens(t, map[string]string{"SPACE_REDIS_ADDRS": cluster[1], "SPACE_REDIS_MODE": "cluster"}))
	})

	t.Run("an address that does not answer is passed over for the next", func(t *testing.T) {
		t.Parallel()
		clusterClient(t, opens(t, map[string]string{"SPACE_REDIS_ADDRS": testenv.FreeAddr(t) + "," + cluster[2]}))
	})

	t.Run("the database of SPACE_REDIS_URL is the standalone client's", func(t *testing.T) {
		t.Parallel()
		rdb := opens(t, map[string]string{"SPACE_REDIS_URL": "redis://" + standalone + "/3"})
		if db := rdb.(*redis.Client).Options().DB; db != 3 {
			t.Fatalf("the client uses database %d, want 3", db)
		}
	})

	t.Run("standalone mode on a cluster node is a setup error naming SPACE_REDIS_MODE", func(t *testing.T) {
		t.Parallel()
		openFails(t, map[string]string{"SPACE_REDIS_ADDRS": cluster[0], "SPACE_REDIS_MODE": "standalone"},
			"SPACE_REDIS_MODE=standalone", cluster[0], "cluster_enabled:1", "set SPACE_REDIS_MODE=cluster")
	})

	t.Run("cluster mode on a standalone server is a setup error naming SPACE_REDIS_MODE", func(t *testing.T) {
		t.Parallel()
		openFails(t, map[string]string{"SPACE_REDIS_ADDRS": standalone, "SPACE_REDIS_MODE": "cluster"},
			"SPACE_REDIS_MODE=cluster", standalone, "cluster_enabled:0", "set SPACE_REDIS_MODE=standalone")
	})

	t.Run("several addresses of standalone servers in auto mode are a setup error naming SPACE_REDIS_MODE and SPACE_REDIS_ADDRS", func(t *testing.T) {
		t.Parallel()
		openFails(t, map[string]string{"SPACE_REDIS_ADDRS": standalone + "," + standalone},
			"SPACE_REDIS_MODE=auto", "2 addresses of SPACE_REDIS_ADDRS", "cluster_enabled:0")
	})

	t.Run("a database in SPACE_REDIS_URL on a cluster node is a setup error naming SPACE_REDIS_URL", func(t *testing.T) {
		t.Parallel()
		openFails(t, map[string]string{"SPACE_REDIS_URL": "redis://" + cluster[0] + "/2"}, "SPACE_REDIS_URL names database 2", "database 0 only")
	})
}

func TestClientsBoundEachCallByItsContext(t *testing.T) {
	t.Parallel()
	// The admission components run a call directly only on a client whose socket
	// deadlines are its context's (admission.Options.Redis); without it every call
	// pays a goroutine of its own.
	cfg := settings(t, map[string]string{"SPACE_REDIS_ADDRS": "127.0.0.1:1"})
	o, co := options(cfg, "127.0.0.1:1"), clusterOptions(cfg)
	for _, c := range []struct {
		name            string
		contextTimeout  bool
		dial, read, wrt time.Duration
	}{
		{"standalone", o.ContextTimeoutEnabled, o.DialTimeout, o.ReadTimeout, o.WriteTimeout},
		{"cluster", co.ContextTimeoutEnabled, co.DialTimeout, co.ReadTimeout, co.WriteTimeout},
	} {
		if !c.contextTimeout || c.dial != dialTimeout || c.read != cfg.Timeout || c.wrt != cfg.Timeout {
			t.Errorf("%s client: ContextTimeoutEnabled %v, dial %v, read %v, write %v; want true, %v, and SPACE_REDIS_TIMEOUT %v",
				c.name, c.contextTimeout, c.dial, c.read, c.wrt, dialTimeout, cfg.Timeout)
		}
	}
}

func TestClusterEnabled(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		info string
		want bool
	}{
		{"# Cluster\r\ncluster_enabled:1\r\n", true},
		{"# Cluster\r\ncluster_enabled:0\r\n", false},
		{"# Cluster\ncluster_enabled:1", true},
		{"# Cluster\r\n", false}, // an old or Redis-compatible server: not a cluster
		{"", false},
		{"# Cluster\r\nx_cluster_enabled:1\r\n", false},
	} {
		if got := clusterEnabled(c.info); got != c.want {
			t.Errorf("clusterEnabled(%q) = %v, want %v", c.info, got, c.want)
		}
	}
}

// quietLogger discards, for checkers built by hand.
var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// countLines is how many lines of logs hold s.
func countLines(logs fmt.Stringer, s string) int {
	n := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}
