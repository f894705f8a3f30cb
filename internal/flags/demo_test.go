package flags

import (
	"context"
	"os"
	"testing"

	"github.com/space-sandbox/space"
)

// TestTheDemoFlags loads the flags file `make run` serves (deploy/demo/flags.json)
// under the configuration scripts/run.sh gives it, so that the demo cannot drift into
// a file the validators refuse.
func TestTheDemoFlags(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../deploy/demo/flags.json")
	if err != nil {
		t.Fatal(err)
	}
	// scripts/run.sh: a cluster of 20/s (burst 40), clients 1/s (burst 5), floor free.
	env := Env{AdmissionEnabled: true, Cluster: space.Rate{RefillRPS: 20, Burst: 40},
		ClientRate: &space.Rate{RefillRPS: 1, Burst: 5}, FallbackTier: "free"}
	f := setup(t, string(raw), withEnv(env))
	if got := f.counter("space_flags_last_reload_successful", nil); got != 1 {
		t.Fatalf("the demo flags file was refused (last reload successful = %v)", got)
	}
	ctx := context.Background()
	acme := f.resolver.Resolve(ctx, "acme")
	if acme.Tier != "pro" || acme.ClientRate == nil || acme.ClientRate.Burst != 40 || acme.SoftRate == nil || acme.QueueWeight != 2 || len(acme.Warnings) != 0 {
		t.Fatalf("acme = %+v, want the pro tier with its soft limit and weight, no warning", acme)
	}
	if res, ok := acme.Reservations.Of("pro"); !ok || res.Rate.RefillRPS != 5 {
		t.Fatalf("pro's reserve = %+v (%v), want 5/s", res, ok)
	}
	if g := f.resolver.Resolve(ctx, "globex"); g.Tier != "pro" || !g.ClientExempt {
		t.Fatalf("globex = %+v, want pro and exempt from a client bucket", g)
	}
	if o := f.resolver.Resolve(ctx, "initech"); o.Key != space.Unknown || o.Tier != "free" || o.ClientRate.Burst != 5 {
		t.Fatalf("a client off the allowlist = %+v, want unknown on free", o)
	}
	if pools, err := f.resolver.PoolTargets(ctx); err != nil || len(pools) != 2 {
		t.Fatalf("pool targets = %v, %v; want the demo's two shapes", pools, err)
	}
}
