package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
	"github.com/testcontainers/testcontainers-go/wait"
)

// The containers that stand in for the local services where a Docker engine answers
// and the SPACE_TEST_* variables are unset (servers.go says when). Each is started once
// per test process and shared by its tests, which keep apart by database and key
// prefix as they do on the local services.
//
// They end with the process through testcontainers-go's reaper (Ryuk, a container
// that removes every container of a test session once the session's process has gone;
// on by default). Where Ryuk cannot run and TESTCONTAINERS_RYUK_DISABLED=true is set,
// nothing removes them: they carry the label space.testenv, and
//
//	docker rm -f $(docker ps -aq --filter label=space.testenv)
//
// removes what such runs left. A package's TestMain could terminate them itself, but
// no package of this repository has one, and adding one to each is not worth it.

// Images: the major versions `make services` installs from Debian 12 (PostgreSQL 15,
// Redis 7).
const (
	postgresImage = "postgres:15-alpine"
	redisImage    = "redis:7-alpine"
)

// containerLabel marks the containers testenv starts.
const containerLabel = "space.testenv"

// dockerEngineAnswers is the probe of servers.go: nil when the Docker engine that
// testcontainers-go finds (DOCKER_HOST, ~/.testcontainers.properties, the usual
// sockets) answers.
func dockerEngineAnswers(ctx context.Context) (err error) {
	// testcontainers-go panics rather than returning an error on some machines
	// without a Docker host; that is the same "no engine" here.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers-go: %v", r)
		}
	}()
	provider, err := testcontainers.ProviderDocker.GetProvider()
	if err != nil {
		return err
	}
	defer provider.Close()
	return provider.Health(ctx)
}

// startContainer starts the container that stands in for variable and returns the
// variable's value.
func startContainer(ctx context.Context, variable string) (string, error) {
	switch variable {
	case envDatabaseURL:
		return startPostgresContainer(ctx)
	case envRedisAddr:
		return startRedisContainer(ctx)
	case envClusterAddrs:
		return startRedisClusterContainer(ctx)
	}
	return "", fmt.Errorf("no container stands in for %s", variable)
}

func labels(variable string) testcontainers.CustomizeRequestOption {
	return testcontainers.WithLabels(map[string]string{containerLabel: variable})
}

// startPostgresContainer returns the URL of the container's "space_test" database:
// tests create their databases beside it, as on the local server.
func startPostgresContainer(ctx context.Context) (string, error) {
	ctr, err := tcpostgres.Run(ctx, postgresImage,
		tcpostgres.WithDatabase("space_test"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
		labels(envDatabaseURL),
	)
	if err != nil {
		return "", fmt.Errorf("postgres container: %w", errors.Join(err, testcontainers.TerminateContainer(ctr)))
	}
	url, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return "", fmt.Errorf("postgres container URL: %w", errors.Join(err, testcontainers.TerminateContainer(ctr)))
	}
	return url, nil
}

// startRedisContainer returns the host:port of a standalone Redis container.
func startRedisContainer(ctx context.Context) (string, error) {
	ctr, err := tcredis.Run(ctx, redisImage, labels(envRedisAddr))
	if err != nil {
		return "", fmt.Errorf("redis container: %w", errors.Join(err, testcontainers.TerminateContainer(ctr)))
	}
	host, err := ctr.Host(ctx)
	if err != nil {
		return "", fmt.Errorf("redis container host: %w", errors.Join(err, testcontainers.TerminateContainer(ctr)))
	}
	port, err := ctr.MappedPort(ctx, "6379/tcp")
	if err != nil {
		return "", fmt.Errorf("redis container port: %w", errors.Join(err, testcontainers.TerminateContainer(ctr)))
	}
	return net.JoinHostPort(host, port.Port()), nil
}

// clusterReady is what the cluster container prints once the cluster is formed.
const clusterReady = "space-testenv-cluster-ready"

// startRedisClusterContainer starts a 3-node Redis Cluster (three masters, no
// replicas, as `make services` runs it) in one container of the Redis image and
// returns its three host:port addresses.
//
// A cluster node tells clients where the other nodes are (MOVED, CLUSTER SLOTS), so
// the addresses it announces must be the ones the tests dial: each node listens inside
// the container on the same port number it is published on, on the host's loopback,
// and announces 127.0.0.1. Inside the container 127.0.0.1 reaches the other nodes
// too, so the cluster bus works through the same announcement. The ports are chosen
// free on this machine just before the container starts (another process could take
// one meanwhile: the start then fails with the port named). This needs the engine to
// publish ports on this machine: a remote DOCKER_HOST is refused.
func startRedisClusterContainer(ctx context.Context) (string, error) {
	ports := make([]string, 3)
	for i := range ports {
		addr, err := FreeLoopbackAddr()
		if err != nil {
			return "", err
		}
		_, ports[i], _ = net.SplitHostPort(addr)
	}
	loopback := netip.MustParseAddr("127.0.0.1")
	bindings := network.PortMap{}
	var exposed, nodes []string
	var script strings.Builder
	script.WriteString("set -e\n")
	for i, p := range ports {
		exposed = append(exposed, p+"/tcp")
		bindings[network.MustParsePort(p+"/tcp")] = []network.PortBinding{{HostIP: loopback, HostPort: p}}
		nodes = append(nodes, "127.0.0.1:"+p)
		// The bus ports stay inside the container: fixed numbers, clear of the
		// client ports (which are ephemeral, 32768 and up).
		fmt.Fprintf(&script, "redis-server --port %s --bind 0.0.0.0 --protected-mode no --save '' --appendonly no"+
			" --cluster-enabled yes --cluster-config-file nodes-%s.conf --cluster-port %d --cluster-announce-ip 127.0.0.1 --daemonize yes\n",
			p, p, 17001+i)
	}
	fmt.Fprintf(&script, "until redis-cli -p %s ping >/dev/null 2>&1 && redis-cli -p %s ping >/dev/null 2>&1 && redis-cli -p %s ping >/dev/null 2>&1; do sleep 0.1; done\n",
		ports[0], ports[1], ports[2])
	fmt.Fprintf(&script, "redis-cli --cluster create %s --cluster-replicas 0 --cluster-yes\n", strings.Join(nodes, " "))
	fmt.Fprintf(&script, "until redis-cli -p %s cluster info | grep -q cluster_state:ok; do sleep 0.1; done\n", ports[0])
	fmt.Fprintf(&script, "echo %s\nexec sleep 2147483647\n", clusterReady)

	ctr, err := testcontainers.Run(ctx, redisImage,
		testcontainers.WithEntrypoint("sh", "-c", script.String()),
		testcontainers.WithExposedPorts(exposed...),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.PortBindings = bindings }),
		testcontainers.WithWaitStrategy(wait.ForLog(clusterReady)),
		labels(envClusterAddrs),
	)
	if err != nil {
		return "", fmt.Errorf("redis cluster container on ports %s: %w", strings.Join(ports, ", "), errors.Join(err, testcontainers.TerminateContainer(ctr)))
	}
	host, err := ctr.Host(ctx)
	if err != nil {
		return "", fmt.Errorf("redis cluster container host: %w", errors.Join(err, testcontainers.TerminateContainer(ctr)))
	}
	if host != "localhost" && !strings.HasPrefix(host, "127.") && host != "::1" {
		return "", errors.Join(fmt.Errorf("the Redis Cluster container needs a Docker engine that publishes ports on this machine (its nodes announce 127.0.0.1), not one on %s", host),
			testcontainers.TerminateContainer(ctr))
	}
	return strings.Join(nodes, ","), nil
}
