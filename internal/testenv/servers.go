package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// Where each kind of test server comes from, in this order:
//
//  1. its SPACE_TEST_* variable, when set (`make test` sets all three from the local
//     services);
//  2. otherwise, when a Docker engine answers, a container that testcontainers-go
//     starts the first time a test of this process asks for that kind of server, and
//     that every later test of the process shares (containers.go);
//  3. otherwise the test fails (it is never skipped) with the command that starts the
//     local services.
//
// These machines have no Docker engine, so the second path only runs where one does;
// what is tested here is the choice (servers_test.go), with the probe and the starters
// replaced.

// Variables that name the test servers.
const (
	envDatabaseURL  = "SPACE_TEST_DATABASE_URL"
	envRedisAddr    = "SPACE_TEST_REDIS_ADDR"
	envClusterAddrs = "SPACE_TEST_REDIS_CLUSTER_ADDRS"
)

const (
	// probeTimeout bounds the question "does a Docker engine answer?": an engine
	// answers a ping in milliseconds, and a missing one must not slow every failing
	// test down.
	probeTimeout = 10 * time.Second
	// containerStartTimeout bounds starting one container, its image pull included.
	containerStartTimeout = 5 * time.Minute
)

// serverSource decides where the servers of each variable come from. Its functions are
// fields so that the choice can be tested without Docker.
type serverSource struct {
	getenv func(string) string
	// engine returns nil when a container engine answers, or why none does.
	engine func(context.Context) error
	// start starts the container that stands in for the named variable and returns
	// the variable's value (a URL, an address, comma-separated addresses).
	start func(ctx context.Context, variable string) (string, error)

	engineOnce sync.Once
	engineErr  error

	mu         sync.Mutex
	containers map[string]*containerOnce
}

// containerOnce is one variable's container: started at most once per process.
type containerOnce struct {
	once  sync.Once
	value string
	err   error
}

// servers is the process's source: the environment, then Docker.
var servers = &serverSource{getenv: os.Getenv, engine: dockerEngineAnswers, start: startContainer}

// get returns the value of variable: the environment's, a container's, or an error
// that says how to start the local services.
func (s *serverSource) get(variable string) (string, error) {
	if v := strings.TrimSpace(s.getenv(variable)); v != "" {
		return v, nil
	}
	s.mu.Lock()
	if s.containers == nil {
		s.containers = map[string]*containerOnce{}
	}
	c := s.containers[variable]
	if c == nil {
		c = &containerOnce{}
		s.containers[variable] = c
	}
	s.mu.Unlock()

	c.once.Do(func() {
		s.engineOnce.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
			defer cancel()
			s.engineErr = s.engine(ctx)
		})
		if s.engineErr != nil {
			c.err = fmt.Errorf("%s is not set and no Docker engine answers (%v): the tests need real servers; start them with\n\t%s\n(or run everything with `make test`)",
				variable, s.engineErr, StartCommand)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), containerStartTimeout)
		defer cancel()
		c.value, c.err = s.start(ctx, variable)
		if c.err != nil {
			c.err = fmt.Errorf("%s is not set, and its container did not start: %w; or start the local services with\n\t%s", variable, c.err, StartCommand)
		}
	})
	return c.value, c.err
}
