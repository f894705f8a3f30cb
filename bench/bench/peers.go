package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

// The peers of the refusal-ceiling comparison are main packages of this module
// (cmd/peer-chi-redis-rate, cmd/peer-chi-bare; package peer says what they do). The
// driver builds them into its scratch directory once per run and starts each as a
// process of its own, as space-api runs.
const (
	peerRedisRate = "peer-chi-redis-rate"
	peerBare      = "peer-chi-bare"
)

// peerBinary builds (once per Env) and returns the path of the named peer.
func (e *Env) peerBinary(ctx context.Context, name string) (string, error) {
	e.peersOnce.Do(func() {
		for _, n := range []string{peerRedisRate, peerBare} {
			out := filepath.Join(e.Dir, n)
			cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/"+n)
			cmd.Dir = e.benchModule()
			if b, err := cmd.CombinedOutput(); err != nil {
				e.peersErr = fmt.Errorf("go build ./cmd/%s in %s: %w\n%s", n, cmd.Dir, err, b)
				return
			}
		}
	})
	if e.peersErr != nil {
		return "", e.peersErr
	}
	return filepath.Join(e.Dir, name), nil
}

// benchModule is this module's directory, bench/ in the repository.
func (e *Env) benchModule() string { return filepath.Join(e.Module, "bench") }

// startPeer starts the named peer on a free loopback port, with its extra flags;
// redisAddr is the Redis of the redis_rate peer ("" for the bare one).
func (e *Env) startPeer(ctx context.Context, name, redisAddr string, extra ...string) (*apiServer, error) {
	bin, err := e.peerBinary(ctx, name)
	if err != nil {
		return nil, err
	}
	return testenv.OnFreePorts(1, 5, func(addrs []string) (*apiServer, error) {
		return e.startPeerOn(ctx, bin, addrs[0], name, redisAddr, extra...)
	})
}

// startPeerOn starts the peer built at bin listening on addr.
func (e *Env) startPeerOn(ctx context.Context, bin, addr, name, redisAddr string, extra ...string) (*apiServer, error) {
	args := []string{"-addr", addr}
	if redisAddr != "" {
		args = append(args, "-redis", redisAddr)
	}
	args = append(args, extra...)
	label := strings.Join(append([]string{name}, extra...), "")
	cmd := exec.Command(bin, args...)
	if os.Getenv("GOGC") == "" {
		// space-api runs its collector at config.GCPercent unless GOGC says
		// otherwise; so do the peers, so that the ratios compare the request paths,
		// not a runtime setting.
		cmd.Env = append(os.Environ(), "GOGC="+strconv.Itoa(config.GCPercent))
	}
	return e.startProcess(ctx, label, name, cmd, "http://"+addr, "")
}
