package testenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space/internal/store"
)

// RedisServer is a private redis-server process for tests that stop and restart Redis;
// stopping the shared one would fail every other test running beside them. It is a
// RedisProcess that fails its test instead of returning errors.
type RedisServer struct {
	t    testing.TB
	Addr string
	p    *RedisProcess
}

// StartRedis starts a private redis-server on a free loopback port, stopped when the
// test ends. It needs redis-server on PATH, which `make services` installs.
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	p, err := StartRedisServer(context.Background(), t.TempDir())
	if err != nil {
		t.Fatalf("private redis-server: %v", err)
	}
	t.Cleanup(p.Stop)
	return &RedisServer{t: t, Addr: p.Addr, p: p}
}

// Start starts the server (again) on the same address and waits until it answers.
func (s *RedisServer) Start() {
	s.t.Helper()
	if err := s.p.Start(context.Background()); err != nil {
		s.t.Fatalf("private redis-server: %v", err)
	}
}

// Stop kills the server; its address then refuses connections.
func (s *RedisServer) Stop() { s.p.Stop() }

// Pause stops the server with SIGSTOP: connections stay open and every call hangs
// until its timeout, as a Redis stuck in a long command or a partitioned network does.
// A paused server is resumed when the test ends.
func (s *RedisServer) Pause() {
	s.t.Helper()
	if err := s.p.Pause(); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(s.Resume)
}

// Resume continues a paused server (SIGCONT).
func (s *RedisServer) Resume() { s.p.Resume() }

// Proxy is a TCP proxy in front of a real server that a test can cut, to see what a
// component does when its Postgres or Redis goes away, without stopping the shared
// server under every other test.
type Proxy struct {
	t      testing.TB
	Addr   string
	target string

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	// sent counts the chunks clients sent through the proxy: for Redis, about one per
	// command (a pipeline is one).
	sent atomic.Int64
	// muted drops what the server sends back while it is set (Mute).
	muted atomic.Bool
}

// Mute drops every reply the server sends from now on, on open connections and new
// ones, while what clients send still reaches it: a write commits and its caller never
// learns of it, as when a connection breaks between the two. Cut then fails the
// waiting caller; Restore ends the mute.
func (p *Proxy) Mute() { p.muted.Store(true) }

// Sent is how many chunks clients have sent through the proxy to the server: with
// Redis, the commands that reached the network.
func (p *Proxy) Sent() int64 { return p.sent.Load() }

// StartProxy listens on a free loopback port and forwards to target (host:port).
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p := &Proxy{t: t, Addr: freeAddr(t), target: target, conns: map[net.Conn]struct{}{}}
	p.Restore()
	t.Cleanup(func() {
		p.Cut()
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
	})
	return p
}

// Cut closes the listener and every open connection: new connections are refused
// and open ones fail, as when the server goes down.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// Restore listens again on the same address, as when the server comes back.
func (p *Proxy) Restore() {
	p.t.Helper()
	p.muted.Store(false)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil || p.closed {
		return
	}
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port may linger for a moment after Cut
		if ln, err = net.Listen("tcp", p.Addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		p.t.Fatalf("proxy listen %s: %v", p.Addr, err)
	}
	p.ln = ln
	go p.serve(ln)
}

func (p *Proxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.ln != ln {
			p.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		p.conns[c] = struct{}{}
		p.conns[up] = struct{}{}
		p.mu.Unlock()
		go p.pipe(c, up, false)
		go p.pipe(up, c, true)
	}
}

// pipe copies src to dst: what a client sent when request is true, counted in sent;
// the server's replies otherwise, dropped while the proxy is muted.
func (p *Proxy) pipe(dst, src net.Conn, request bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && (request || !p.muted.Load()) {
			if request {
				p.sent.Add(1)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// ProxyDatabaseURL returns url with its host:port replaced by the proxy's.
func ProxyDatabaseURL(t testing.TB, dbURL string) (string, *Proxy) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil || u.Host == "" {
		t.Fatalf("parse database URL %q: %v", store.Redact(dbURL), err)
	}
	p := StartProxy(t, u.Host)
	u.Host = p.Addr
	return u.String(), p
}

// Blackhole returns an address that accepts connections and never answers: the
// slowest kind of outage, for tests of timeouts.
func Blackhole(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}

func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := FreeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// FreeAddr returns a loopback address with a port nobody listens on right now.
func FreeAddr(t testing.TB) string { return freeAddr(t) }

// WriteFile writes content to name in a temporary directory of the test and returns
// the path.
func WriteFile(t testing.TB, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Eventually polls cond every 10ms until it holds or timeout passes. Prefer a signal
// from the code under test; use this only for what a test cannot be signalled about
// (another process, a server coming back).
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// CuttableRedis is a client of a shared test Redis whose every connection goes
// through a Proxy, for a test to cut them all (Redis gone, as its clients see it) and
// restore them, without stopping the server under every other test.
type CuttableRedis struct {
	Client  redis.UniversalClient
	proxies []*Proxy
}

// CuttableStandalone is a CuttableRedis of the standalone test Redis. Its client
// never retries a command and dials once a call, so that a cut fails each call at
// once, not after go-redis's five dials 100ms apart.
func CuttableStandalone(t testing.TB) *CuttableRedis {
	t.Helper()
	p := StartProxy(t, RedisAddr(t))
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	warm(t, func(ctx context.Context) error { return c.Ping(ctx).Err() })
	return &CuttableRedis{Client: c, proxies: []*Proxy{p}}
}

// CuttableCluster is a CuttableRedis of the 3-node test cluster: one Proxy per node,
// and a client whose dialer sends every node address it learns (CLUSTER SLOTS names
// the nodes themselves) through that node's proxy, and refuses any other. Its
// options are those space-api gives a cluster client, bar timeouts (the caller's
// deadline bounds each call, as the admission components' own does) and one dial a
// call, as CuttableStandalone's.
func CuttableCluster(t testing.TB) *CuttableRedis {
	t.Helper()
	addrs := RedisClusterAddrs(t)
	through := make(map[string]string, len(addrs))
	var proxies []*Proxy
	for _, a := range addrs {
		p := StartProxy(t, a)
		through[a] = p.Addr
		proxies = append(proxies, p)
	}
	var d net.Dialer
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 addrs,
		ContextTimeoutEnabled: true,
		DialerRetries:         1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			p, ok := through[addr]
			if !ok {
				return nil, fmt.Errorf("cuttable cluster: %s is not a node of the test cluster", addr)
			}
			return d.DialContext(ctx, network, p)
		},
	})
	t.Cleanup(func() { c.Close() })
	warm(t, func(ctx context.Context) error {
		return c.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error { return shard.Ping(ctx).Err() })
	})
	return &CuttableRedis{Client: c, proxies: proxies}
}

// warm pings a new cuttable client through its proxies (every node of a cluster,
// which also loads its slots), so that a test's first call does not pay the dials:
// on a loaded machine they can take longer than a component's timeout, and a test
// that wants a decision of Redis's would get one failing open.
func warm(t testing.TB, ping func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ping(ctx); err != nil {
		t.Fatalf("redis through its proxies does not answer (%v); start the services with\n\t%s", err, StartCommand)
	}
}

// Cut closes every proxy: new connections are refused and open ones fail.
func (c *CuttableRedis) Cut() {
	for _, p := range c.proxies {
		p.Cut()
	}
}

// Restore lets connections through again.
func (c *CuttableRedis) Restore() {
	for _, p := range c.proxies {
		p.Restore()
	}
}

// CuttableTopologies names the two ways to reach the shared test Redis through
// proxies: standalone and the 3-node cluster.
var CuttableTopologies = []struct {
	Name string
	Dial func(testing.TB) *CuttableRedis
}{{"standalone", CuttableStandalone}, {"cluster", CuttableCluster}}
