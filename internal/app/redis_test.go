package app

import (
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

// redisSettings are the Redis settings a replica reads from env (the SPACE_REDIS_*
// variables alone), through config.Load as in production, with testConfig's timeout.
func redisSettings(t *testing.T, env map[string]string) config.Redis {
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

// startWithRedis starts a server on the Redis of env, with a client rate so that a
// create writes both bucket keys.
func startWithRedis(t *testing.T, env map[string]string) *server {
	t.Helper()
	return startServer(t, e2eOptions{config: func(c *config.Config) {
		c.Redis = redisSettings(t, env)
		c.Admission.Client = &space.Rate{RefillRPS: 1e-6, Burst: 10}
	}})
}

// startFails runs a Main on the Redis of env and returns its start-up error, failing
// the test when it starts.
func startFails(t *testing.T, env map[string]string) error {
	t.Helper()
	_, err := startLogs(t, env)
	if err == nil {
		t.Fatal("the replica started; want a start-up error")
	}
	return err
}

// startLogs runs a Main on the Redis of env and returns what it logged and its
// start-up error, closing it either way.
func startLogs(t *testing.T, env map[string]string) (string, error) {
	t.Helper()
	var logs testenv.Buffer
	cfg := testConfig(t)
	cfg.Redis = redisSettings(t, env)
	m := NewMain(cfg, NewLogger(&logs, "info"))
	m.RedisPrefix = testenv.Prefix(t)
	err := m.Run(testenv.Context(t))
	m.Close()
	return logs.String(), err
}

// mustName fails the test unless err names every one of the variables.
func mustName(t *testing.T, err error, variables ...string) {
	t.Helper()
	t.Logf("start-up error: %v", err)
	for _, v := range variables {
		if !strings.Contains(err.Error(), v) {
			t.Errorf("start-up error %q does not name %s", err, v)
		}
	}
}

// admitsInto creates a sandbox and checks it was admitted on the buckets in rdb: both
// keys there, and not one decision error.
func (s *server) admitsInto(rdb redis.UniversalClient) {
	s.t.Helper()
	s.create("acme", pythonBody)
	keys := []string{admission.ClusterKey(s.m.RedisPrefix), admission.ClientKey(s.m.RedisPrefix, space.Unknown)}
	n, err := rdb.Exists(testenv.Context(s.t), keys...).Result()
	if err != nil || n != 2 {
		s.t.Fatalf("%d of the bucket keys %v are in that Redis (%v), want both", n, keys, err)
	}
	const decisions = "space_sandbox_admission_rate_decisions_total"
	if admitted := s.metric(decisions, `decision="admitted"`, `bucket="cluster_activation"`); admitted != 1 {
		s.t.Errorf("%v admitted decisions, want 1", admitted)
	}
	if errs := s.metric(decisions, `decision="error"`); errs != 0 {
		s.t.Errorf("%v decision errors, want 0", errs)
	}
}

// The Redis tests of a whole replica: admission runs on the client internal/redisconn
// builds, a setup error stops the start, and one found later shows on /readyz. What
// each setup error names, the hints and the checks of a Redis that answers late are
// tested there, on Open alone.

func TestRedisCredentialsAndTLS(t *testing.T) {
	t.Parallel()
	auth := testenv.StartAuthRedis(t)
	tlsSrv := testenv.StartTLSRedis(t)
	passwordFile := func(t *testing.T, pw string) string { return testenv.WriteFile(t, "redis-password", pw+"\n") }

	t.Run("admission works with the default user's password from SPACE_REDIS_PASSWORD_FILE", func(t *testing.T) {
		t.Parallel()
		s := startWithRedis(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr, "SPACE_REDIS_PASSWORD_FILE": passwordFile(t, auth.Password)})
		s.admitsInto(auth.Client(t))
	})

	t.Run("admission works as an ACL user", func(t *testing.T) {
		t.Parallel()
		s := startWithRedis(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr, "SPACE_REDIS_USERNAME": auth.User, "SPACE_REDIS_PASSWORD": auth.UserPassword})
		s.admitsInto(auth.Client(t))
	})

	t.Run("admission works with the credentials of a redis:// SPACE_REDIS_URL", func(t *testing.T) {
		t.Parallel()
		s := startWithRedis(t, map[string]string{"SPACE_REDIS_URL": "redis://" + auth.User + ":" + auth.UserPassword + "@" + auth.Addr + "/0"})
		s.admitsInto(auth.Client(t))
	})

	t.Run("admission works over TLS verified with SPACE_REDIS_TLS_CA_FILE", func(t *testing.T) {
		t.Parallel()
		s := startWithRedis(t, map[string]string{"SPACE_REDIS_ADDRS": tlsSrv.Addr, "SPACE_REDIS_TLS": "true", "SPACE_REDIS_TLS_CA_FILE": tlsSrv.CA.CertFile})
		s.admitsInto(tlsSrv.Client(t))
	})

	t.Run("admission works over a rediss:// SPACE_REDIS_URL verifying SPACE_REDIS_TLS_SERVER_NAME", func(t *testing.T) {
		t.Parallel()
		s := startWithRedis(t, map[string]string{"SPACE_REDIS_URL": "rediss://" + tlsSrv.Addr, "SPACE_REDIS_TLS_CA_FILE": tlsSrv.CA.CertFile,
			"SPACE_REDIS_TLS_SERVER_NAME": tlsSrv.ServerName})
		s.admitsInto(tlsSrv.Client(t))
	})

	t.Run("a wrong password is a start-up error naming the variable, without the password", func(t *testing.T) {
		t.Parallel()
		err := startFails(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr, "SPACE_REDIS_PASSWORD_FILE": passwordFile(t, "wrong-password-42")})
		mustName(t, err, "SPACE_REDIS_PASSWORD_FILE", "refused the credentials")
		if strings.Contains(err.Error(), "wrong-password-42") {
			t.Errorf("the start-up error shows the password: %v", err)
		}
	})

	t.Run("a user that may not run INFO is believed in standalone mode", func(t *testing.T) {
		t.Parallel()
		s := startWithRedis(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr, "SPACE_REDIS_MODE": "standalone",
			"SPACE_REDIS_USERNAME": auth.NoInfoUser, "SPACE_REDIS_PASSWORD": auth.UserPassword})
		s.admitsInto(auth.Client(t))
	})

	t.Run("the logged Redis settings and start-up errors never show the password", func(t *testing.T) {
		t.Parallel()
		var logs testenv.Buffer
		cfg := testConfig(t)
		cfg.Redis = redisSettings(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr, "SPACE_REDIS_USERNAME": auth.User,
			"SPACE_REDIS_PASSWORD_FILE": passwordFile(t, auth.UserPassword)})
		m := NewMain(cfg, NewLogger(&logs, "debug"))
		m.RedisPrefix = testenv.Prefix(t)
		t.Cleanup(func() { m.Close() })
		if err := m.Run(testenv.Context(t)); err != nil {
			t.Fatal(err)
		}
		out := logs.String()
		if !strings.Contains(out, `"password_set":true`) || !strings.Contains(out, `"username":"`+auth.User+`"`) {
			t.Errorf("the start does not log the Redis settings:\n%s", out)
		}
		wrong := "wrong-" + auth.UserPassword
		err := startFails(t, map[string]string{"SPACE_REDIS_URL": "redis://" + auth.User + ":" + wrong + "@" + auth.Addr})
		for _, pw := range []string{auth.UserPassword, auth.Password} {
			if strings.Contains(out, pw) || strings.Contains(err.Error(), pw) {
				t.Errorf("a password shows in the log or the error %q:\n%s", err, out)
			}
		}
	})
}

func TestRedisMode(t *testing.T) {
	t.Parallel()
	cluster := testenv.RedisClusterAddrs(t)

	t.Run("one cluster address in auto mode is a cluster: creates are admitted on it without errors", func(t *testing.T) {
		t.Parallel()
		s := startWithRedis(t, map[string]string{"SPACE_REDIS_ADDRS": cluster[0]})
		if _, ok := s.m.Redis.(*redis.ClusterClient); !ok {
			t.Fatalf("the client is a %T, want a cluster client", s.m.Redis)
		}
		s.admitsInto(testenv.RedisCluster(t))
	})

	t.Run("standalone mode against a cluster node is a start-up error naming SPACE_REDIS_MODE", func(t *testing.T) {
		t.Parallel()
		err := startFails(t, map[string]string{"SPACE_REDIS_ADDRS": cluster[0], "SPACE_REDIS_MODE": "standalone"})
		mustName(t, err, "SPACE_REDIS_MODE=standalone", "cluster_enabled:1")
	})

	t.Run("a replica that could not reach its one address at start uses the cluster it finds there", func(t *testing.T) {
		t.Parallel()
		proxy := testenv.StartProxy(t, cluster[0])
		proxy.Cut()
		s := startWithRedis(t, map[string]string{"SPACE_REDIS_ADDRS": proxy.Addr})
		s.readyWithRedis(false)
		proxy.Restore()
		s.readyWithRedis(true)
		s.admitsInto(testenv.RedisCluster(t))
	})

	t.Run("a replica that could not reach its one address at start uses the standalone server it finds there", func(t *testing.T) {
		t.Parallel()
		srv := testenv.StartRedis(t)
		srv.Stop()
		s := startWithRedis(t, map[string]string{"SPACE_REDIS_ADDRS": srv.Addr})
		s.readyWithRedis(false)
		srv.Start()
		s.readyWithRedis(true)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { rdb.Close() })
		s.admitsInto(rdb)
	})

	t.Run("a wrong password found once Redis answers fails every call and says why on the internal readyz", func(t *testing.T) {
		t.Parallel()
		auth := testenv.StartAuthRedis(t)
		proxy := testenv.StartProxy(t, auth.Addr)
		proxy.Cut()
		s := startWithRedis(t, map[string]string{"SPACE_REDIS_ADDRS": proxy.Addr, "SPACE_REDIS_PASSWORD": "wrong"})
		proxy.Restore()
		testenv.Eventually(t, 10*time.Second, "the internal readyz to name the password variable", func() bool {
			var ready api.Readiness
			getJSON(t, s.m.InternalURL()+"/readyz", &ready)
			return strings.Contains(ready.Checks["redis"].Error, "SPACE_REDIS_PASSWORD: Redis at")
		})
		if err := s.m.Redis.Ping(testenv.Context(t)).Err(); err == nil || !strings.Contains(err.Error(), "refused the credentials") {
			t.Fatalf("PING = %v, want the credentials error", err)
		}
	})
}

// readyWithRedis waits until the public readyz reports Redis up (or, up false, checks
// it reports it degraded: the replica serves without it in fail-open mode).
func (s *server) readyWithRedis(up bool) {
	s.t.Helper()
	if !up {
		var ready api.Readiness
		if code := getJSON(s.t, s.m.PublicURL()+"/readyz", &ready); code != http.StatusOK || ready.Status != "degraded" {
			s.t.Fatalf("readyz with redis unreachable = %d %+v, want 200 degraded", code, ready)
		}
		return
	}
	testenv.Eventually(s.t, 10*time.Second, "readyz to report redis up", func() bool {
		var ready api.Readiness
		return getJSON(s.t, s.m.PublicURL()+"/readyz", &ready) == http.StatusOK && ready.Status == "ok"
	})
}
