package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// SlowStats is what a slowloris saw: how many connections it held open at once while
// it ran, and how the server treated them.
type SlowStats struct {
	Conns      int // the connections it keeps open
	Dials      int // connections opened: the first Conns, and one for each closed after
	DialErrors int
	// Closed are the connections the server closed (or answered) while their headers
	// were still coming; Lifetime is the median time one of them was open.
	Closed   int
	Lifetime time.Duration
	Bytes    int64 // header bytes sent, one a second a connection
	// MinOpen and MaxOpen are the fewest and most connections open at once, sampled
	// every 100 ms from when all were first open until the stop; Held is that time.
	MinOpen, MaxOpen int
	Held             time.Duration
}

// slowPrefix is the start of the request a slowloris's connection sends, a byte a
// second; after it, the value of its last header goes on for ever: the headers never
// end, and a server that waits for them holds the connection.
func slowPrefix(host, client string) []byte {
	return []byte("POST /v1/sandboxes HTTP/1.1\r\nHost: " + host + "\r\nX-Client-ID: " + client + "\r\nX-Slow: ")
}

// runSlowloris holds l.Slow connections to the server at l.URL, each sending one byte
// of a request's headers a second, opening a new one for each the server closes, until
// stop reaches its end (or ctx ends). It writes startedLine to stderr once every
// connection has been opened a first time (opening them is spread over a second).
func (l load) runSlowloris(ctx context.Context, stop io.Reader, stderr io.Writer) (*SlowStats, error) {
	u, err := url.Parse(l.URL)
	if err != nil {
		return nil, fmt.Errorf("slowloris %s: %w", l.Name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, stop)
		cancel()
	}()
	prefix := slowPrefix(u.Host, l.Client)
	var (
		open, dials, dialErrors, closed atomic.Int64
		sent                            atomic.Int64
		mu                              sync.Mutex
		lifetimes                       []time.Duration
		firstOpen                       sync.WaitGroup
	)
	firstOpen.Add(l.Slow)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range l.Slow {
		wg.Go(func() {
			// Spread over the first second, as over every second after it.
			if !sleepCtx(ctx, time.Duration(i)*time.Second/time.Duration(l.Slow)) {
				firstOpen.Done()
				return
			}
			first := true
			buf := make([]byte, 512)
			for ctx.Err() == nil {
				conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", u.Host)
				if err != nil {
					if ctx.Err() == nil {
						dialErrors.Add(1)
					}
					sleepCtx(ctx, 100*time.Millisecond)
					continue
				}
				dials.Add(1)
				open.Add(1)
				if first {
					first = false
					firstOpen.Done()
				}
				opened := time.Now()
				byServer := false
				for n := 0; ctx.Err() == nil; n++ {
					b := byte('a')
					if n < len(prefix) {
						b = prefix[n]
					}
					if _, err := conn.Write([]byte{b}); err != nil {
						byServer = true
						break
					}
					sent.Add(1)
					// A second until the next byte; an answer or the end of the
					// connection in the meantime is the server giving up on it.
					_ = conn.SetReadDeadline(time.Now().Add(time.Second))
					if _, err := conn.Read(buf); err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
						byServer = ctx.Err() == nil
						break
					}
				}
				open.Add(-1)
				conn.Close()
				if byServer {
					closed.Add(1)
					mu.Lock()
					lifetimes = append(lifetimes, time.Since(opened))
					mu.Unlock()
				}
			}
			if first {
				firstOpen.Done()
			}
		})
	}
	firstOpen.Wait()
	st := &SlowStats{Conns: l.Slow}
	if ctx.Err() == nil {
		fmt.Fprintln(stderr, startedLine)
		held := time.Now()
		st.MinOpen, st.MaxOpen = int(open.Load()), int(open.Load())
		tick := time.NewTicker(100 * time.Millisecond)
	sample:
		for {
			select {
			case <-ctx.Done():
				break sample
			case <-tick.C:
				n := int(open.Load())
				st.MinOpen, st.MaxOpen = min(st.MinOpen, n), max(st.MaxOpen, n)
			}
		}
		tick.Stop()
		st.Held = time.Since(held)
	}
	wg.Wait()
	st.Dials, st.DialErrors, st.Closed, st.Bytes = int(dials.Load()), int(dialErrors.Load()), int(closed.Load()), sent.Load()
	if len(lifetimes) > 0 {
		slices.Sort(lifetimes)
		st.Lifetime = lifetimes[len(lifetimes)/2]
	}
	if st.Dials == 0 {
		return nil, fmt.Errorf("slowloris %s: no connection to %s opened in %s", l.Name, u.Host, time.Since(start).Round(time.Millisecond))
	}
	return st, nil
}

// sleepCtx sleeps for d, or until ctx ends: false if it ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// slowloris is a slowloris's process, holding its connections until stop.
type slowloris struct {
	stdin *os.File
	done  chan struct{}
	res   *SlowStats
	err   error
}

// startSlowloris starts a slowloris of conns connections to the server at url, in a
// process of its own at the lowest CPU priority, and returns once all its connections
// are open (or it failed).
func startSlowloris(ctx context.Context, url string, conns int) (*slowloris, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	started := make(chan struct{})
	l := load{Name: "slowloris", URL: url, Client: "bench-slow", Slow: conns, Yield: true}
	p, err := l.startApart(ctx, started, r)
	r.Close()
	if err != nil {
		w.Close()
		return nil, err
	}
	s := &slowloris{stdin: w, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		wr, err := p.wait()
		s.res, s.err = wr.Slow, err
		if err == nil && s.res == nil {
			s.err = errors.New("slowloris: its process printed no figures")
		}
	}()
	select {
	case <-started:
	case <-s.done:
	}
	select {
	case <-s.done:
		w.Close()
		if s.err == nil {
			s.err = errors.New("slowloris: its process ended before it was stopped")
		}
		return nil, s.err
	default:
		return s, nil
	}
}

// stop closes the slowloris's connections and returns what it saw.
func (s *slowloris) stop() (*SlowStats, error) {
	s.stdin.Close()
	<-s.done
	return s.res, s.err
}
