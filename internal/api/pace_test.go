package api

import (
	"context"
	"github.com/prometheus/client_golang/prometheus"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/sandbox"
)

func TestRefusalPace(t *testing.T) {
	t.Parallel()

	// paceBundle is a server whose refusal pace ends only when the test says so: acme
	// is refused from memory while refuseAcme is set, beta's creates run until
	// the test lets them end.
	type paceBundle struct {
		h          *handlers
		refuseAcme atomic.Bool
		delays     chan struct{}  // a refusal's delay began
		fire       chan time.Time // ends one delay
		timers     atomic.Int64   // delays that asked for a timer
		started    chan struct{}  // a create of beta's is at work
		finish     chan struct{}  // closed: beta's creates end
	}
	setupPace := func(t *testing.T, pace time.Duration) *paceBundle {
		t.Helper()
		b := &paceBundle{h: setup(t), delays: make(chan struct{}, 64), fire: make(chan time.Time),
			started: make(chan struct{}, 64), finish: make(chan struct{})}
		b.refuseAcme.Store(true)
		p := b.h.server.pace
		p.pace = pace
		p.after = func(time.Duration) (<-chan time.Time, func() bool) {
			b.timers.Add(1)
			return b.fire, func() bool { return true }
		}
		p.onDelay = func() { b.delays <- struct{}{} }
		b.h.sandboxes.plan = func(c space.Caller, _ sandbox.CreateRequest) error {
			if c.Key == "acme" && b.refuseAcme.Load() {
				return &space.LimitError{Bucket: space.BucketClientActivation, Client: c.Key, RetryAfter: time.Second,
					Limit: &space.Rate{RefillRPS: 1, Burst: 5}, FromMemory: true}
			}
			return nil
		}
		b.h.sandboxes.create = func(p sandbox.Plan) (*space.Sandbox, error) {
			b.started <- struct{}{}
			<-b.finish
			return running, nil
		}
		t.Cleanup(func() {
			select {
			case <-b.finish:
			default:
				close(b.finish)
			}
		})
		return b
	}
	// send creates as client in the background; its answer comes on the channel.
	send := func(b *paceBundle, ctx context.Context, client string) <-chan *httptest.ResponseRecorder {
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			r := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(pythonCreate)).WithContext(ctx)
			r.RemoteAddr = "192.0.2.1:40000"
			r.Header.Set(HeaderClientID, client)
			r.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			b.h.public.ServeHTTP(w, r)
			done <- w
		}()
		return done
	}
	// betaAtWork starts a create of beta's and returns once it is at work.
	betaAtWork := func(t *testing.T, b *paceBundle) <-chan *httptest.ResponseRecorder {
		t.Helper()
		answer := send(b, context.Background(), "beta")
		<-b.started
		return answer
	}
	// within bounds a wait for what a broken pace would never do (a delay never begun,
	// an answer delayed for ever) to a failure rather than a hung test.
	within := func(t *testing.T, what string, c <-chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not after 10s", what)
		}
	}
	// delayedRefusals sends n creates of acme's, refused from memory, and returns their
	// answers once every one's delay has begun.
	delayedRefusals := func(t *testing.T, b *paceBundle, n int) []<-chan *httptest.ResponseRecorder {
		t.Helper()
		answers := make([]<-chan *httptest.ResponseRecorder, n)
		for i := range answers {
			answers[i] = send(b, context.Background(), "acme")
		}
		for range n {
			within(t, "a refusal's delay began", b.delays)
		}
		return answers
	}
	answered := func(t *testing.T, a <-chan *httptest.ResponseRecorder) *httptest.ResponseRecorder {
		t.Helper()
		select {
		case w := <-a:
			return w
		case <-time.After(10 * time.Second):
			t.Fatal("no answer after 10s: delayed with no end")
			return nil
		}
	}
	refusedAtOnce := func(t *testing.T, b *paceBundle) {
		t.Helper()
		w := answered(t, send(b, context.Background(), "acme"))
		if w.Code != http.StatusTooManyRequests {
			t.Fatalf("acme's create = %d %s, want 429", w.Code, w.Body)
		}
		if n := b.timers.Load(); n != 0 {
			t.Fatalf("%d refusals delayed, want none", n)
		}
	}

	t.Run("refusals from memory wait for the pace while another key's create is at work", func(t *testing.T) {
		t.Parallel()
		b := setupPace(t, 10*time.Millisecond)
		beta := betaAtWork(t, b)
		const refused = 8
		answers := delayedRefusals(t, b, refused)
		// Every refusal is now parked on the test's timer: none can have answered.
		for i, a := range answers {
			select {
			case w := <-a:
				t.Fatalf("refusal %d answered %d before its pace ended", i, w.Code)
			default:
			}
		}
		for range refused {
			b.fire <- time.Now()
		}
		for i, a := range answers {
			if w := <-a; w.Code != http.StatusTooManyRequests || problemOf(t, w).Bucket != space.BucketClientActivation {
				t.Fatalf("refusal %d = %d %s, want the 429 it was", i, w.Code, w.Body)
			}
		}
		close(b.finish)
		if w := <-beta; w.Code != http.StatusCreated {
			t.Fatalf("beta's create = %d %s", w.Code, w.Body)
		}
		if m := b.h.do(b.h.internal, "GET", "/metrics", ""); !strings.Contains(m.Body.String(), "space_refusals_paced_total 8\n") {
			t.Fatalf("metrics lack space_refusals_paced_total 8:\n%s", grepLines(m.Body.String(), "space_refusals_paced"))
		}
	})

	t.Run("delayed refusals are answered when the last request at work ends, before their pace", func(t *testing.T) {
		t.Parallel()
		b := setupPace(t, 10*time.Millisecond)
		beta := betaAtWork(t, b)
		answers := delayedRefusals(t, b, 4)
		close(b.finish) // beta's create ends; the test's timer never fires
		if w := answered(t, beta); w.Code != http.StatusCreated {
			t.Fatalf("beta's create = %d %s", w.Code, w.Body)
		}
		for i, a := range answers {
			if w := answered(t, a); w.Code != http.StatusTooManyRequests {
				t.Fatalf("refusal %d = %d %s, want 429", i, w.Code, w.Body)
			}
		}
		if n := b.h.server.pace.delayed.Load(); n != 0 {
			t.Fatalf("delayed = %d after every refusal was answered, want 0", n)
		}
	})

	t.Run("a request of the refused key's own at work keeps its delayed refusals to their pace", func(t *testing.T) {
		t.Parallel()
		b := setupPace(t, 10*time.Millisecond)
		b.refuseAcme.Store(false)
		own := send(b, context.Background(), "acme") // acme's admitted create, at work
		<-b.started
		b.refuseAcme.Store(true)
		restoring, release := make(chan struct{}), make(chan struct{})
		b.h.sandboxes.restore = func(space.Caller, string) (*space.Sandbox, error) {
			close(restoring)
			<-release
			return running, nil
		}
		restored := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			restored <- b.h.do(b.h.public, "POST", "/v1/sandboxes/"+running.ID+"/restore", "", HeaderClientID, "beta")
		}()
		<-restoring
		refusal := send(b, context.Background(), "acme")
		within(t, "a refusal's delay began beside beta's restore", b.delays)
		close(release) // beta's restore ends, acme's own create is still at work
		if w := answered(t, restored); w.Code != http.StatusOK {
			t.Fatalf("beta's restore = %d %s", w.Code, w.Body)
		}
		select {
		case b.fire <- time.Now(): // the delay was still waiting for its pace
		case w := <-refusal:
			t.Fatalf("the refusal answered %d with acme's own create still at work, before its pace", w.Code)
		}
		if w := answered(t, refusal); w.Code != http.StatusTooManyRequests {
			t.Fatalf("acme's create = %d %s, want 429", w.Code, w.Body)
		}
		close(b.finish)
		if w := answered(t, own); w.Code != http.StatusCreated {
			t.Fatalf("acme's admitted create = %d %s", w.Code, w.Body)
		}
	})

	t.Run("refusals from memory wait while another key's restore is at work, not beside the key's own", func(t *testing.T) {
		t.Parallel()
		b := setupPace(t, 10*time.Millisecond)
		b.h.sandboxes.restore = func(space.Caller, string) (*space.Sandbox, error) {
			b.started <- struct{}{}
			<-b.finish
			return running, nil
		}
		restore := func(client string) <-chan *httptest.ResponseRecorder {
			done := make(chan *httptest.ResponseRecorder, 1)
			go func() {
				done <- b.h.do(b.h.public, "POST", "/v1/sandboxes/"+running.ID+"/restore", "", HeaderClientID, client)
			}()
			return done
		}
		own := restore("acme")
		<-b.started
		refusedAtOnce(t, b)

		beta := restore("beta")
		<-b.started
		refusal := send(b, context.Background(), "acme")
		within(t, "a refusal's delay began beside beta's restore", b.delays)
		select {
		case w := <-refusal:
			t.Fatalf("the refusal answered %d before its pace ended", w.Code)
		default:
		}
		b.fire <- time.Now()
		if w := answered(t, refusal); w.Code != http.StatusTooManyRequests {
			t.Fatalf("acme's create = %d %s, want 429", w.Code, w.Body)
		}
		close(b.finish)
		for name, a := range map[string]<-chan *httptest.ResponseRecorder{"acme": own, "beta": beta} {
			if w := answered(t, a); w.Code != http.StatusOK {
				t.Fatalf("%s's restore = %d %s", name, w.Code, w.Body)
			}
		}
	})

	t.Run("a refusal with no other key's create at work is answered at once", func(t *testing.T) {
		t.Parallel()
		refusedAtOnce(t, setupPace(t, 10*time.Millisecond))
	})

	t.Run("a refusal beside another key's create that has ended is answered at once", func(t *testing.T) {
		t.Parallel()
		b := setupPace(t, 10*time.Millisecond)
		beta := betaAtWork(t, b)
		close(b.finish)
		<-beta
		refusedAtOnce(t, b)
	})

	t.Run("the refused key's own creates at work do not delay its refusals", func(t *testing.T) {
		t.Parallel()
		b := setupPace(t, 10*time.Millisecond)
		b.refuseAcme.Store(false)
		own := send(b, context.Background(), "acme")
		<-b.started
		b.refuseAcme.Store(true)
		refusedAtOnce(t, b)
		close(b.finish)
		if w := <-own; w.Code != http.StatusCreated {
			t.Fatalf("acme's admitted create = %d", w.Code)
		}
	})

	t.Run("a pace of 0 answers every refusal at once", func(t *testing.T) {
		t.Parallel()
		b := setupPace(t, 0)
		betaAtWork(t, b)
		refusedAtOnce(t, b)
	})

	t.Run("past the bound on delayed refusals a refusal is answered at once", func(t *testing.T) {
		t.Parallel()
		b := setupPace(t, 10*time.Millisecond)
		betaAtWork(t, b)
		b.h.server.pace.delayed.Store(maxPacedRefusals)
		refusedAtOnce(t, b)
		if n := b.h.server.pace.delayed.Load(); n != maxPacedRefusals {
			t.Fatalf("delayed = %d after a refusal past the bound, want it back at %d", n, maxPacedRefusals)
		}
	})

	t.Run("a refusal from Redis is not delayed", func(t *testing.T) {
		t.Parallel()
		b := setupPace(t, 10*time.Millisecond)
		betaAtWork(t, b)
		b.refuseAcme.Store(false)
		b.h.sandboxes.create = func(p sandbox.Plan) (*space.Sandbox, error) {
			return nil, &space.LimitError{Bucket: space.BucketClientActivation, Client: p.Caller.Key, RetryAfter: time.Second}
		}
		refusedAtOnce(t, b)
	})

	t.Run("a refusal waiting out its pace holds no seat of the gate: the next request in turn gets it", func(t *testing.T) {
		t.Parallel()
		b := setupPace(t, time.Minute)
		b.h.server.gate = newGate(GateOptions{Seats: 2, MaxWait: time.Minute}, prometheus.NewRegistry())
		beta := betaAtWork(t, b) // one seat
		refusal := delayedRefusals(t, b, 1)[0]
		// The other seat: free, although acme's refusal is still waiting out its pace.
		gamma := send(b, context.Background(), "gamma")
		within(t, "gamma's create to get a seat while acme's refusal waits", b.started)
		select {
		case b.fire <- time.Now():
		case w := <-refusal:
			t.Fatalf("acme's refusal answered %d before its pace, beside two creates at work", w.Code)
		}
		if w := answered(t, refusal); w.Code != http.StatusTooManyRequests {
			t.Fatalf("acme's create = %d %s, want 429", w.Code, w.Body)
		}
		close(b.finish)
		for _, a := range []<-chan *httptest.ResponseRecorder{beta, gamma} {
			if w := answered(t, a); w.Code != http.StatusCreated {
				t.Fatalf("a create at work = %d %s", w.Code, w.Body)
			}
		}
		g := b.h.server.gate
		g.mu.Lock()
		n := g.inUse
		g.mu.Unlock()
		if n != 0 {
			t.Fatalf("%d seats in use once every request ended, want 0 (a seat given back twice or never)", n)
		}
	})

	t.Run("a caller that hangs up while its refusal is delayed is let go at once", func(t *testing.T) {
		t.Parallel()
		b := setupPace(t, 10*time.Millisecond)
		betaAtWork(t, b)
		ctx, cancel := context.WithCancel(context.Background())
		answer := send(b, ctx, "acme")
		within(t, "the refusal's delay began", b.delays)
		cancel()
		answered(t, answer) // without the timer ever firing
		if n := b.h.server.pace.delayed.Load(); n != 0 {
			t.Fatalf("delayed = %d after the caller left, want 0", n)
		}
	})
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
