package redisconn

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestNothingAnswersAtStart(t *testing.T) {
	t.Parallel()
	cluster := testenv.RedisClusterAddrs(t)

	// startsWithout opens a client of env while nothing answers there, and checks that
	// the start goes on with a warning and a client that fails every call.
	startsWithout := func(t *testing.T, env map[string]string) (redis.UniversalClient, *testenv.Buffer) {
		t.Helper()
		rdb, logs, err := open(t, env)
		if err != nil {
			t.Fatalf("Open with no Redis answering = %v; want the start to go on", err)
		}
		if !strings.Contains(logs.String(), "redis does not answer at start") {
			t.Errorf("Open did not warn that Redis does not answer:\n%s", logs)
		}
		if err := rdb.Ping(testenv.Context(t)).Err(); err == nil {
			t.Fatal("PING succeeded with no Redis answering")
		}
		return rdb, logs
	}
	// answers waits until rdb's calls succeed.
	answers := func(t *testing.T, rdb redis.UniversalClient) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, "the client to reach the Redis that now answers", func() bool {
			return rdb.Ping(testenv.Context(t)).Err() == nil
		})
	}

	t.Run("a closed port: the start goes on, with a client that fails every call", func(t *testing.T) {
		t.Parallel()
		startsWithout(t, map[string]string{"SPACE_REDIS_ADDRS": testenv.FreeAddr(t)})
	})

	t.Run("a server that accepts and never answers: the start goes on once the check's time is out", func(t *testing.T) {
		t.Parallel()
		addr := fakeServer(t, func(c net.Conn) {})
		start := time.Now()
		startsWithout(t, map[string]string{"SPACE_REDIS_ADDRS": addr})
		if d := time.Since(start); d > checkTimeout+5*time.Second {
			t.Errorf("the start waited %v for a server that never answers; the check is bounded by %v", d, checkTimeout)
		}
	})

	t.Run("once a standalone server answers, the client uses it, in the database of SPACE_REDIS_URL", func(t *testing.T) {
		t.Parallel()
		srv := testenv.StartRedis(t)
		srv.Stop()
		rdb, logs := startsWithout(t, map[string]string{"SPACE_REDIS_URL": "redis://" + srv.Addr + "/4"})
		srv.Start()
		answers(t, rdb)
		ctx := testenv.Context(t)
		if err := rdb.Set(ctx, "written-late", "1", 0).Err(); err != nil {
			t.Fatal(err)
		}
		direct := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: 4})
		t.Cleanup(func() { direct.Close() })
		if v, err := direct.Get(ctx, "written-late").Result(); err != nil || v != "1" {
			t.Fatalf("database 4 of the server holds %q (%v); want the key written through the client", v, err)
		}
		for range 3 {
			rdb.Ping(ctx) //nolint:errcheck // only the log is looked at
		}
		if n := countLines(logs, "redis answered: it is a standalone server"); n != 1 {
			t.Errorf("%d lines say the server answered, want 1:\n%s", n, logs)
		}
	})

	t.Run("once a cluster answers, the client uses it", func(t *testing.T) {
		t.Parallel()
		proxy := testenv.StartProxy(t, cluster[0])
		proxy.Cut()
		rdb, logs := startsWithout(t, map[string]string{"SPACE_REDIS_ADDRS": proxy.Addr})
		proxy.Restore()
		answers(t, rdb)
		ctx := testenv.Context(t)
		direct := testenv.RedisCluster(t)
		for range 12 { // keys of every slot
			key := testenv.Prefix(t) + ":written-late"
			if err := rdb.Set(ctx, key, "1", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if v, err := direct.Get(ctx, key).Result(); err != nil || v != "1" {
				t.Fatalf("the cluster holds %s = %q (%v); want the key written through the client", key, v, err)
			}
		}
		if !strings.Contains(logs.String(), "redis answered: it is a cluster") {
			t.Errorf("the client did not log that the cluster answered:\n%s", logs)
		}
	})

	t.Run("a wrong password found once Redis answers fails every call with the setup error, logged once", func(t *testing.T) {
		t.Parallel()
		auth := testenv.StartAuthRedis(t)
		proxy := testenv.StartProxy(t, auth.Addr)
		proxy.Cut()
		rdb, logs := startsWithout(t, map[string]string{"SPACE_REDIS_ADDRS": proxy.Addr, "SPACE_REDIS_PASSWORD": "wrong-" + auth.Password})
		proxy.Restore()
		var err error
		testenv.Eventually(t, 10*time.Second, "PING to fail with the credentials error", func() bool {
			err = rdb.Ping(testenv.Context(t)).Err()
			return err != nil && strings.Contains(err.Error(), "refused the credentials")
		})
		mustName(t, err, "SPACE_REDIS_PASSWORD: Redis at "+proxy.Addr)
		for range 3 {
			if err := rdb.Ping(testenv.Context(t)).Err(); err == nil || !strings.Contains(err.Error(), "refused the credentials") {
				t.Fatalf("PING = %v, want the credentials error every time", err)
			}
		}
		if n := countLines(logs, "cannot be used as configured"); n != 1 {
			t.Errorf("%d lines log the setup error, want 1:\n%s", n, logs)
		}
		if strings.Contains(logs.String(), auth.Password) || strings.Contains(err.Error(), auth.Password) {
			t.Errorf("the log or the error shows the password: %v\n%s", err, logs)
		}
	})

	t.Run("a mode mismatch found once Redis answers fails every call naming SPACE_REDIS_MODE", func(t *testing.T) {
		t.Parallel()
		proxy := testenv.StartProxy(t, cluster[0])
		proxy.Cut()
		rdb, _ := startsWithout(t, map[string]string{"SPACE_REDIS_ADDRS": proxy.Addr, "SPACE_REDIS_MODE": "standalone"})
		proxy.Restore()
		var err error
		testenv.Eventually(t, 10*time.Second, "PING to fail with the mode error", func() bool {
			err = rdb.Ping(testenv.Context(t)).Err()
			return err != nil && strings.Contains(err.Error(), "cluster_enabled:1")
		})
		mustName(t, err, "SPACE_REDIS_MODE=standalone")
	})

	t.Run("a cluster that answered is found through the nodes it named once the configured one is gone", func(t *testing.T) {
		t.Parallel()
		proxy := testenv.StartProxy(t, cluster[0])
		c := &checker{cfg: settings(t, map[string]string{"SPACE_REDIS_ADDRS": proxy.Addr}), logger: quietLogger}
		ctx := testenv.Context(t)
		if _, err := c.slots(ctx); err != nil {
			t.Fatalf("CLUSTER SLOTS through the configured address: %v", err)
		}
		proxy.Cut()
		slots, err := c.slots(ctx)
		if err != nil || len(slots) == 0 {
			t.Fatalf("with the configured address gone, slots = %v, %v; want the cluster's, from a node it named", slots, err)
		}
	})
}

func TestHint(t *testing.T) {
	t.Parallel()
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	const setTLS = " (the server closed the connection without answering: if it serves TLS, set SPACE_REDIS_TLS=true)"
	dropTLS := func(variable string) string {
		return " (no answer: if the server does not speak TLS, " + variable + " must not ask for it)"
	}
	for _, c := range []struct {
		name string
		env  map[string]string
		err  error
		want string
	}{
		{"a plain client whose connection is closed unanswered is told to set SPACE_REDIS_TLS",
			map[string]string{"SPACE_REDIS_ADDRS": "127.0.0.1:1"}, io.EOF, setTLS},
		{"a plain client whose connection is reset unanswered is told the same",
			map[string]string{"SPACE_REDIS_ADDRS": "127.0.0.1:1"}, reset, setTLS},
		{"a plain client refused a connection is told nothing: nothing listens",
			map[string]string{"SPACE_REDIS_ADDRS": "127.0.0.1:1"}, refused, ""},
		{"a plain client that times out is told nothing",
			map[string]string{"SPACE_REDIS_ADDRS": "127.0.0.1:1"}, timeout, ""},
		{"a TLS client that times out is told to drop SPACE_REDIS_TLS",
			map[string]string{"SPACE_REDIS_ADDRS": "127.0.0.1:1", "SPACE_REDIS_TLS": "true"}, timeout, dropTLS("SPACE_REDIS_TLS")},
		{"a TLS client of a rediss:// URL that times out is told to drop it from SPACE_REDIS_URL",
			map[string]string{"SPACE_REDIS_URL": "rediss://127.0.0.1:1"}, context.DeadlineExceeded, dropTLS("SPACE_REDIS_URL")},
		{"a TLS client whose connection is closed is not told to set TLS",
			map[string]string{"SPACE_REDIS_ADDRS": "127.0.0.1:1", "SPACE_REDIS_TLS": "true"}, io.EOF, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			check := &checker{cfg: settings(t, c.env)}
			if got := check.hint(c.err); got != c.want {
				t.Fatalf("hint(%v) = %q, want %q", c.err, got, c.want)
			}
		})
	}

	t.Run("the hint is in the warning of a start with no Redis answering", func(t *testing.T) {
		t.Parallel()
		addr := closingServer(t)
		_, logs, err := open(t, map[string]string{"SPACE_REDIS_ADDRS": addr})
		if err != nil || !strings.Contains(logs.String(), "if it serves TLS, set SPACE_REDIS_TLS=true") {
			t.Fatalf("Open = %v; want it to go on and warn to set SPACE_REDIS_TLS=true:\n%s", err, logs)
		}
	})
}

// A setup error is told from an outage by its type alone: Open stops on one and
// starts through the other.
func TestSetupErrorUnwraps(t *testing.T) {
	t.Parallel()
	cause := errors.New("WRONGPASS")
	err := error(&setupError{msg: config.EnvRedisPassword + ": refused", err: cause})
	if !errors.Is(err, cause) || err.Error() != "SPACE_REDIS_PASSWORD: refused: WRONGPASS" {
		t.Fatalf("setup error %q does not wrap its cause", err)
	}
	if got := (&setupError{msg: "only"}).Error(); got != "only" {
		t.Fatalf("setup error without a cause reads %q", got)
	}
}

// closingServer listens on loopback and closes every connection it accepts at once,
// as a TLS server does with a client that does not begin with a handshake.
func closingServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln.Addr().String()
}
