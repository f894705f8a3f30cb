package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file is the error-returning core behind StartRedis and FreeAddr: the bench
// (bench/, a module of its own) starts its private redis-servers and finds its free
// ports with these same functions, outside any test.

// redisStartTimeout bounds how long a fresh redis-server may take to answer PING: it
// answers within milliseconds, but a loaded 2-core machine can stall it for seconds.
const redisStartTimeout = 10 * time.Second

// wrappedStartTimeout is redisStartTimeout for a server run under a wrapper
// (RedisServerOptions.Wrapper): under valgrind it starts tens of times slower.
const wrappedStartTimeout = time.Minute

// FreeLoopbackAddr returns a 127.0.0.1 address whose port nobody listened on a moment
// ago. Another process may take it before the caller listens: a server started on it
// goes through OnFreePorts, which starts it again on others; callers that cannot
// retry accept that small race.
func FreeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free loopback port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// RedisProcess is a redis-server process of the caller's own on a free loopback port,
// with no persistence (no RDB snapshots, no AOF). It can be stopped and started again
// on the same address, and paused: for tests of what a component does when Redis goes
// away (stopping the shared server would fail every test beside them), and for
// measurements that must count only their own commands (INFO commandstats).
type RedisProcess struct {
	Addr string
	// Dir holds the server's working directory and its log, redis.log.
	Dir  string
	opts RedisServerOptions

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// RedisServerOptions are what a redis-server of StartRedisServerWith needs beyond the
// defaults (a plain port, no password).
type RedisServerOptions struct {
	// Args are more redis-server arguments, e.g. "--databases", "4", or
	// "--requirepass", "pw".
	Args []string
	// TLS, when set, makes the address a TLS port and the only one (--port 0,
	// --tls-port), with these files; clients are not asked for certificates.
	TLS *RedisTLSFiles
	// Client are the options (Addr aside) of the client that checks the server
	// answers: the password or the TLS configuration the server wants.
	Client redis.Options
	// Wrapper, when set, is a command the server runs under, redis-server and its
	// arguments appended: e.g. valgrind and its options, for a measurement of the
	// instructions Redis runs. A wrapped server is given a minute to answer.
	Wrapper []string
}

// RedisTLSFiles are a TLS server's PEM files.
type RedisTLSFiles struct {
	CertFile, KeyFile, CAFile string
}

// StartRedisServer starts redis-server on a free loopback port, in a new directory
// under dir, and waits until it answers PING. extra are more redis-server arguments,
// e.g. "--databases", "4". The caller stops it (Stop). It needs redis-server on PATH,
// which `make services` installs.
func StartRedisServer(ctx context.Context, dir string, extra ...string) (*RedisProcess, error) {
	return StartRedisServerWith(ctx, dir, RedisServerOptions{Args: extra})
}

// StartRedisServerWith is StartRedisServer for a server with a password, ACL users or
// TLS (opts).
func StartRedisServerWith(ctx context.Context, dir string, opts RedisServerOptions) (*RedisProcess, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server is not on PATH; install it with %s: %w", StartCommand, err)
	}
	addr, err := FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	d, err := os.MkdirTemp(dir, "redis-")
	if err != nil {
		return nil, fmt.Errorf("redis-server directory: %w", err)
	}
	p := &RedisProcess{Addr: addr, Dir: d, opts: opts}
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// Start starts the server (again) on the same address and waits until it answers;
// it does nothing when the server runs.
func (p *RedisProcess) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return nil
	}
	_, port, err := net.SplitHostPort(p.Addr)
	if err != nil {
		return fmt.Errorf("redis-server address %q: %w", p.Addr, err)
	}
	logPath := filepath.Join(p.Dir, "redis.log")
	ports := []string{"--port", port}
	if f := p.opts.TLS; f != nil {
		ports = []string{"--port", "0", "--tls-port", port, "--tls-cert-file", f.CertFile, "--tls-key-file", f.KeyFile,
			"--tls-ca-cert-file", f.CAFile, "--tls-auth-clients", "no"}
	}
	args := append([]string{"--bind", "127.0.0.1"}, ports...)
	args = append(args, "--save", "", "--appendonly", "no", "--dir", p.Dir, "--logfile", logPath)
	args = append(args, p.opts.Args...)
	cmd := exec.Command("redis-server", args...)
	timeout := redisStartTimeout
	if w := p.opts.Wrapper; len(w) > 0 {
		cmd = exec.Command(w[0], append(append(w[1:len(w):len(w)], "redis-server"), args...)...)
		timeout = wrappedStartTimeout
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server on %s: %w", p.Addr, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done

	copts := p.opts.Client
	copts.Addr, copts.MaxRetries = p.Addr, -1
	client := redis.NewClient(&copts)
	defer client.Close()
	deadline := time.Now().Add(timeout)
	for {
		// PING only once the port accepts a connection: go-redis logs every dial
		// its pool fails, and a server under a wrapper listens seconds late.
		var err error
		if conn, derr := net.DialTimeout("tcp", p.Addr, 200*time.Millisecond); derr != nil {
			err = derr
		} else {
			_ = conn.Close()
			pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			err = client.Ping(pctx).Err()
			cancel()
			if err == nil {
				return nil
			}
		}
		select {
		case <-done:
			p.cmd = nil
			return fmt.Errorf("redis-server on %s exited at start (its log: %s)", p.Addr, logPath)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.killLocked()
			return fmt.Errorf("redis-server on %s did not answer within %s: %w", p.Addr, timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Pid is the server's process id, or 0 when it is not running. Under a wrapper it is
// the wrapper's, which for valgrind is the server's own (valgrind runs it in its
// process).
func (p *RedisProcess) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Stop kills the server and waits for it to exit; its address then refuses
// connections. A stopped server can be started again.
func (p *RedisProcess) Stop() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
}

func (p *RedisProcess) killLocked() {
	if p.cmd == nil {
		return
	}
	// SIGKILL works on a paused (SIGSTOPped) process too.
	_ = p.cmd.Process.Kill()
	<-p.done
	p.cmd = nil
}

// Pause stops the server with SIGSTOP: connections stay open and every call hangs
// until its timeout, as a Redis stuck in a long command or a partitioned network does.
func (p *RedisProcess) Pause() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("pause redis-server on %s: it is not running", p.Addr)
	}
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause redis-server on %s: %w", p.Addr, err)
	}
	return nil
}

// Resume continues a paused server (SIGCONT); it does nothing to a running one.
func (p *RedisProcess) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// ErrPortTaken marks a server that exited at start because another socket took one
// of its ports between FreeLoopbackAddr and its listen (PortTaken tells it from its
// log).
var ErrPortTaken = errors.New("a port was taken before the server listened on it")

// PortTaken reports whether a server's log says it could not listen because its
// address was in use.
func PortTaken(log string) bool { return strings.Contains(log, "address already in use") }

// OnFreePorts runs start on n free loopback addresses, and again on new ones, up to
// tries times in all, while start fails with ErrPortTaken. A port is found free by
// listening on it and closing it, and once closed it may go to any socket of the
// machine, an outgoing connection's local port included, before the server listens on
// it: rare, but one such start failed a clean clone's make test.
func OnFreePorts[T any](n, tries int, start func(addrs []string) (T, error)) (T, error) {
	for try := 1; ; try++ {
		addrs := make([]string, n)
		for i := range addrs {
			addr, err := FreeLoopbackAddr()
			if err != nil {
				var zero T
				return zero, err
			}
			addrs[i] = addr
		}
		v, err := start(addrs)
		if !errors.Is(err, ErrPortTaken) || try >= tries {
			return v, err
		}
	}
}
