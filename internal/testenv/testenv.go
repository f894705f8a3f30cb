// Package testenv hands tests real servers: a Postgres database of their own, a
// standalone Redis and a 3-node Redis Cluster, each with a key prefix of their own, so
// that every test can run in parallel with every other.
//
// Servers come from SPACE_TEST_DATABASE_URL, SPACE_TEST_REDIS_ADDR and
// SPACE_TEST_REDIS_CLUSTER_ADDRS, which `scripts/services.sh env` prints and `make test`
// sets. When one is unset and a Docker engine answers, a container started with
// testcontainers-go stands in for it, once per test process; when no engine answers
// either, the test fails (it is never skipped) with the command that starts the local
// services (servers.go).
//
// Beside the testing.TB helpers, which fail their test, the package has an
// error-returning core (StartRedisServer, FreeLoopbackAddr, CreateDatabase,
// DropLeftoverDatabases) that the bench module uses outside any test.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartCommand is what a developer runs to get the services the tests need.
const StartCommand = `make services && eval "$(scripts/services.sh env)"`

// require returns the value of one of the SPACE_TEST_* variables, or of the container
// that stands in for it, or fails the test with the command that starts the services.
func require(t testing.TB, name string) string {
	t.Helper()
	v, err := servers.get(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Context returns a context cancelled when the test ends.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

// RandomID returns n random bytes as hex: for key prefixes and database names.
func RandomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Prefix returns a Redis key prefix no other test uses, in place of the production
// prefix "space". Components take it as their key namespace.
func Prefix(t testing.TB) string {
	return "t" + RandomID(6)
}

// RedisAddr is the standalone Redis of SPACE_TEST_REDIS_ADDR.
func RedisAddr(t testing.TB) string {
	t.Helper()
	return require(t, envRedisAddr)
}

// RedisClusterAddrs are the cluster nodes of SPACE_TEST_REDIS_CLUSTER_ADDRS.
func RedisClusterAddrs(t testing.TB) []string {
	t.Helper()
	return strings.Split(require(t, envClusterAddrs), ",")
}

// Redis returns a client of the standalone test Redis, closed when the test ends.
// Use it with a Prefix: the server is shared by every test.
func Redis(t testing.TB) redis.UniversalClient {
	t.Helper()
	return dialRedis(t, []string{RedisAddr(t)})
}

// RedisCluster returns a client of the 3-node test Redis Cluster, closed when the test
// ends. Use it with a Prefix.
func RedisCluster(t testing.TB) redis.UniversalClient {
	t.Helper()
	return dialRedis(t, RedisClusterAddrs(t))
}

func dialRedis(t testing.TB, addrs []string) redis.UniversalClient {
	t.Helper()
	opts := &redis.UniversalOptions{Addrs: addrs}
	if len(addrs) > 1 {
		opts.IsClusterMode = true
	}
	client := redis.NewUniversalClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		t.Fatalf("redis %v does not answer (%v); start the services with\n\t%s", addrs, err, StartCommand)
	}
	t.Cleanup(func() { client.Close() })
	return client
}
