package app

import (
	"net/http"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/idempotency"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

// keyed sends a synchronous create under an Idempotency-Key.
func (s *server) keyed(client, body, key string, header ...string) response {
	s.t.Helper()
	return s.do("POST", "/v1/sandboxes", client, body, append([]string{idempotency.Header, key}, header...)...)
}

func (s *server) keyCount() int {
	s.t.Helper()
	var n int
	if err := s.m.DB.QueryRow(testenv.Context(s.t), "SELECT count(*) FROM idempotency_keys").Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	return n
}

func (s *server) coldStarts() int {
	s.t.Helper()
	n := 0
	for _, c := range s.m.Substrate.(*substrate.Simulated).Calls() {
		if c.Op == substrate.OpStartCold {
			n++
		}
	}
	return n
}

func TestIdempotencyKeyOnASynchronousCreate(t *testing.T) {
	t.Parallel()

	t.Run("a repeat returns the same sandbox and charges nothing", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		sb := s.create("acme", pythonBody, idempotency.Header, "build-7")
		before := s.rawBuckets("acme")

		// The draft's form of the key, a quoted string, names the same key.
		again := s.keyed("acme", pythonBody, `"build-7"`)
		var got space.Sandbox
		again.json(t, &got)
		if again.StatusCode != http.StatusCreated || got.ID != sb.ID || got.State != space.StateRunning {
			t.Fatalf("the repeat = %d %+v, want 201 with sandbox %s", again.StatusCode, got, sb.ID)
		}
		if loc := again.Header.Get("Location"); loc != "/v1/sandboxes/"+sb.ID {
			t.Fatalf("the repeat's Location = %q", loc)
		}
		if after := s.rawBuckets("acme"); after != before {
			t.Fatalf("the repeat was charged: buckets %s, then %s", before, after)
		}
		if n, starts := s.sandboxCount(), s.coldStarts(); n != 1 || starts != 1 {
			t.Fatalf("%d sandboxes and %d cold starts for one request, want 1 and 1", n, starts)
		}
	})

	t.Run("the key with a different request is a 422 naming it, and makes nothing", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		if r := s.keyed("acme", pythonBody, "k"); r.StatusCode != http.StatusCreated {
			t.Fatalf("first create = %d %s", r.StatusCode, r.body)
		}
		other := `{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":20}`
		for name, r := range map[string]response{
			"another body":         s.keyed("acme", other, "k"),
			"the same body queued": s.keyed("acme", pythonBody, "k", "Prefer", async),
		} {
			if p := r.problem(t); r.StatusCode != http.StatusUnprocessableEntity || p.Field != idempotency.Header || p.Code != space.EUNPROCESSABLE {
				t.Errorf("%s under the key = %d %+v, want 422 naming %s", name, r.StatusCode, p, idempotency.Header)
			}
		}
		if n := s.sandboxCount(); n != 1 {
			t.Fatalf("%d sandboxes, want 1", n)
		}
		var ops int
		if err := s.m.DB.QueryRow(testenv.Context(t), "SELECT count(*) FROM operations").Scan(&ops); err != nil || ops != 0 {
			t.Fatalf("%d operations (%v), want none", ops, err)
		}
	})

	t.Run("keys are per client", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		a := s.keyed("acme", pythonBody, "k")
		g := s.keyed("globex", pythonBody, "k")
		var sa, sg space.Sandbox
		a.json(t, &sa)
		g.json(t, &sg)
		if a.StatusCode != http.StatusCreated || g.StatusCode != http.StatusCreated || sa.ID == sg.ID || sg.Client != "globex" {
			t.Fatalf("acme %d %+v, globex %d %+v: want a sandbox each", a.StatusCode, sa, g.StatusCode, sg)
		}
	})

	t.Run("a repeat while the first is still starting is a 409, and one cold start is made", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		release := s.m.Substrate.(*substrate.Simulated).Gate(substrate.OpStartCold)
		defer release()
		firstDone := make(chan response, 1)
		go func() { firstDone <- s.keyed("acme", pythonBody, "slow") }()
		testenv.Eventually(t, 30*time.Second, "the first create to be starting", func() bool {
			var n int
			if err := s.m.DB.QueryRow(testenv.Context(t), "SELECT count(*) FROM sandboxes WHERE state = 'starting'").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 1
		})
		r := s.keyed("acme", pythonBody, "slow")
		if p := r.problem(t); r.StatusCode != http.StatusConflict || p.Code != space.ECONFLICT {
			t.Fatalf("a repeat in flight = %d %+v, want 409", r.StatusCode, p)
		}
		release()
		first := <-firstDone
		var sb space.Sandbox
		first.json(t, &sb)
		if first.StatusCode != http.StatusCreated {
			t.Fatalf("the first create = %d %s", first.StatusCode, first.body)
		}
		if got := s.create("acme", pythonBody, idempotency.Header, "slow"); got.ID != sb.ID {
			t.Fatalf("the repeat after got sandbox %s, want %s", got.ID, sb.ID)
		}
		if starts := s.coldStarts(); starts != 1 {
			t.Fatalf("%d cold starts, want 1", starts)
		}
	})

	t.Run("a create refused for its rate is tried again by its retry, and charged once it is admitted", func(t *testing.T) {
		t.Parallel()
		// A token every 4 s: the keyed create is refused unless the machine stalls the
		// test that long between the two (make test-stress once stalled it past the
		// half second of a 2/s rate); the retry waits for the next token.
		s := startServer(t, e2eOptions{quota: `{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100}},
			"rate": {"acme": {"refill_rps": 0.25, "burst": 1}}}`})
		s.create("acme", pythonBody) // the one token
		r := s.keyed("acme", pythonBody, "retry-me")
		if r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" {
			t.Fatalf("a keyed create over the rate = %d %s, want 429 with Retry-After", r.StatusCode, r.body)
		}
		var sb space.Sandbox
		testenv.Eventually(t, 30*time.Second, "the retry to be admitted", func() bool {
			r = s.keyed("acme", pythonBody, "retry-me")
			if r.StatusCode == http.StatusTooManyRequests {
				return false
			}
			r.json(t, &sb)
			return true
		})
		if r.StatusCode != http.StatusCreated || sb.State != space.StateRunning {
			t.Fatalf("the admitted retry = %d %s", r.StatusCode, r.body)
		}
		if got := s.create("acme", pythonBody, idempotency.Header, "retry-me"); got.ID != sb.ID {
			t.Fatalf("a repeat after got sandbox %s, want %s", got.ID, sb.ID)
		}
		if n, keys := s.sandboxCount(), s.keyCount(); n != 2 || keys != 1 {
			t.Fatalf("%d sandboxes and %d keys, want 2 (one plain, one keyed) and 1", n, keys)
		}
	})

	t.Run("an expired key names nothing: the same key makes a new sandbox", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		s.create("acme", pythonBody, idempotency.Header, "other")
		sb := s.create("acme", pythonBody, idempotency.Header, "daily")
		if _, err := s.m.DB.Exec(testenv.Context(t), "UPDATE idempotency_keys SET expires_at = now() - interval '1 second'"); err != nil {
			t.Fatal(err)
		}
		if got := s.create("acme", pythonBody, idempotency.Header, "daily"); got.ID == sb.ID {
			t.Fatalf("the expired key gave sandbox %s again, want a new one", got.ID)
		}
		// The reconciler purges the expired key; the replica's own loop may hold the
		// round's lock, so rounds are run until one is this test's.
		testenv.Eventually(t, 30*time.Second, "a reconciler round", func() bool {
			res, err := s.m.Reconciler.Round(testenv.Context(t))
			if err != nil {
				t.Fatalf("reconcile: %v", err)
			}
			return res.Leader
		})
		if n := s.keyCount(); n != 1 {
			t.Fatalf("%d keys after the reconciler's purge, want the one in force", n)
		}
	})

	t.Run("a key on a synchronous restore is refused, naming it", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		sb := s.create("acme", pythonBody)
		r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/restore", "acme", "", idempotency.Header, "r-1")
		if p := r.problem(t); r.StatusCode != http.StatusBadRequest || p.Field != idempotency.Header {
			t.Fatalf("a keyed synchronous restore = %d %+v, want 400 naming %s", r.StatusCode, p, idempotency.Header)
		}
	})
}
