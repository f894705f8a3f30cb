package sandbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

// timed rebuilds b's service with a registry and a clock.
func timed(b *bundle) (*prometheus.Registry, *testenv.Clock) {
	reg := prometheus.NewRegistry()
	c := testenv.NewClock(time.Unix(1_800_000_000, 0))
	b.svc = sandbox.New(sandbox.Options{
		DB: b.db, Pool: b.pool, Substrate: b.sim, Charger: b.charger,
		Catalog:    sandbox.Catalog{Templates: substrate.Templates{python.Template: {Name: python.Template, Image: "python:3.12-slim"}}, Max: space.Shape{CPUMillis: 8000, MemoryMiB: 16384, DiskGiB: 100}},
		Now:        c.Now,
		Registerer: reg,
	})
	return reg, c
}

// series returns the series of name with labels, nil when reg has none.
func series(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if matches(m, labels) {
				return m
			}
		}
	}
	return nil
}

// histogram returns the sample count and sum of the series of name with labels.
func histogram(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	m := series(t, reg, name, labels)
	if m == nil {
		t.Fatalf("no series %s%v", name, labels)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

func matches(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := labels[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(labels)
}

func TestActivationSignals(t *testing.T) {
	t.Parallel()

	t.Run("a cold start is timed from the booking to running, and the substrate's part apart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		reg, clk := timed(b)
		b.setFail(func(c substrate.Call) error {
			if c.Op == substrate.OpStartCold {
				clk.Advance(3 * time.Second)
			}
			return nil
		})
		if _, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err != nil {
			t.Fatal(err)
		}
		if n, sum := histogram(t, reg, "space_sandbox_activation_seconds", map[string]string{"kind": "create", "outcome": "cold"}); n != 1 || sum != 3 {
			t.Fatalf("cold activations: %d observed, %vs in all; want 1 of 3s", n, sum)
		}
		if n, sum := histogram(t, reg, "space_sandbox_cold_start_seconds", map[string]string{"kind": "create"}); n != 1 || sum != 3 {
			t.Fatalf("cold starts: %d observed, %vs in all; want 1 of 3s", n, sum)
		}
	})

	t.Run("each step of a cold create is observed once, with what it waited", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		reg, clk := timed(b)
		p := &places{asked: func() { clk.Advance(time.Second) }}
		b.charger.mu.Lock()
		b.charger.during = func() { clk.Advance(2 * time.Second) }
		b.charger.mu.Unlock()
		b.setFail(func(c substrate.Call) error {
			if c.Op == substrate.OpStartCold {
				clk.Advance(3 * time.Second)
			}
			return nil
		})
		_, lease, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}, p)
		if err != nil {
			t.Fatal(err)
		}
		lease.Release()
		// The clock moves only in the place, the charge and the start: the booking and
		// the finish are observed, at no time.
		for step, want := range map[string]float64{"place": 1, "book": 0, "charge": 2, "start": 3, "finish": 0} {
			if n, sum := histogram(t, reg, "space_sandbox_activation_step_seconds", map[string]string{"kind": "create", "step": step}); n != 1 || sum != want {
				t.Errorf("step %s: %d observed, %vs in all; want 1 of %vs", step, n, sum, want)
			}
		}
		if n, _ := histogram(t, reg, "space_sandbox_activation_step_seconds", map[string]string{"kind": "restore", "step": "book"}); n != 0 {
			t.Errorf("%d restore bookings observed, want none", n)
		}
	})

	t.Run("a warm hit is not charged, and a create given no concurrency cap has no place step", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		reg, _ := timed(b)
		b.addReadySlots(t, python, 1)
		sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		if !sb.Warm {
			t.Fatal("the create was not a warm hit")
		}
		for step, want := range map[string]uint64{"place": 0, "book": 1, "charge": 0, "start": 1, "finish": 1} {
			if n, _ := histogram(t, reg, "space_sandbox_activation_step_seconds", map[string]string{"kind": "create", "step": step}); n != want {
				t.Errorf("step %s: %d observed, want %d", step, n, want)
			}
		}
	})

	t.Run("a restore's steps are its own kind's, with no place", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		reg, clk := timed(b)
		sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.svc.Pause(b.ctx, acme(), sb.ID); err != nil {
			t.Fatal(err)
		}
		b.setFail(func(c substrate.Call) error {
			if c.Op == substrate.OpRestore {
				clk.Advance(4 * time.Second)
			}
			return nil
		})
		if _, err := b.svc.Restore(b.ctx, acme(), sb.ID); err != nil {
			t.Fatal(err)
		}
		for step, want := range map[string]uint64{"book": 1, "charge": 1, "start": 1, "finish": 1} {
			if n, _ := histogram(t, reg, "space_sandbox_activation_step_seconds", map[string]string{"kind": "restore", "step": step}); n != want {
				t.Errorf("restore step %s: %d observed, want %d", step, n, want)
			}
		}
		if _, sum := histogram(t, reg, "space_sandbox_activation_step_seconds", map[string]string{"kind": "restore", "step": "start"}); sum != 4 {
			t.Errorf("the restore's start took %vs, want the substrate's 4s", sum)
		}
		if series(t, reg, "space_sandbox_activation_step_seconds", map[string]string{"kind": "restore", "step": "place"}) != nil {
			t.Error("a restore has a place step series; its place is the API's, not the service's")
		}
	})

	t.Run("a warm hit, a refusal and a failed start each land in their own outcome", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		reg, _ := timed(b)
		b.addReadySlots(t, python, 1)
		if _, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err != nil {
			t.Fatal(err)
		}
		b.charger.mu.Lock()
		b.charger.reject = func(space.ClientKey) bool { return true }
		b.charger.mu.Unlock()
		if _, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python}); space.ErrorCode(err) != space.ELIMITED {
			t.Fatalf("a create over the rate = %v, want refused", err)
		}
		b.charger.mu.Lock()
		b.charger.reject = nil
		b.charger.mu.Unlock()
		b.setFail(func(c substrate.Call) error {
			if c.Op == substrate.OpStartCold {
				return errors.New("node pool exhausted")
			}
			return nil
		})
		if _, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python}); space.ErrorCode(err) != space.EUNAVAILABLE {
			t.Fatalf("a failed cold start = %v, want unavailable", err)
		}
		for outcome, want := range map[string]uint64{"warm": 1, "rejected": 1, "failed": 1, "cold": 0, "unprocessable": 0} {
			if n, _ := histogram(t, reg, "space_sandbox_activation_seconds", map[string]string{"kind": "create", "outcome": outcome}); n != want {
				t.Errorf("%s activations observed: %d, want %d", outcome, n, want)
			}
		}
		if n, _ := histogram(t, reg, "space_sandbox_cold_start_seconds", map[string]string{"kind": "create"}); n != 0 {
			t.Errorf("%d cold starts observed, want none (the one that failed is not a start)", n)
		}
	})
}
