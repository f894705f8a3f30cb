package app

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

// tenant is one authenticated caller as the server knows it in its identity mode: the
// headers that make a request its.
type tenant struct {
	id      space.ClientID
	headers []string
}

// tenant returns the caller id in the server's identity mode: its own API key in
// api_key mode, X-Client-ID from the trusted loopback peer in trusted_header mode.
func (s *server) tenant(id space.ClientID) tenant {
	s.t.Helper()
	if s.m.Config.Auth.Mode == config.AuthAPIKey {
		return tenant{id: id, headers: bearer(s.key(string(id)))}
	}
	return tenant{id: id, headers: []string{api.HeaderClientID, string(id)}}
}

// as sends a request on the public listener as tn.
func (s *server) as(tn tenant, method, path, body string, header ...string) response {
	s.t.Helper()
	return s.request(s.m.PublicURL(), method, path, "", body, append(append([]string{}, tn.headers...), header...)...)
}

// isolationQuota allowlists acme only; every other client shares unknown's rate and
// caps.
const isolationQuota = `{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100}},
	"default": {"concurrency": 50, "live_sandboxes": 100},
	"rate": {"acme": {"refill_rps": 0.000001, "burst": 50}, "unknown": {"refill_rps": 0.000001, "burst": 50}}}`

func isolationServer(t *testing.T, mode config.AuthMode, quota string) *server {
	t.Helper()
	return startServer(t, e2eOptions{quota: quota, config: func(c *config.Config) {
		if mode == config.AuthAPIKey {
			c.Auth = config.Default().Auth
		}
	}})
}

func TestTenantIsolation(t *testing.T) {
	t.Parallel()

	for _, mode := range []config.AuthMode{config.AuthAPIKey, config.AuthTrustedHeader} {
		for _, pair := range [][2]space.ClientID{{"initech", "hooli"}, {"acme", "initech"}, {"initech", "acme"}} {
			name := fmt.Sprintf("%s: %s and %s each see, change and replay only their own", mode, pair[0], pair[1])
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s := isolationServer(t, mode, isolationQuota)
				owner, other := s.tenant(pair[0]), s.tenant(pair[1])
				s.checkIsolation(owner, other)
			})
		}
	}

	t.Run("two clients off the allowlist share the unknown budget while owning separately", func(t *testing.T) {
		t.Parallel()
		s := isolationServer(t, config.AuthAPIKey, `{"clients": {"acme": {}},
			"default": {"concurrency": 50, "live_sandboxes": 100},
			"rate": {"unknown": {"refill_rps": 0.000001, "burst": 2}}}`)
		initech, hooli := s.tenant("initech"), s.tenant("hooli")
		for _, tn := range []tenant{initech, hooli} {
			if r := s.as(tn, "POST", "/v1/sandboxes", pythonBody); r.StatusCode != 201 {
				t.Fatalf("%s's first create = %d %s", tn.id, r.StatusCode, r.body)
			}
		}
		r := s.as(initech, "POST", "/v1/sandboxes", pythonBody)
		p := r.problem(t)
		if r.StatusCode != 429 || p.Bucket != space.BucketClientActivation || p.Client != space.Unknown {
			t.Fatalf("initech's third create on the shared burst of 2 = %d %+v, want 429 on unknown's bucket", r.StatusCode, p)
		}
		if !strings.Contains(p.Detail, "API key's client is not on the allowlist") || strings.Contains(p.Detail, "X-Client-ID") {
			t.Errorf("an api_key caller off the allowlist is told %q", p.Detail)
		}
		var limits api.LimitsBody
		s.as(hooli, "GET", "/v1/limits", "").json(t, &limits)
		if limits.ClientID != "hooli" || limits.Client != space.Unknown || limits.Allowlisted {
			t.Fatalf("hooli's limits = %+v, want its own id on the unknown budget key", limits)
		}
		for _, tn := range []tenant{initech, hooli} {
			var page struct{ Sandboxes []space.Sandbox }
			s.as(tn, "GET", "/v1/sandboxes", "").json(t, &page)
			if len(page.Sandboxes) != 1 || page.Sandboxes[0].Client != tn.id {
				t.Fatalf("%s lists %+v, want only its own one sandbox", tn.id, page.Sandboxes)
			}
		}
	})

	t.Run("the live cap of unknown counts every client off the allowlist", func(t *testing.T) {
		t.Parallel()
		s := isolationServer(t, config.AuthTrustedHeader, `{"clients": {"unknown": {"live_sandboxes": 2, "concurrency": 50}}}`)
		s.create("initech", pythonBody)
		s.create("hooli", pythonBody)
		r := s.do("POST", "/v1/sandboxes", "pied-piper", pythonBody)
		if p := r.problem(t); r.StatusCode != 429 || p.Bucket != space.BucketLiveSandboxCap || p.Client != space.Unknown {
			t.Fatalf("a third client off the allowlist = %d %+v, want the shared live cap", r.StatusCode, p)
		}
	})
}

// checkIsolation runs every /v1 route as owner on owner's things, and as other on
// them, and checks that other never sees, changes or replays what owner made.
func (s *server) checkIsolation(owner, other tenant) {
	t := s.t
	t.Helper()
	created := s.as(owner, "POST", "/v1/sandboxes", pythonBody)
	if created.StatusCode != 201 {
		t.Fatalf("%s create = %d %s", owner.id, created.StatusCode, created.body)
	}
	var sb space.Sandbox
	created.json(t, &sb)
	if sb.Client != owner.id {
		t.Fatalf("the sandbox is owned by %q, want %q", sb.Client, owner.id)
	}
	paused := s.as(owner, "POST", "/v1/sandboxes", pythonBody)
	var pausedSB space.Sandbox
	paused.json(t, &pausedSB)
	if r := s.as(owner, "POST", "/v1/sandboxes/"+pausedSB.ID+"/pause", ""); r.StatusCode != 200 {
		t.Fatalf("pause = %d %s", r.StatusCode, r.body)
	}

	// An operation under an idempotency key.
	key := "same-key-" + testenv.RandomID(4)
	opResp := s.as(owner, "POST", "/v1/sandboxes", pythonBody, "Prefer", async, "Idempotency-Key", key)
	op := s.accepted(opResp, "/v1/operations/")

	// other, on owner's things: 404 for every read and change.
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/sandboxes/" + sb.ID, ""},
		{"POST", "/v1/sandboxes/" + sb.ID + "/pause", ""},
		{"POST", "/v1/sandboxes/" + pausedSB.ID + "/restore", ""},
		{"DELETE", "/v1/sandboxes/" + sb.ID, ""},
		{"GET", "/v1/operations/" + op.ID, ""},
	} {
		if r := s.as(other, c.method, c.path, c.body); r.StatusCode != 404 || r.problem(t).Code != space.ENOTFOUND {
			t.Errorf("%s %s %s of %s's = %d %s, want 404", other.id, c.method, c.path, owner.id, r.StatusCode, r.body)
		}
	}
	if r := s.as(other, "POST", "/v1/sandboxes/"+pausedSB.ID+"/restore", "", "Prefer", async); r.StatusCode != 404 {
		t.Errorf("%s's queued restore of %s's sandbox = %d %s, want 404", other.id, owner.id, r.StatusCode, r.body)
	}
	var page struct{ Sandboxes []space.Sandbox }
	s.as(other, "GET", "/v1/sandboxes", "").json(t, &page)
	if len(page.Sandboxes) != 0 {
		t.Errorf("%s lists %d of %s's sandboxes", other.id, len(page.Sandboxes), owner.id)
	}

	// other replaying owner's key gets an operation of its own, not owner's.
	replay := s.accepted(s.as(other, "POST", "/v1/sandboxes", pythonBody, "Prefer", async, "Idempotency-Key", key), "/v1/operations/")
	if replay.ID == op.ID || replay.Client != other.id || replay.SandboxID == op.SandboxID {
		t.Errorf("%s replaying %s's Idempotency-Key got %+v, want an operation of its own", other.id, owner.id, replay)
	}
	// owner's own replay still returns owner's operation.
	if again := s.accepted(s.as(owner, "POST", "/v1/sandboxes", pythonBody, "Prefer", async, "Idempotency-Key", key), "/v1/operations/"); again.ID != op.ID {
		t.Errorf("%s's own replay got operation %s, want %s", owner.id, again.ID, op.ID)
	}
	done := s.pollAs(owner, "/v1/operations/"+op.ID)
	if done.State != space.OperationSucceeded || done.Sandbox == nil || done.Sandbox.Client != owner.id {
		t.Errorf("%s's operation ended %+v", owner.id, done)
	}
	if r := s.as(other, "GET", "/v1/sandboxes/"+op.SandboxID, ""); r.StatusCode != 404 {
		t.Errorf("%s reading the sandbox of %s's operation = %d, want 404", other.id, owner.id, r.StatusCode)
	}

	// owner, on its own things: every route works.
	if r := s.as(owner, "GET", "/v1/sandboxes/"+sb.ID, ""); r.StatusCode != 200 {
		t.Errorf("%s reading its own sandbox = %d", owner.id, r.StatusCode)
	}
	s.as(owner, "GET", "/v1/sandboxes", "").json(t, &page)
	if len(page.Sandboxes) != 3 {
		t.Errorf("%s lists %d sandboxes, want its 3", owner.id, len(page.Sandboxes))
	}
	if r := s.as(owner, "POST", "/v1/sandboxes/"+pausedSB.ID+"/restore", ""); r.StatusCode != 200 {
		t.Errorf("%s restoring its own sandbox = %d %s", owner.id, r.StatusCode, r.body)
	}
	if r := s.as(owner, "DELETE", "/v1/sandboxes/"+sb.ID, ""); r.StatusCode != 204 {
		t.Errorf("%s deleting its own sandbox = %d %s", owner.id, r.StatusCode, r.body)
	}
}

// pollAs reads the operation at path as tn until it is final.
func (s *server) pollAs(tn tenant, path string) *space.Operation {
	s.t.Helper()
	var op space.Operation
	testenv.Eventually(s.t, 15*time.Second, path+" to finish", func() bool {
		r := s.as(tn, "GET", path, "")
		if r.StatusCode != http.StatusOK {
			s.t.Fatalf("GET %s = %d %s", path, r.StatusCode, r.body)
		}
		r.json(s.t, &op)
		return op.State.Done()
	})
	return &op
}
