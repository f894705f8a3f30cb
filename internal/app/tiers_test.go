package app

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

// threeTiers has distinct numbers on every field, each concurrency below its burst
// below its live cap, so that each can be measured on its own. Rates barely refill:
// what a test takes stays taken.
const threeTiers = `{
	"tiers": {
		"free":       {"refill_rps": 0.000001, "burst": 2, "concurrency": 1, "live_sandboxes": 3},
		"pro":        {"refill_rps": 0.000001, "burst": 4, "concurrency": 2, "live_sandboxes": 6},
		"enterprise": {"refill_rps": 0.000001, "burst": 6, "concurrency": 3, "live_sandboxes": 9}
	},
	"clients": {
		"on-free":       {"tier": "free"},
		"on-pro":        {"tier": "pro"},
		"on-enterprise": {"tier": "enterprise"},
		"pro-more-live": {"tier": "pro", "live_sandboxes": 8},
		"on-gold":       {"tier": "gold"}
	}
}`

const nodeBody = `{"template":"node-22","cpu_millis":1000,"memory_mib":1024,"disk_gib":5}`

// tierNumbers are one client's enforced numbers, as reported or as measured.
type tierNumbers struct {
	Tier                         string
	Burst, Concurrency, LiveCaps int
}

// limitsOf is what GET /v1/limits reports for client.
func (s *server) limitsOf(base, client string) (tierNumbers, map[string]any) {
	s.t.Helper()
	var body struct {
		Tier             string `json:"tier"`
		TierSource       string `json:"tier_source"`
		FallbackReason   string `json:"fallback_reason"`
		ClientActivation struct {
			Burst int `json:"burst"`
		} `json:"client_activation"`
		Concurrency   int            `json:"concurrency"`
		LiveSandboxes int            `json:"live_sandboxes"`
		Sources       map[string]any `json:"sources"`
	}
	r := s.request(base, "GET", "/v1/limits", client, "")
	if r.StatusCode != http.StatusOK {
		s.t.Fatalf("limits of %s = %d %s", client, r.StatusCode, r.body)
	}
	r.json(s.t, &body)
	body.Sources["tier_source"], body.Sources["fallback_reason"] = body.TierSource, body.FallbackReason
	return tierNumbers{body.Tier, body.ClientActivation.Burst, body.Concurrency, body.LiveSandboxes}, body.Sources
}

// tiersTable is what GET /v1/tiers reports, by tier.
func (s *server) tiersTable(client string) map[string]tierNumbers {
	s.t.Helper()
	var body struct {
		FallbackTier string `json:"fallback_tier"`
		Tiers        []struct {
			Name             string `json:"name"`
			ClientActivation struct {
				Burst int `json:"burst"`
			} `json:"client_activation"`
			Concurrency   int `json:"concurrency"`
			LiveSandboxes int `json:"live_sandboxes"`
		} `json:"tiers"`
	}
	r := s.do("GET", "/v1/tiers", client, "")
	if r.StatusCode != http.StatusOK {
		s.t.Fatalf("tiers = %d %s", r.StatusCode, r.body)
	}
	r.json(s.t, &body)
	out := map[string]tierNumbers{}
	for _, t := range body.Tiers {
		out[t.Name] = tierNumbers{t.Name, t.ClientActivation.Burst, t.Concurrency, t.LiveSandboxes}
	}
	if body.FallbackTier != "free" {
		s.t.Fatalf("fallback tier %q, want free", body.FallbackTier)
	}
	return out
}

// measure finds client's enforced numbers through the API alone: cold creates held in
// flight until the rest are refused (concurrency), then cold creates until a 429
// (burst), then warm ones, which cost no budget, until a 429 (the live cap).
func (s *server) measure(client string) tierNumbers {
	s.t.Helper()
	const inFlight = 10
	release := s.m.Substrate.(*substrate.Simulated).Gate(substrate.OpStartCold)
	var held sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	for range inFlight {
		held.Go(func() {
			r := s.do("POST", "/v1/sandboxes", client, nodeBody)
			key := fmt.Sprint(r.StatusCode)
			if r.StatusCode == http.StatusTooManyRequests {
				key = string(r.problem(s.t).Bucket)
			}
			mu.Lock()
			codes[key]++
			mu.Unlock()
		})
	}
	var leases int64
	testenv.Eventually(s.t, 30*time.Second, client+"'s creates to be held or refused", func() bool {
		n, err := s.m.Redis.ZCard(testenv.Context(s.t), s.m.RedisPrefix+":client_concurrency:"+client).Result()
		if err != nil {
			s.t.Fatalf("read %s's leases: %v", client, err)
		}
		mu.Lock()
		defer mu.Unlock()
		leases = n
		// A create over the cap is refused by it, or, once the bucket's tokens are
		// known held by the creates on their way, by the bucket from memory.
		return int(n)+codes[string(space.BucketClientConcurrency)]+codes[string(space.BucketClientActivation)] == inFlight
	})
	release()
	held.Wait()
	if codes["201"] != int(leases) {
		s.t.Fatalf("%s: %v with %d held, want every held create made", client, codes, leases)
	}
	until := func(body string, bucket space.Bucket) int {
		for n := 0; n < 100; n++ {
			r := s.do("POST", "/v1/sandboxes", client, body)
			if r.StatusCode == http.StatusCreated {
				continue
			}
			if p := r.problem(s.t); r.StatusCode != http.StatusTooManyRequests || p.Bucket != bucket {
				s.t.Fatalf("%s: create = %d %+v, want a 429 of %s", client, r.StatusCode, p, bucket)
			}
			return n
		}
		s.t.Fatalf("%s: never refused by %s", client, bucket)
		return 0
	}
	burst := int(leases) + until(nodeBody, space.BucketClientActivation)
	live := burst + until(pythonBody, space.BucketLiveSandboxCap)
	return tierNumbers{Burst: burst, Concurrency: int(leases), LiveCaps: live}
}

func TestTiersThroughTheAPI(t *testing.T) {
	t.Parallel()
	for _, topo := range []struct {
		name  string
		redis func(t *testing.T) map[string]string
	}{
		{"standalone", func(t *testing.T) map[string]string {
			return map[string]string{"SPACE_REDIS_ADDRS": testenv.RedisAddr(t)}
		}},
		{"cluster", func(t *testing.T) map[string]string {
			return map[string]string{"SPACE_REDIS_ADDRS": testenv.RedisClusterAddrs(t)[0]}
		}},
	} {
		t.Run("each client is served exactly its tier's numbers, as /v1/limits and /v1/tiers report them ("+topo.name+")", func(t *testing.T) {
			t.Parallel()
			s := startServer(t, e2eOptions{
				quota:      threeTiers,
				poolShapes: `[{"template": "python-3.12", "cpu_millis": 1000, "memory_mib": 2048, "disk_gib": 10, "target": 40}]`,
				config: func(c *config.Config) {
					c.Redis = redisSettings(t, topo.redis(t))
					c.Flags.FallbackTier = "free"
				},
			})
			testenv.Eventually(t, time.Minute, "the warm pool to fill", func() bool {
				return s.metric("space_pool_ready_slots", `shape="python-3.12/1000m/2048Mi/10Gi"`) == 40
			})
			table := s.tiersTable("on-free")
			for client, want := range map[string]struct {
				tier    string
				numbers tierNumbers
				sources map[string]any
			}{
				"on-free":       {"free", table["free"], map[string]any{"tier_source": "client", "live_sandboxes": "tier"}},
				"on-pro":        {"pro", table["pro"], map[string]any{"tier_source": "client", "concurrency": "tier"}},
				"on-enterprise": {"enterprise", table["enterprise"], map[string]any{"tier_source": "client", "client_activation": "tier"}},
				// One field overridden, the tier's others kept.
				"pro-more-live": {"pro", tierNumbers{"pro", table["pro"].Burst, table["pro"].Concurrency, 8},
					map[string]any{"live_sandboxes": "client", "concurrency": "tier", "client_activation": "tier"}},
				// A tier the table lacks: the floor, with the reason.
				"on-gold": {"free", table["free"], map[string]any{"tier_source": "fallback", "fallback_reason": "unknown_tier", "concurrency": "fallback"}},
			} {
				reported, sources := s.limitsOf(s.m.PublicURL(), client)
				want.numbers.Tier = want.tier
				if reported != want.numbers {
					t.Errorf("%s: /v1/limits reports %+v, /v1/tiers %+v", client, reported, want.numbers)
				}
				for k, v := range want.sources {
					if sources[k] != v {
						t.Errorf("%s: %s is %v, want %v (all: %v)", client, k, sources[k], v, sources)
					}
				}
				measured := s.measure(client)
				measured.Tier = reported.Tier
				if measured != reported {
					t.Errorf("%s: served %+v, reported %+v", client, measured, reported)
				}
			}
			if got := s.metric("space_tier_fallback_total", `reason="unknown_tier"`); got < 1 {
				t.Errorf("the fall to the floor was not counted: %v", got)
			}
		})
	}

	t.Run("a tier's lifecycle, and a client's override of it, read back from /v1/tiers and /v1/limits with their sources", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{
			quota: `{
				"tiers": {
					"free": {"max_lifetime_seconds": 3600},
					"pro":  {"max_lifetime_seconds": 86400, "idle_timeout_seconds": 900, "idle_action": "pause",
					         "paused_retention_seconds": 604800, "paused_sandboxes": 100}
				},
				"clients": {
					"on-pro":    {"tier": "pro"},
					"pro-short": {"tier": "pro", "idle_timeout_seconds": 60, "idle_action": "terminate", "paused_sandboxes": 0}
				}
			}`,
			config: func(c *config.Config) { c.Flags.FallbackTier = "free" },
		})
		type report struct {
			Name      string         `json:"name"`
			Lifecycle map[string]any `json:"lifecycle"`
			Sources   map[string]any `json:"sources"`
		}
		var tiers struct {
			Tiers []report `json:"tiers"`
		}
		if r := s.do("GET", "/v1/tiers", "on-pro", ""); r.StatusCode != http.StatusOK {
			t.Fatalf("tiers = %d %s", r.StatusCode, r.body)
		} else {
			r.json(t, &tiers)
		}
		rows := map[string]report{}
		for _, row := range tiers.Tiers {
			rows[row.Name] = row
		}
		limits := func(client string) report {
			var body report
			r := s.do("GET", "/v1/limits", client, "")
			if r.StatusCode != http.StatusOK {
				t.Fatalf("limits of %s = %d %s", client, r.StatusCode, r.body)
			}
			r.json(t, &body)
			return body
		}
		pro := map[string]any{"max_lifetime_seconds": 86400.0, "idle_timeout_seconds": 900.0, "idle_action": "pause",
			"paused_retention_seconds": 604800.0, "paused_sandboxes": 100.0}
		fromTier := map[string]any{"max_lifetime_seconds": "tier", "idle_timeout_seconds": "tier", "idle_action": "tier",
			"paused_retention_seconds": "tier", "paused_sandboxes": "tier"}
		for name, got := range map[string]report{"/v1/tiers' pro": rows["pro"], "on-pro's /v1/limits": limits("on-pro")} {
			if fmt.Sprint(got.Lifecycle) != fmt.Sprint(pro) {
				t.Errorf("%s: lifecycle %v, want %v", name, got.Lifecycle, pro)
			}
			for field, want := range fromTier {
				if got.Sources[field] != want {
					t.Errorf("%s: sources.%s = %v, want %v", name, field, got.Sources[field], want)
				}
			}
		}
		if free := rows["free"]; fmt.Sprint(free.Lifecycle) != fmt.Sprint(map[string]any{"max_lifetime_seconds": 3600.0,
			"idle_timeout_seconds": nil, "idle_action": nil, "paused_retention_seconds": nil, "paused_sandboxes": nil}) ||
			free.Sources["idle_timeout_seconds"] != "env" {
			t.Errorf("/v1/tiers' free: lifecycle %v from %v", free.Lifecycle, free.Sources)
		}
		short := limits("pro-short")
		want := map[string]any{"max_lifetime_seconds": 86400.0, "idle_timeout_seconds": 60.0, "idle_action": "terminate",
			"paused_retention_seconds": 604800.0, "paused_sandboxes": nil}
		if fmt.Sprint(short.Lifecycle) != fmt.Sprint(want) {
			t.Errorf("pro-short: lifecycle %v, want %v", short.Lifecycle, want)
		}
		for field, want := range map[string]any{"max_lifetime_seconds": "tier", "idle_timeout_seconds": "client", "idle_action": "client",
			"paused_retention_seconds": "tier", "paused_sandboxes": "client"} {
			if short.Sources[field] != want {
				t.Errorf("pro-short: sources.%s = %v, want %v", field, short.Sources[field], want)
			}
		}
	})

	t.Run("two replicas agree on every client's tier and together admit exactly its burst", func(t *testing.T) {
		t.Parallel()
		env := replicaEnv(t, quotaFlags(threeTiers, ""), map[string]string{"SPACE_FALLBACK_TIER": "free"})
		replicas := []*replica{startReplica(t, "a", env), startReplica(t, "b", env)}
		s := &server{t: t}
		for client, tier := range map[string]string{"on-free": "free", "on-pro": "pro", "on-enterprise": "enterprise", "on-gold": "free"} {
			var first tierNumbers
			for i, r := range replicas {
				got, _ := s.limitsOf(r.public, client)
				if got.Tier != tier || (i > 0 && got != first) {
					t.Fatalf("%s: replica %d reports %+v, replica 0 %+v; want both on %s", client, i, got, first, tier)
				}
				first = got
			}
			// Each sender creates until the burst has been admitted somewhere, then ten
			// more times: a fixed number of tries would end early on a loaded machine,
			// its tries all refused client_concurrency while the one create holding the
			// tier's single place was still starting. 30 s bounds a burst never reached.
			var (
				mu       sync.Mutex
				answers  = map[string]int{} // status, and a refusal's code and bucket
				created  int
				wg       sync.WaitGroup
				deadline = time.Now().Add(30 * time.Second)
			)
			for _, r := range replicas {
				for range 3 {
					wg.Go(func() {
						for more := 0; more < 10 && time.Now().Before(deadline); {
							a := s.answerOf(r.public, "POST", "/v1/sandboxes", client, nodeBody)
							mu.Lock()
							answers[a]++
							if a == "201" {
								created++
							}
							if created >= first.Burst {
								more++
							}
							mu.Unlock()
						}
					})
				}
			}
			wg.Wait()
			if got := answers["201"]; got != first.Burst {
				t.Errorf("%s: the replicas admitted %d, want its tier's burst of %d; answers %v", client, got, first.Burst, answers)
			}
		}
	})
}
