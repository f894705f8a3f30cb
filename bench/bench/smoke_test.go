package bench

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/testenv"
)

// TestSmoke runs every scenario of `make bench` once, with tiny durations, against the
// real services, so that the driver cannot rot between benchmark runs. It asserts
// what must hold whatever the machine's speed, never a timing: the replicas admit
// exactly the cluster burst plus its refill, the well-behaved client of the flood is
// never refused, each HTTP load gets the answers it is built to get, and so on.
func TestSmoke(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	env := &Env{
		AdminURL:     testenv.DatabaseURL(t),
		RedisAddr:    testenv.RedisAddr(t),
		ClusterAddrs: testenv.RedisClusterAddrs(t),
		Templates:    filepath.Join(root, "deploy", "demo", "templates.json"),
		Module:       root,
		Dir:          t.TempDir(),
	}
	env.ProfileDir = filepath.Join(env.Dir, "profiles")
	if err := os.Mkdir(env.ProfileDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The space-api binary builds while the scenarios that need no server run.
	built := make(chan error, 1)
	go func() {
		env.SpaceAPI = filepath.Join(env.Dir, "space-api")
		// Without -race even under `go test -race`: the server is not what this test
		// checks, and a race build of it links and starts several times slower.
		cmd := exec.CommandContext(ctx, "go", "build", "-o", env.SpaceAPI, "./cmd/space-api")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			err = &buildError{err: err, out: string(out)}
		}
		built <- err
	}()

	// The lifecycle's round and the migrations need only Postgres: they run beside the
	// build too.
	redisOnly, err := Run(ctx, env, Config{Runs: 1, Quick: true, Only: []string{"script", "decisions", "keys", "lifecycle", "migrations"}})
	if berr := <-built; berr != nil {
		t.Fatalf("go build ./cmd/space-api: %v", berr)
	}
	if err != nil {
		t.Fatal(err)
	}
	// The pool's trace runs on a fast clock, where a stall of the machine is minutes
	// of simulated time: it runs once the build no longer takes the cores.
	pooled, err := Run(ctx, env, Config{Runs: 1, Quick: true, Only: []string{"pool"}})
	if err != nil {
		t.Fatal(err)
	}
	redisOnly.Pool = pooled.Pool
	servers, err := Run(ctx, env, Config{Runs: 1, Quick: true, Only: []string{"http", "flood", "overload", "replicas", "soak", "scale"}})
	if err != nil {
		t.Fatal(err)
	}
	// The fleet last: a kube-apiserver, kube-scheduler and kwok of its own.
	fleeted, err := Run(ctx, env, Config{Runs: 1, Quick: true, Only: []string{"fleet"}})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("the fleet creates every sandbox on pods it counts, each one ready", func(t *testing.T) {
		f := fleeted.Fleet
		run := f.Run
		if run.Warm+run.Cold != f.Sandboxes || run.Warm == 0 {
			t.Errorf("%d warm + %d cold, want %d with some warm", run.Warm, run.Cold, f.Sandboxes)
		}
		// Every cold start made a pod while the creates ran; the pool's refills may
		// add more, never fewer.
		if run.PodsCreated < run.Cold {
			t.Errorf("%d pods created for %d cold starts", run.PodsCreated, run.Cold)
		}
		if !(run.ReadyP50 > 0) || run.ReadyP99 < run.ReadyP50 || !(run.PodRate > 0) {
			t.Errorf("ready p50 %s p99 %s, %.1f pods/s", run.ReadyP50, run.ReadyP99, run.PodRate)
		}
		if run.PerActivationResource["POST pods"] <= 0 || run.PerActivation["POST"] <= 0 || run.PerActivation["GET"] <= 0 {
			t.Errorf("API requests per sandbox %v: want pod creates and gets among them", run.PerActivationResource)
		}
		if !(run.Dispatched > 0) || run.Rejected != 0 {
			t.Errorf("the API server's priority and fairness dispatched %.0f and rejected %.0f requests over the creates, want some and none", run.Dispatched, run.Rejected)
		}
		if !(run.ColdP50 > 0) || run.ColdP99 < run.ColdP50 || !(f.FloorP50 > 0) || f.FloorP99 < f.FloorP50 {
			t.Errorf("cold creates answered p50 %s p99 %s; the floor's pods ready p50 %s p99 %s", run.ColdP50, run.ColdP99, f.FloorP50, f.FloorP99)
		}
	})

	t.Run("the fleet makes one pod an activation through a replica's kill, pauses and restores, and settles with nothing orphaned", func(t *testing.T) {
		f := fleeted.Fleet
		acc, cy := f.Account, f.Cycle
		if acc.Restores != f.Pauses || f.Pauses == 0 || !(cy.RestoreP50 > 0) {
			t.Errorf("%d restores of %d paused, restore p50 %s", acc.Restores, f.Pauses, cy.RestoreP50)
		}
		if acc.ColdStarts != f.Run.Cold || acc.SlotsWarmed < f.Pool+f.Run.Warm {
			t.Errorf("%d cold starts (the creates counted %d) and %d slots warmed, want at least the pool's %d and the %d adopted", acc.ColdStarts, f.Run.Cold, acc.SlotsWarmed, f.Pool, f.Run.Warm)
		}
		if acc.PerActivation() != 1 || len(acc.Extra) != 0 {
			t.Errorf("%d pods for %d activations; extra: %v", acc.Pods, acc.ColdStarts+acc.SlotsWarmed+acc.Restores, acc.Extra)
		}
		if acc.Unsettled != "" {
			t.Errorf("not settled %s after the restores: %s", acc.Settled, acc.Unsettled)
		}
	})

	t.Run("script cost is measured for every implementation and path", func(t *testing.T) {
		for _, c := range redisOnly.Script.Cells {
			if len(c.Usec) != 1 || !(c.Usec[0] > 0) {
				t.Errorf("%s/%s: Redis µs per call %v", c.Impl, c.Path, c.Usec)
			}
			if !(c.Instructions > 0) {
				t.Errorf("%s/%s: Redis instructions per call %v", c.Impl, c.Path, c.Instructions)
			}
		}
	})
	// Instruction counts do not depend on the load, so their order can be asserted:
	// each pair differs by far more than the count moves between runs (a few percent).
	t.Run("a call that does more costs Redis more instructions", func(t *testing.T) {
		s := redisOnly.Script
		for _, tc := range []struct{ name, lessImpl, lessPath, moreImpl, morePath string }{
			{"a refusal writes nothing", implSpace, "reject", implSpace, "allow"},
			{"one key is less than two", implSpaceOneKey, "allow", implSpace, "allow"},
			{"a tier's reserve is one key more", implSpace, "allow", implSpaceReserved, "allow"},
		} {
			less, more := s.Cell(tc.lessImpl, tc.lessPath).Instructions, s.Cell(tc.moreImpl, tc.morePath).Instructions
			if !(less < more) {
				t.Errorf("%s: %s/%s %.0f instructions, %s/%s %.0f", tc.name, tc.lessImpl, tc.lessPath, less, tc.moreImpl, tc.morePath, more)
			}
		}
	})
	t.Run("decisions are made on standalone Redis and on the cluster", func(t *testing.T) {
		if len(redisOnly.Decision.Cells) != 12 {
			t.Fatalf("%d cells, want 2 topologies × 3 goroutine counts × 2 implementations", len(redisOnly.Decision.Cells))
		}
		for _, c := range redisOnly.Decision.Cells {
			if len(c.PerSec) != 1 || !(c.PerSec[0] > 0) {
				t.Errorf("%s %s %d: decisions/s %v", c.Impl, c.Topology, c.Goroutines, c.PerSec)
			}
			if (c.Goroutines == 1) != (len(c.P50) == 1) || (len(c.P50) == 1 && !(c.P50[0] > 0)) {
				t.Errorf("%s %s %d: p50 %v, want one at 1 goroutine only", c.Impl, c.Topology, c.Goroutines, c.P50)
			}
			// One goroutine never waits for another's round trip: a call a decision.
			if len(c.PerCall) != 1 || (c.Goroutines == 1 && c.PerCall[0] != 1) || c.PerCall[0] < 1 {
				t.Errorf("%s %s %d: decisions a script call %v", c.Impl, c.Topology, c.Goroutines, c.PerCall)
			}
			// Every decision costs Redis's main thread something, on whichever master
			// holds its slot.
			if len(c.RedisCPU) != 1 || !(c.RedisCPU[0] > 0) {
				t.Errorf("%s %s %d: Redis CPU a decision %v µs", c.Impl, c.Topology, c.Goroutines, c.RedisCPU)
			}
		}
	})
	t.Run("decisions from many goroutines at once cost Redis less each than one at a time", func(t *testing.T) {
		s := redisOnly.Script
		if bi := s.Batched; bi == nil || bi.Calls == 0 || !(bi.Instructions > 0) || !(bi.Instructions < s.Cell(implSpace, "allow").Instructions) {
			t.Errorf("from many goroutines %+v, one at a time %.0f instructions", bi, s.Cell(implSpace, "allow").Instructions)
		}
	})
	t.Run("idle client keys take memory, are decided on and expire", func(t *testing.T) {
		k := redisOnly.Keys
		if !(k.BytesPerKey > 16) || !(k.BytesPerKeyAtMax > 16) {
			t.Errorf("bytes per key %.1f, at the largest count %.1f: a key holds at least its 16-byte state", k.BytesPerKey, k.BytesPerKeyAtMax)
		}
		// The scenario itself fails when the keys are not gone within 30 s.
		if k.ExpiryPeak <= k.ExpiryBaseline || k.ExpiryGoneAfter <= 0 {
			t.Errorf("DBSIZE %d after making %d keys over a baseline of %d, gone after %s", k.ExpiryPeak, k.ExpiryKeys, k.ExpiryBaseline, k.ExpiryGoneAfter)
		}
		for _, n := range k.Counts {
			if len(k.PerSec[n]) != 1 || !(k.PerSec[n][0] > 0) || len(k.PeerPerSec[n]) != 1 || !(k.PeerPerSec[n][0] > 0) {
				t.Errorf("%d keys: decisions/s %v, redis_rate's %v", n, k.PerSec[n], k.PeerPerSec[n])
			}
		}
	})
	t.Run("each HTTP load gets the answers it is built to get", func(t *testing.T) {
		h := servers.HTTP
		for _, row := range append([]*HTTPRow{h.Warm, h.Cold}, h.Refusals.Rows()...) {
			if row.Requests == 0 || len(row.Unexpected) > 0 {
				t.Errorf("%s: %d requests, unexpected answers %v (want only %q)", row.Name, row.Requests, row.Unexpected, row.Outcome)
			}
		}
		if h.OnRequests == 0 || h.OffRequests == 0 || len(h.OnOffUnexpected) > 0 {
			t.Errorf("admission on/off: %d and %d creates, unexpected answers %v", h.OnRequests, h.OffRequests, h.OnOffUnexpected)
		}
	})
	t.Run("the refusal ceiling sets space-api beside both peers in every run", func(t *testing.T) {
		f := servers.HTTP.Refusals
		for _, row := range f.Rows() {
			if len(row.RPS) != 1 || !(row.RPS[0] > 0) || !(row.P50[0] > 0) {
				t.Errorf("%s: refused creates/s %v, p50 %v ms", row.Name, row.RPS, row.P50)
			}
		}
		var target *Target
		for _, tg := range servers.Targets() {
			if strings.HasPrefix(tg.Name, "refused creates/s ≥ 1.1× chi + redis_rate") {
				target = &tg
			}
		}
		if target == nil || strings.Contains(target.Measured, "n/a") {
			t.Errorf("the targets lack the ratio to chi + redis_rate: %+v", servers.Targets())
		}
	})
	t.Run("the quiet neighbour is measured alone and beside both floods, every run, on space-api in both modes and the peer", func(t *testing.T) {
		n := servers.Flood.Neighbour
		if n == nil {
			t.Fatal("the flood scenario has no quiet neighbour")
		}
		// The burst is measured only when the quiet client's process was up within the
		// flood's first Settle, which a busy machine does not promise: it is reported,
		// with no target, and checked present.
		for name, v := range map[string][]float64{"burst": n.Space.Burst, "peer burst": n.Peer.Burst} {
			if len(v) != 1 || v[0] < 0 {
				t.Errorf("quiet neighbour %s: %v", name, v)
			}
		}
		for name, v := range map[string][]float64{"alone": n.Space.Alone, "fixed": n.Space.Fixed, "saturated": n.Space.Saturated,
			"peer alone": n.Peer.Alone, "peer fixed": n.Peer.Fixed, "peer saturated": n.Peer.Saturated,
			"sent alone": n.Space.Sent.Alone, "sent beside the fixed flood": n.Space.Sent.Fixed, "sent beside wrk": n.Space.Sent.Saturated,
			"fixed flood rps": n.Space.FixedFloodRPS, "saturating flood rps": n.Space.SaturatedFloodRPS,
			"peer fixed flood rps": n.Peer.FixedFloodRPS, "peer saturating flood rps": n.Peer.SaturatedFloodRPS,
			"api_key alone": n.APIKey.Alone, "api_key fixed": n.APIKey.Fixed, "api_key saturated": n.APIKey.Saturated,
			"api_key saturating flood rps": n.APIKey.SaturatedFloodRPS} {
			if len(v) != 1 || !(v[0] > 0) {
				t.Errorf("quiet neighbour %s: %v", name, v)
			}
		}
		found := 0
		for _, tg := range servers.Targets() {
			if (strings.HasPrefix(tg.Name, "a quiet neighbour's p99") || strings.HasPrefix(tg.Name, "the same in api_key mode")) && !strings.Contains(tg.Measured, "n/a") {
				found++
			}
		}
		if found != 2 {
			t.Errorf("%d quiet-neighbour ratio targets, want 2 (beside wrk, in each mode): %+v", found, servers.Targets())
		}
		// The api_key arms were answered by key: quiet creates made, none unauthenticated.
		if n.APIKey.Outcomes["201"] == 0 {
			t.Errorf("the quiet client's answers in api_key mode: %v", n.APIKey.Outcomes)
		}
		for outcome := range n.APIKey.Outcomes {
			if strings.HasPrefix(outcome, "401") {
				t.Errorf("the quiet client's answers in api_key mode: %v", n.APIKey.Outcomes)
			}
		}
	})
	t.Run("the quiet neighbour's creates are read back from space-api's log and the machine's CPU is split by process", func(t *testing.T) {
		n := servers.Flood.Neighbour
		// The alone and wrk arms read the same creates on both sides: every create the
		// quiet client sent is read back from the server's log, with a time inside the
		// server. (Which of the two p99s is the larger is a timing, not checked: the
		// server reads its clock after its write, which on busy cores can come a
		// scheduling slice after the client read the answer.)
		for _, arm := range []struct {
			name         string
			server       []float64
			sent, logged []float64
		}{{"alone", n.Space.Server.Alone, n.Space.Sent.Alone, n.Space.Logged.Alone},
			{"beside wrk", n.Space.Server.Saturated, n.Space.Sent.Saturated, n.Space.Logged.Saturated}} {
			if len(arm.server) != 1 || !(arm.server[0] > 0) || len(arm.logged) != 1 || arm.logged[0] != arm.sent[0] {
				t.Errorf("%s: p99 inside space-api %v ms; %v of the %v creates sent read back from its log", arm.name, arm.server, arm.logged, arm.sent)
			}
		}
		if len(n.Space.Server.Fixed) != 1 || len(n.Peer.Server.Alone) != 0 {
			t.Errorf("p99 inside the server beside the fixed flood %v; the peer, which logs no requests, %v", n.Space.Server.Fixed, n.Peer.Server.Alone)
		}
		// Every quiet create is booked, charged, started and finished: each of those
		// steps waited a little in every arm of space-api, in both modes; the peer
		// has no steps to read.
		for _, a := range []struct {
			name        string
			steps, slow []ArmSet
		}{{"space-api", n.Space.Steps, n.Space.SlowSteps}, {"space-api, api_key", n.APIKey.Steps, n.APIKey.SlowSteps}} {
			if len(a.steps) != len(activationSteps) || len(a.slow) != len(activationSteps) {
				t.Fatalf("%s: %d activation steps read, %d shares of slow waits, want %d", a.name, len(a.steps), len(a.slow), len(activationSteps))
			}
			for i, set := range a.slow {
				for arm, v := range [][]float64{set.Alone, set.Fixed, set.Saturated} {
					if len(v) != 1 || v[0] < 0 || v[0] > 100 {
						t.Errorf("%s: a create's waits over 1 ms on %s in arm %d: %v%%", a.name, activationSteps[i], arm, v)
					}
				}
			}
			for i, step := range activationSteps[1:] {
				set := a.steps[i+1]
				for arm, v := range [][]float64{set.Alone, set.Fixed, set.Saturated} {
					if len(v) != 1 || !(v[0] > 0) {
						t.Errorf("%s: a create's mean wait on %s in arm %d: %v ms", a.name, step, arm, v)
					}
				}
			}
		}
		if len(n.Peer.Steps) != len(activationSteps) || len(n.Peer.Steps[1].Alone) != 0 {
			t.Errorf("the peer's activation steps %+v, want none read", n.Peer.Steps)
		}
		for _, a := range n.servers() {
			for i, busy := range [][]float64{a.arms.Busy.Alone, a.arms.Busy.Fixed, a.arms.Busy.Saturated} {
				steal := [][]float64{a.arms.Steal.Alone, a.arms.Steal.Fixed, a.arms.Steal.Saturated}[i]
				if len(busy) != 1 || len(steal) != 1 || !(busy[0] > 0) || steal[0] < 0 || busy[0]+steal[0] > 100.0001 {
					t.Errorf("%s arm %d: CPU busy %v%%, stolen %v%%", a.name, i, busy, steal)
				}
			}
			// Beside the fixed flood the server answers thousands of creates a second and
			// the driver sends them: both used CPU.
			for i, user := range cpuUserNames[:2] {
				if len(a.arms.Cores) != len(cpuUserNames) || len(a.arms.Cores[i].Fixed) != 1 || !(a.arms.Cores[i].Fixed[0] > 0) {
					t.Errorf("%s: cores used by %s beside the fixed flood: %+v", a.name, user, a.arms.Cores)
				}
			}
		}
	})
	t.Run("the overload scenario measures each server's capacity, floods it open loop past it beside a quiet client, and again beside a slowloris", func(t *testing.T) {
		o := servers.Overload
		if o == nil {
			t.Fatal("no overload result")
		}
		for _, s := range o.servers() {
			for name, v := range map[string][]float64{"capacity": s.s.Capacity, "the flooder alone": s.s.Reference, "the quiet client alone": s.s.Alone} {
				if len(v) != 1 || !(v[0] > 0) {
					t.Errorf("%s: %s %v", s.name, name, v)
				}
			}
			// What each flood's generator and the server did is counted, never timed:
			// some of its creates were sent and answered over the quiet client's arm,
			// the flooder was both admitted and refused, the quiet client answered.
			refused := "429 client_activation"
			if s.s == &o.Peer {
				refused = "429"
			}
			for _, arms := range [][]*OverloadArm{s.s.Plain, s.s.Slow} {
				if len(arms) != len(o.Multiples) {
					t.Fatalf("%s: %d floods, want one for each of %v", s.name, len(arms), o.Multiples)
				}
				for _, a := range arms {
					for name, v := range map[string][]float64{"asked": a.Asked, "offered": a.Offered, "answered": a.Answered, "quiet p99": a.QuietP99, "quiet ratio": a.QuietRatio} {
						if len(v) != 1 || !(v[0] > 0) {
							t.Errorf("%s at %d×C: %s %v", s.name, a.Multiple, name, v)
						}
					}
					if len(a.Admitted) != 1 || len(a.Goodput) != 1 || len(a.QuietSuccess) != 1 || len(a.RunQueue) != 1 {
						t.Errorf("%s at %d×C: admitted %v, goodput %v, quiet success %v, run queue %v: want one each", s.name, a.Multiple, a.Admitted, a.Goodput, a.QuietSuccess, a.RunQueue)
					}
					if a.FloodOutcomes["201"] == 0 || a.FloodOutcomes[refused] == 0 {
						t.Errorf("%s at %d×C: the flood's answers %v, want some 201 and some %s", s.name, a.Multiple, a.FloodOutcomes, refused)
					}
					if a.QuietOutcomes["201"] == 0 {
						t.Errorf("%s at %d×C: the quiet client's answers %v, want 201s", s.name, a.Multiple, a.QuietOutcomes)
					}
				}
				if s.s == &o.Space {
					// -profile: space-api's CPU over each flood's window, a profile
					// go tool pprof reads (gzipped protobuf).
					for _, a := range arms {
						suffix := ""
						if &arms[0] == &s.s.Slow[0] {
							suffix = "-slowloris"
						}
						// The name ends in the time of day (HHMMSS): a plain flood's
						// pattern must not match the slowloris one's.
						found, _ := filepath.Glob(filepath.Join(env.ProfileDir, fmt.Sprintf("overload-%dxC%s-[0-9][0-9][0-9][0-9][0-9][0-9].pprof", a.Multiple, suffix)))
						if len(found) != 1 {
							t.Errorf("at %d×C%s: profiles %v, want one", a.Multiple, suffix, found)
							continue
						}
						if b, err := os.ReadFile(found[0]); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
							t.Errorf("%s: %d bytes (%v), want a gzipped profile", found[0], len(b), err)
						}
					}
				}
				// The floods are asked for their multiples of the same run's C.
				if c := s.s.Capacity[0]; len(arms[0].Asked) == 1 && math.Abs(arms[0].Asked[0]-float64(arms[0].Multiple)*c) > 1 {
					t.Errorf("%s: the %d×C flood was asked for %v creates/s, C being %v", s.name, arms[0].Multiple, arms[0].Asked, c)
				}
			}
			if len(s.s.Slowloris) != 1 {
				t.Fatalf("%s: slowloris figures %+v", s.name, s.s.Slowloris)
			}
			if sl := s.s.Slowloris[0]; sl.Conns != o.SlowConns || sl.Dials < sl.Conns || sl.MaxOpen < 1 || sl.MaxOpen > sl.Conns || sl.Bytes < int64(sl.Conns) {
				t.Errorf("%s: the slowloris %+v: want its %d connections opened, held and sending", s.name, sl, o.SlowConns)
			}
		}
		found := 0
		for _, tg := range servers.Targets() {
			for _, prefix := range []string{"past its capacity C", "a quiet client (", "the quiet client's p99 beside/alone", "the flooder's admitted creates/s", "beside a slowloris of"} {
				if strings.HasPrefix(tg.Name, prefix) && !strings.Contains(tg.Measured, "n/a") {
					found++
				}
			}
		}
		if found != 5 {
			t.Errorf("%d overload targets measured, want 5: %+v", found, servers.Targets())
		}
	})
	t.Run("the well-behaved client keeps every create through the flood, on space-api and on the peer", func(t *testing.T) {
		f := servers.Flood
		for _, a := range f.servers() {
			if a.arm.GoodTotal == 0 || len(a.arm.GoodSuccess) != 1 || a.arm.GoodSuccess[0] != 100 {
				t.Errorf("%s: well-behaved client: %v of %d creates (%v)", a.name, a.arm.GoodSuccess, a.arm.GoodTotal, a.arm.GoodOutcomes)
			}
		}
		if f.Space.FloodOutcomes["429 client_activation"] == 0 {
			t.Errorf("space-api never refused the flooding client: %v", f.Space.FloodOutcomes)
		}
		if f.Peer.FloodOutcomes["429"] == 0 {
			t.Errorf("the peer never refused the flooding client: %v", f.Peer.FloodOutcomes)
		}
		// A flooding client's refusals are known ahead by its replica: they cost no
		// Redis command (no lease, no decision), where each took three before. The
		// peer asks Redis for every create.
		if c := f.Space.CallsPerRequest[0]; c > 1 {
			t.Errorf("space-api: %.2f Redis commands per create, want well under one", c)
		}
		if c := f.Peer.EvalshaPerRequest[0]; c < 0.95 {
			t.Errorf("the peer: %.2f EVALSHA per create, want one for each", c)
		}
	})
	t.Run("three replicas admit exactly the cluster burst plus its refill, and three peers on one key no more", func(t *testing.T) {
		p := servers.Replicas
		for _, run := range p.Runs {
			// Admitted = burst + refill × (t_last − t_first) − tokens left, exactly,
			// with t_first the first admission; Exact counts from the start of that
			// create, a moment earlier, so it may exceed the count by under a token.
			if gap := run.Exact - float64(run.Admitted); gap < -1e-6 || gap >= 1 {
				t.Errorf("admitted %d, burst + refill × elapsed − left = %.3f: the replicas spent %.3f tokens the bucket did not have", run.Admitted, run.Exact, -gap)
			}
			if int64(run.Admitted) < p.Burst || run.Rejected == 0 || run.Other != 0 || run.Errors != 0 {
				t.Errorf("run %+v: want at least the burst %d admitted, some refused, nothing else", run, p.Burst)
			}
			nonzero := 0
			for _, n := range run.PerReplica {
				if n > 0 {
					nonzero++
				}
			}
			if nonzero < 2 {
				t.Errorf("admissions per replica %v: the flood did not reach several replicas", run.PerReplica)
			}
			// The peers share one redis_rate key: together they admit its burst, and no
			// more than what refilled over their flood (a token of slack for the
			// moment between TIME and the first create).
			q := run.Peer
			if int64(q.Admitted) < p.Burst || float64(q.Admitted) > q.Window+1 || q.Rejected == 0 || q.Other != 0 {
				t.Errorf("peer run %+v: want the burst %d to %.1f admitted, some refused, nothing else", q, p.Burst, q.Window+1)
			}
		}
	})
	t.Run("a hundred thousand tenants, in small: each its own budget key, every point sampled, reloads counted, idle keys gone", func(t *testing.T) {
		checkScaleSmoke(t, servers.Scale)
	})
	t.Run("the warm pool trace reaches every arm, and failing warm-ups stay within one batch of the target", func(t *testing.T) {
		p := redisOnly.Pool
		for _, a := range p.arms() {
			if a.Claims == 0 || a.Errors != 0 {
				t.Errorf("%s: %d claims, %d errors", a.Name, a.Claims, a.Errors)
			}
		}
		if p.Following.Hits == 0 || p.Following.PeakTarget == 0 || p.Fixed[len(p.Fixed)-1].Hits == 0 {
			t.Errorf("no warm hit: following %+v, largest fixed %+v", p.Following, p.Fixed[len(p.Fixed)-1])
		}
		for _, x := range p.Failing {
			if x.Hits != 0 || x.MaxInFlight > x.PeakTarget+x.Parallel {
				t.Errorf("%s: %d hits, at most %d in flight for a peak target of %d and a batch of %d", x.Name, x.Hits, x.MaxInFlight, x.PeakTarget, x.Parallel)
			}
		}
		if p.Failing[0].Attempts == 0 {
			t.Errorf("%s: no warm-up was tried", p.Failing[0].Name)
		}
	})
	t.Run("one lifecycle round pauses every due sandbox exactly once through the index, and the round after takes nothing", func(t *testing.T) {
		l := redisOnly.Lifecycle
		if l == nil || len(l.Runs) != 1 || l.Batch <= 0 {
			t.Fatalf("lifecycle result %+v", l)
		}
		run := l.Runs[0]
		// A full batch is read again, and the round ends on the short one.
		if run.Pauses != l.Due || run.Other != 0 || run.Queries != l.Due/l.Batch+1 {
			t.Errorf("the round over %d due sandboxes: %d pauses, %d other outcomes, %d due queries; want every one paused in %d", l.Due, run.Pauses, run.Other, run.Queries, l.Due/l.Batch+1)
		}
		if run.PausedDue != l.Due || run.SnapshottedOnce != l.Due || run.Snapshots != l.Due || run.PausedOther != 0 || run.Running != l.Live-l.Due || run.Left != 0 {
			t.Errorf("after the rounds: %d due rows paused for idle, %d snapshotted once, %d snapshots, %d other rows moved, %d running, %d resources left; want %d, %d, %d, 0, %d, 0",
				run.PausedDue, run.SnapshottedOnce, run.Snapshots, run.PausedOther, run.Running, run.Left, l.Due, l.Due, l.Due, l.Live-l.Due)
		}
		if run.IdleQueries != 1 || run.IdleOther != 0 {
			t.Errorf("the round with nothing due ran %d due queries and counted %d outcomes, want 1 and none", run.IdleQueries, run.IdleOther)
		}
		for name, e := range map[string]Explained{"due": run.Due, "generic": run.Generic, "nothing due": run.IdleDue} {
			if !e.UsesIndex || e.SeqScan {
				t.Errorf("the due query's plan (%s) does not read %s alone: %s", name, lifecycleIndex, e.Plan)
			}
		}
		if run.Due.Rows != min(l.Due, l.Batch) || run.IdleDue.Rows != 0 {
			t.Errorf("the due query returned %d rows before the rounds and %d after, want %d and 0", run.Due.Rows, run.IdleDue.Rows, min(l.Due, l.Batch))
		}
	})
	t.Run("the migrations from the release before's schema succeed under its writes, none of which fails, and end at the head", func(t *testing.T) {
		m := redisOnly.Migrations
		if m == nil || len(m.Runs) != 1 || m.Held == nil {
			t.Fatalf("migrations result %+v", m)
		}
		for i, run := range append(slices.Clone(m.Runs), *m.Held) {
			if !run.Migrated || run.Version != run.Head || run.Head <= migrationsFrom {
				t.Errorf("run %d: at version %d of %d, store.CheckMigrated clean: %v", i+1, run.Version, run.Head, run.Migrated)
			}
			for name, l := range map[string]WriteLatency{"before": run.Baseline, "during": run.During} {
				if l.Writes == 0 || l.Failed != 0 {
					t.Errorf("run %d: writes %s the migration: %d, %d failed: %v", i+1, name, l.Writes, l.Failed, l.Errors)
				}
			}
			if !(run.MigrateSec > 0) || !(run.CopySec > 0) {
				t.Errorf("run %d: migrated in %v s, copied in %v s", i+1, run.MigrateSec, run.CopySec)
			}
		}
		// Every one of our migrations after the release before's is logged with its
		// duration (the held run's steps that gave way, if any, are not: see Retries).
		run := m.Runs[0]
		if int64(len(run.Steps)) != run.Head-migrationsFrom || run.Retries != 0 {
			t.Errorf("logged steps %+v (%d retries), want the %d after version %d", run.Steps, run.Retries, run.Head-migrationsFrom, migrationsFrom)
		}
		if !(m.FillSec > 0) || !(m.SandboxesMB > 0) || !(m.OperationsMB > 0) {
			t.Errorf("loaded in %v s: sandboxes %v MB, operations %v MB", m.FillSec, m.SandboxesMB, m.OperationsMB)
		}
		if m.Held.HeldSec < m.Hold.Seconds() {
			t.Errorf("the long transaction stayed open %.1f s, want %s", m.Held.HeldSec, m.Hold)
		}
	})
	t.Run("the soak's tables are purged by retention and every create, queued create and delete is answered", func(t *testing.T) {
		s := servers.Soak
		if s == nil || len(s.Samples) == 0 {
			t.Fatalf("soak result %+v", s)
		}
		if s.Purged["sandboxes"] <= 0 || s.Purged["operations"] <= 0 {
			t.Errorf("space_retention_deleted_total %v: retention deleted nothing", s.Purged)
		}
		last := s.Samples[len(s.Samples)-1]
		if s.Created == 0 || last.Sandboxes >= int64(s.Created) || s.Failed != 0 || s.Deleted != s.Created {
			t.Errorf("%d sandboxes made, %d deleted, %d rows left at the end, %d failed: %v", s.Created, s.Deleted, last.Sandboxes, s.Failed, s.Outcomes)
		}
		for _, x := range s.Samples {
			if x.Creates == 0 || !(x.P99 > 0) {
				t.Errorf("sample at %.0f s: %d creates, p99 %v ms", x.AtSec, x.Creates, x.P99)
			}
		}
	})
	t.Run("the report renders every scenario and the doc keeps what is outside its markers", func(t *testing.T) {
		merged := *servers
		merged.Script, merged.Decision, merged.Keys, merged.Pool, merged.Lifecycle = redisOnly.Script, redisOnly.Decision, redisOnly.Keys, redisOnly.Pool, redisOnly.Lifecycle
		merged.Migrations = redisOnly.Migrations
		merged.Fleet = fleeted.Fleet
		md := merged.Markdown("make bench")
		for _, want := range []string{"### 1. Script cost", "### 2. Decisions/s", "### 3. HTTP", "Refused creates: the ceiling against peers", "### 4. Flood", "### 5. Scale", "### 6. Several replicas", "### 7. Warm pool", "### 8. Lifecycle", "### 9. Overload", "### 10. Migrations", "### 11. Soak", "### 12. A hundred thousand tenants", "### 13. Fleet"} {
			if !strings.Contains(md, want) {
				t.Errorf("markdown lacks %q", want)
			}
		}
		if s := merged.Summary(); !strings.HasPrefix(s, "space-bench: medians") || !strings.Contains(s, "Ratios and targets") {
			t.Errorf("summary does not lead with the ratios:\n%s", s)
		}
		path := filepath.Join(t.TempDir(), "benchmarks.md")
		// The section an older driver wrote, under a marker worded differently, is
		// replaced as well.
		old := "# Benchmarks\n\nintro\n\n<!-- space-bench:begin: written by `make bench` (cmd/space-bench); edit the driver, not this part -->\nold figures\n" + EndMarker + "\n\n## Older study\n\nkept\n"
		if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
			t.Fatal(err)
		}
		for range 2 { // the old section replaced, then the new one in place
			if err := WriteDoc(path, md); err != nil {
				t.Fatal(err)
			}
		}
		b, _ := os.ReadFile(path)
		doc := string(b)
		if strings.Count(doc, beginPrefix) != 1 || strings.Contains(doc, "old figures") || !strings.Contains(doc, "## Older study\n\nkept") || !strings.Contains(doc, "intro") {
			t.Errorf("doc after two writes:\n%s", doc)
		}
		fresh := filepath.Join(t.TempDir(), "fresh.md")
		if err := os.WriteFile(fresh, []byte("# Benchmarks\n\nintro\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := WriteDoc(fresh, md); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(fresh); !strings.HasPrefix(string(b), "# Benchmarks\n\n"+BeginMarker) || !strings.HasSuffix(string(b), EndMarker+"\n\nintro\n") {
			t.Errorf("a doc without markers gets the section after its heading:\n%s", b)
		}
	})
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

func TestParseGoBench(t *testing.T) {
	t.Parallel()
	out := `goos: linux
BenchmarkAdmit/allow-2   	   13418	     87479 ns/op	    1400 B/op	      30 allocs/op
BenchmarkAdmit/allow-2   	   13000	     90000 ns/op	    1400 B/op	      30 allocs/op
BenchmarkCreate/rejected-2 	   22972	    299896 ns/op	      3334 creates/s	 1200 B/op	 20 allocs/op
PASS
`
	lines := parseGoBench("./x", []byte(out))
	if len(lines) != 2 || lines[0].Name != "BenchmarkAdmit/allow" || len(lines[0].Metrics["ns/op"]) != 2 {
		t.Fatalf("parsed %+v", lines)
	}
	if got := summarize(lines[1].Metrics["creates/s"]).Median; got != 3334 {
		t.Errorf("creates/s = %v", got)
	}
	if got := summarize(lines[0].Metrics["ns/op"]); got.Min != 87479 || got.Max != 90000 || math.Abs(got.Median-88739.5) > 1e-9 {
		t.Errorf("ns/op stat = %+v", got)
	}
}

func TestMergeGoBench(t *testing.T) {
	t.Parallel()
	first := parseGoBench("./x", []byte("BenchmarkCreate/cold-2 100 10 ns/op 5 creates/s\n"))
	more := parseGoBench("./x", []byte("BenchmarkCreate/rejected-2 100 20 ns/op 7 creates/s\n"))
	again := parseGoBench("./x", []byte("BenchmarkCreate/rejected-2 100 30 ns/op 9 creates/s 2 allocs/op\n"))
	other := parseGoBench("./y", []byte("BenchmarkCreate/rejected-2 100 40 ns/op\n"))
	lines := mergeGoBench(mergeGoBench(mergeGoBench(first, more), again), other)
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3 (one per package and name): %+v", len(lines), lines)
	}
	r := lines[1]
	if r.Name != "BenchmarkCreate/rejected" || !slices.Equal(r.Metrics["creates/s"], []float64{7, 9}) || !slices.Equal(r.Metrics["ns/op"], []float64{20, 30}) {
		t.Errorf("the runs of one benchmark were not merged in order: %+v", r.Metrics)
	}
	if !slices.Equal(r.Units, []string{"ns/op", "creates/s", "allocs/op"}) {
		t.Errorf("units %v: a unit a later run adds goes after the others", r.Units)
	}
	if !slices.Equal(lines[0].Metrics["ns/op"], []float64{10}) || lines[2].Pkg != "./y" {
		t.Errorf("another benchmark or package was merged into: %+v, %+v", lines[0].Metrics, lines[2])
	}
}

func TestGoBenchPairOrder(t *testing.T) {
	t.Parallel()
	p := &goBenchPair{Bench: "BenchmarkCreate", Subs: [2]string{"a", "b"}}

	t.Run("a run goes first, second, second, first, the first alternating from run to run", func(t *testing.T) {
		for run, want := range [][4]string{{"a", "b", "b", "a"}, {"b", "a", "a", "b"}, {"a", "b", "b", "a"}} {
			if got := p.order(run); got != want {
				t.Errorf("run %d: order %v, want %v", run, got, want)
			}
		}
	})

	t.Run("a run's two go tests of each are one figure, their mean", func(t *testing.T) {
		got := parseGoBench("./x", []byte("BenchmarkCreate/a-2 1 10 ns/op 100 creates/s\nBenchmarkCreate/b-2 1 30 ns/op 80 creates/s\n"+
			"BenchmarkCreate/b-2 1 50 ns/op 90 creates/s\nBenchmarkCreate/a-2 1 20 ns/op 110 creates/s\n"))
		mean := meanRuns(got)
		if len(mean) != 2 || mean[0].Name != "BenchmarkCreate/a" || mean[1].Name != "BenchmarkCreate/b" {
			t.Fatalf("lines %+v", mean)
		}
		if !slices.Equal(mean[0].Metrics["creates/s"], []float64{105}) || !slices.Equal(mean[0].Metrics["ns/op"], []float64{15}) ||
			!slices.Equal(mean[1].Metrics["creates/s"], []float64{85}) || !slices.Equal(mean[1].Metrics["ns/op"], []float64{40}) {
			t.Errorf("means %v, %v; want a 105 creates/s and 15 ns/op, b 85 and 40", mean[0].Metrics, mean[1].Metrics)
		}
		if !slices.Equal(got[0].Metrics["creates/s"], []float64{100, 110}) {
			t.Errorf("the runs given were changed: %v", got[0].Metrics)
		}
	})
}

func TestGoBenchPairTarget(t *testing.T) {
	t.Parallel()
	p := &goBenchPair{Bench: "BenchmarkCreate", Subs: [2]string{"a", "b"}, Unit: "creates/s", AtLeast: 0.95, Target: "b ≥ 0.95× a"}
	lines := parseGoBench("./x", []byte("BenchmarkCreate/a-2 1 1 ns/op 100 creates/s\nBenchmarkCreate/b-2 1 1 ns/op 90 creates/s\n"+
		"BenchmarkCreate/a-2 1 1 ns/op 100 creates/s\nBenchmarkCreate/b-2 1 1 ns/op 100 creates/s\n"+
		"BenchmarkCreate/a-2 1 1 ns/op 50 creates/s\nBenchmarkCreate/b-2 1 1 ns/op 48 creates/s\n"))
	g := &GoBenchResult{Lines: lines}

	t.Run("the ratio is taken run by run, and its median judged", func(t *testing.T) {
		got, ok := p.target(g, "./x")
		if !ok || got.Name != "b ≥ 0.95× a" || !got.Met || !strings.HasPrefix(got.Measured, "0.96×") {
			t.Errorf("target %+v, %v; want the median of 0.90, 1.00, 0.96 (0.96×), met", got, ok)
		}
		p2 := *p
		p2.AtLeast = 0.97
		if got, _ := p2.target(g, "./x"); got.Met {
			t.Errorf("0.96× judged met at 0.97: %+v", got)
		}
	})

	t.Run("a pair that did not run in the package states no target", func(t *testing.T) {
		if got, ok := p.target(g, "./y"); ok {
			t.Errorf("target %+v from another package", got)
		}
	})
}

func TestParseWrk(t *testing.T) {
	t.Parallel()

	t.Run("the figures line of the wrk script is read, socket errors as an outcome", func(t *testing.T) {
		out := "Running 2s test @ http://127.0.0.1:1/v1/sandboxes\n  1 threads and 16 connections\n" +
			wrkMarker + `{"requests":9000,"duration_us":2000000,"p50_us":1500,"p99_us":4000,"socket_errors":2,"statuses":{"429":8998}}` + "\n"
		r, err := parseWrk(out)
		if err != nil {
			t.Fatal(err)
		}
		if r.Requests != 9000 || r.Elapsed != 2*time.Second || r.P50 != 1500*time.Microsecond || r.P99 != 4*time.Millisecond {
			t.Errorf("parsed %+v", r)
		}
		if r.rps("429") != 4499 || r.Outcomes["error"] != 2 {
			t.Errorf("429/s %v, outcomes %v", r.rps("429"), r.Outcomes)
		}
	})
	t.Run("output without the figures line is an error that shows the output", func(t *testing.T) {
		if _, err := parseWrk("unable to connect to 127.0.0.1:1 Connection refused\n"); err == nil || !strings.Contains(err.Error(), "Connection refused") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("wrk runs whole seconds, at least one", func(t *testing.T) {
		for d, want := range map[time.Duration]string{300 * time.Millisecond: "1s", 2 * time.Second: "2s", 2400 * time.Millisecond: "2s"} {
			if got := wrkSeconds(d); got != want {
				t.Errorf("wrkSeconds(%s) = %s, want %s", d, got, want)
			}
		}
	})
}
