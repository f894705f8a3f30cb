package app

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

// lifecycleQuota puts acme on a tier that pauses its sandboxes after a second idle,
// deletes paused ones after two, ends any after a minute, and keeps at most three
// paused; globex terminates its idle ones instead.
const lifecycleQuota = `{"tiers": {"pro": {"concurrency": 50, "live_sandboxes": 100,
		"max_lifetime_seconds": 60, "idle_timeout_seconds": 1, "idle_action": "pause",
		"paused_retention_seconds": 2, "paused_sandboxes": 3}},
	"clients": {"acme": {"tier": "pro"}, "globex": {"tier": "pro", "idle_action": "terminate"}}}`

// lifecycleConfig runs the lifecycle every 100ms.
func lifecycleConfig(c *config.Config) {
	c.Flags.FallbackTier = "pro"
	c.Lifecycle.Interval = 100 * time.Millisecond
}

// sandboxOf reads client's sandbox id through the API.
func (s *server) sandboxOf(client, id string) space.Sandbox {
	s.t.Helper()
	var sb space.Sandbox
	r := s.do("GET", "/v1/sandboxes/"+id, client, "")
	if r.StatusCode != http.StatusOK {
		s.t.Fatalf("GET %s = %d %s", id, r.StatusCode, r.body)
	}
	r.json(s.t, &sb)
	return sb
}

func reason(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func TestLifecycleThroughTheAPI(t *testing.T) {
	t.Parallel()

	t.Run("an untouched sandbox is paused, then deleted after its retention; one kept alive runs on", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: lifecycleQuota, config: lifecycleConfig})
		idle, kept := s.create("acme", nodeBody), s.create("acme", nodeBody)
		if idle.IdleAt == nil || idle.ExpiresAt == nil || idle.ExpiresAt.Sub(idle.CreatedAt) != time.Minute {
			t.Fatalf("a new sandbox: idle_at %v, expires_at %v (created %v); want both, the expiry a minute on", idle.IdleAt, idle.ExpiresAt, idle.CreatedAt)
		}
		r := s.do("POST", "/v1/sandboxes/"+kept.ID+"/keepalive", "acme", `{"timeout_seconds": 30}`)
		var alive space.Sandbox
		r.json(t, &alive)
		if r.StatusCode != http.StatusOK || alive.IdleAt == nil || alive.IdleAt.Sub(time.Now()) < 25*time.Second {
			t.Fatalf("keepalive = %d, idle_at %v; want 200 and the idle action 30 s away", r.StatusCode, alive.IdleAt)
		}
		testenv.Eventually(t, 20*time.Second, "the idle sandbox to be paused by the lifecycle", func() bool {
			sb := s.sandboxOf("acme", idle.ID)
			return sb.State == space.StatePaused && reason(sb.PauseReason) == space.ReasonIdle && sb.IdleAt == nil
		})
		testenv.Eventually(t, 20*time.Second, "the paused sandbox to be deleted after its retention", func() bool {
			sb := s.sandboxOf("acme", idle.ID)
			return sb.State == space.StateTerminated && reason(sb.TerminationReason) == space.ReasonRetention
		})
		if sb := s.sandboxOf("acme", kept.ID); sb.State != space.StateRunning {
			t.Fatalf("the sandbox kept alive for 30 s is %s", sb.State)
		}
		if got := s.metric("space_sandbox_lifecycle_actions_total", `action="pause"`, `reason="idle"`, `tier="pro"`); got != 1 {
			t.Errorf("idle pauses counted %v, want 1", got)
		}
		if got := s.metric("space_sandbox_lifecycle_actions_total", `action="terminate"`, `reason="retention"`, `tier="pro"`); got != 1 {
			t.Errorf("retention deletes counted %v, want 1", got)
		}
	})

	t.Run("a client whose idle action is terminate has its idle sandbox ended", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: lifecycleQuota, config: lifecycleConfig})
		sb := s.create("globex", nodeBody)
		testenv.Eventually(t, 20*time.Second, "the idle sandbox to be terminated", func() bool {
			got := s.sandboxOf("globex", sb.ID)
			return got.State == space.StateTerminated && reason(got.TerminationReason) == space.ReasonIdle
		})
	})

	t.Run("keepalive answers what it cannot do, naming why", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: lifecycleQuota, config: func(c *config.Config) {
			lifecycleConfig(c)
			c.Lifecycle.Interval = time.Hour // nothing paused behind the test's back
		}})
		sb := s.create("acme", nodeBody)
		for _, tc := range []struct {
			body, field string
			code        int
		}{
			{`{"timeout_seconds": 3600}`, "timeout_seconds", http.StatusUnprocessableEntity}, // past the max lifetime
			{`{"timeout_seconds": 0}`, "timeout_seconds", http.StatusBadRequest},
			{`{"timeout": 5}`, "timeout", http.StatusBadRequest},
		} {
			r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/keepalive", "acme", tc.body)
			if p := r.problem(t); r.StatusCode != tc.code || p.Field != tc.field {
				t.Errorf("keepalive %s = %d %+v, want %d naming %s", tc.body, r.StatusCode, p, tc.code, tc.field)
			}
		}
		if r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/keepalive", "globex", ""); r.StatusCode != http.StatusNotFound {
			t.Errorf("another client's keepalive = %d, want 404", r.StatusCode)
		}
		// A gateway in front of the sandbox keeps it alive on the internal listener,
		// under its owner's lifecycle, with no credentials of the owner's.
		r := s.internal("POST", "/internal/v1/sandboxes/"+sb.ID+"/keepalive", `{"timeout_seconds": 40}`)
		var kept space.Sandbox
		r.json(t, &kept)
		if r.StatusCode != http.StatusOK || kept.IdleAt == nil || time.Until(*kept.IdleAt) < 35*time.Second {
			t.Errorf("the gateway's keepalive = %d, idle_at %v; want 200 and the idle action 40 s away", r.StatusCode, kept.IdleAt)
		}
		if r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/pause", "acme", ""); r.StatusCode != http.StatusOK {
			t.Fatalf("pause = %d %s", r.StatusCode, r.body)
		}
		if r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/keepalive", "acme", ""); r.StatusCode != http.StatusConflict {
			t.Errorf("keepalive of a paused sandbox = %d, want 409", r.StatusCode)
		}
	})

	t.Run("the paused cap refuses the fourth pause with a 429 naming paused_sandbox_cap", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: lifecycleQuota, config: func(c *config.Config) {
			lifecycleConfig(c)
			c.Lifecycle.Interval = time.Hour
		}})
		for range 3 {
			sb := s.create("acme", nodeBody)
			if r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/pause", "acme", ""); r.StatusCode != http.StatusOK {
				t.Fatalf("pause = %d %s", r.StatusCode, r.body)
			}
		}
		sb := s.create("acme", nodeBody)
		r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/pause", "acme", "")
		if p := r.problem(t); r.StatusCode != http.StatusTooManyRequests || p.Bucket != space.BucketPausedSandboxCap || !strings.Contains(p.Detail, "3 paused") {
			t.Fatalf("the fourth pause = %d %+v, want a 429 naming paused_sandbox_cap", r.StatusCode, p)
		}
	})

	t.Run("a replica killed while the lifecycle pauses leaves nothing transitional, and nothing orphaned", func(t *testing.T) {
		t.Parallel()
		// Snapshots take the cold start's 1.5 s: long enough for the kill to land in
		// the middle of the idle pauses.
		env := replicaEnv(t, quotaFlags(lifecycleQuota, ""), map[string]string{
			"SPACE_FALLBACK_TIER":        "pro",
			"SPACE_SIMULATED_COLD_START": "1500ms",
			"SPACE_SIMULATED_TIMEOUT":    "4s",
			"SPACE_LIFECYCLE_INTERVAL":   "100ms",
			"SPACE_RECONCILE_INTERVAL":   "200ms",
			"SPACE_RECONCILE_GRACE":      "500ms",
		})
		a := startReplica(t, "a", env)
		f := newFleet(t, env)
		for range 4 {
			if code, _ := post(a.public, "acme", ""); code != http.StatusCreated {
				t.Fatalf("create = %d", code)
			}
		}
		testenv.Eventually(t, 30*time.Second, "an idle pause to be under way", func() bool {
			return f.count("SELECT count(*) FROM sandboxes WHERE state = 'pausing'") > 0
		})
		a.kill()
		b := startReplica(t, "b", env)
		_ = b
		testenv.Eventually(t, time.Minute, "the cut pauses to be settled, and the rest taken", func() bool {
			sbs, _ := f.unsettled()
			return sbs == 0 && f.count("SELECT count(*) FROM sandboxes WHERE state = 'running'") == 0
		})
		testenv.Eventually(t, 30*time.Second, "a sweep to leave no orphan", func() bool {
			orphans, missing := f.orphans()
			return len(orphans) == 0 && len(missing) == 0
		})
	})
}
