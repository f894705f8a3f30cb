package admission

import (
	"fmt"
	"testing"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/metric"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestSeriesDoNotGrowWithTenants(t *testing.T) {
	t.Parallel()

	t.Run("soft breaches of many budget keys label the first few, and sum the rest as other", func(t *testing.T) {
		t.Parallel()
		opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: 1000})
		opts.BudgetKeys = metric.NewKeys(2)
		b := setup(t, testenv.Redis(t), opts)
		for i := range 5 {
			// A soft bucket of 1: each client's second activation is a breach.
			c := space.Charge{Key: space.ClientKey(fmt.Sprintf("tenant-%d", i)), Rate: rate(neverRefills, 10), Soft: rate(neverRefills, 1), Tier: "free", Cost: 1}
			for range 2 {
				if _, err := b.adm.Charge(b.ctx, c); err != nil {
					t.Fatal(err)
				}
			}
		}
		families, err := b.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		labels := map[string]float64{}
		for _, f := range families {
			if f.GetName() != "space_sandbox_soft_breaches_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "budget_key" {
						labels[l.GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
		}
		if len(labels) != 3 || labels["tenant-0"] != 1 || labels["tenant-1"] != 1 || labels[metric.OtherKeys] != 3 {
			t.Fatalf("soft breach series %v, want tenant-0 and tenant-1 with one each and the other three under %s", labels, metric.OtherKeys)
		}
	})
}
