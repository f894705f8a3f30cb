package sandbox_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestLiveCapCounted(t *testing.T) {
	t.Parallel()

	// capped is a bundle whose service has a registry and a clock, and a caller of a
	// key with a live cap of n, already holding n running sandboxes.
	type cappedBundle struct {
		*bundle
		reg    *prometheus.Registry
		clock  *testenv.Clock
		caller space.Caller
		held   []*space.Sandbox
	}
	capped := func(t *testing.T, n int) *cappedBundle {
		t.Helper()
		b := setup(t)
		reg, clock := timed(b)
		c := &cappedBundle{bundle: b, reg: reg, clock: clock, caller: acme()}
		c.caller.LiveSandboxes = n
		for range n {
			sb, err := create(b.svc, b.ctx, c.caller, sandbox.CreateRequest{Shape: python})
			if err != nil {
				t.Fatal(err)
			}
			c.held = append(c.held, sb)
		}
		return c
	}
	counted := func(t *testing.T, c *cappedBundle) (atCap, below float64) {
		t.Helper()
		return testMetric(t, c.reg, "space_sandbox_live_cap_counts_total", "at_cap"),
			testMetric(t, c.reg, "space_sandbox_live_cap_counts_total", "below")
	}
	refusedAtCap := func(err error) bool {
		le, ok := errors.AsType[*space.LimitError](err)
		return ok && le.Bucket == space.BucketLiveSandboxCap
	}

	t.Run("a flood at the cap is refused by counts after the first refusal, with no booking", func(t *testing.T) {
		t.Parallel()
		c := capped(t, 2)
		if _, err := create(c.svc, c.ctx, c.caller, sandbox.CreateRequest{Shape: python}); !refusedAtCap(err) {
			t.Fatalf("a create at the cap = %v, want live_sandbox_cap", err)
		}
		if atCap, below := counted(t, c); atCap != 0 || below != 0 {
			t.Fatalf("counted %v at the cap and %v below before any hint; want none (the booking refused)", atCap, below)
		}
		const flood = 16
		var wg sync.WaitGroup
		errs := make(chan error, flood)
		for range flood {
			wg.Go(func() {
				_, err := create(c.svc, c.ctx, c.caller, sandbox.CreateRequest{Shape: python})
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if !refusedAtCap(err) {
				t.Errorf("a create of the flood = %v, want live_sandbox_cap", err)
			}
		}
		// Each was refused by a count: a create refused by its booking is not counted.
		if atCap, below := counted(t, c); atCap != flood || below != 0 {
			t.Fatalf("counted %v at the cap and %v below, want %d and 0", atCap, below, flood)
		}
		if live := c.count(t, "client = 'acme' AND state = 'running'"); live != 2 {
			t.Fatalf("%d running, want the cap of 2", live)
		}
		if got := c.charger.count("acme"); got != 2 {
			t.Fatalf("charged %d times, want the 2 creates under the cap", got)
		}
	})

	t.Run("a sandbox deleted on another replica frees its place for the very next create", func(t *testing.T) {
		t.Parallel()
		c := capped(t, 2)
		if _, err := create(c.svc, c.ctx, c.caller, sandbox.CreateRequest{Shape: python}); !refusedAtCap(err) {
			t.Fatalf("a create at the cap = %v, want live_sandbox_cap", err)
		}
		other := sandbox.New(c.options())
		if _, err := other.Delete(c.ctx, "acme", c.held[0].ID); err != nil {
			t.Fatal(err)
		}
		if _, err := create(c.svc, c.ctx, c.caller, sandbox.CreateRequest{Shape: python}); err != nil {
			t.Fatalf("the create after the delete = %v, want the freed place", err)
		}
		if atCap, below := counted(t, c); atCap != 0 || below != 1 {
			t.Fatalf("counted %v at the cap and %v below, want the one count that found the place", atCap, below)
		}
		// At the cap again: the next is refused by its booking (the count forgot the
		// hint), and the one after it by a count.
		for i, want := range []float64{0, 1} {
			if _, err := create(c.svc, c.ctx, c.caller, sandbox.CreateRequest{Shape: python}); !refusedAtCap(err) {
				t.Fatalf("create %d at the cap again = %v, want live_sandbox_cap", i, err)
			}
			if atCap, _ := counted(t, c); atCap != want {
				t.Fatalf("after create %d at the cap again: counted %v at the cap, want %v", i, atCap, want)
			}
		}
	})

	t.Run("a second after the last refusal the booking decides again, uncounted", func(t *testing.T) {
		t.Parallel()
		c := capped(t, 1)
		for range 2 { // refused by the booking, then by a count
			if _, err := create(c.svc, c.ctx, c.caller, sandbox.CreateRequest{Shape: python}); !refusedAtCap(err) {
				t.Fatalf("a create at the cap = %v, want live_sandbox_cap", err)
			}
		}
		c.clock.Advance(time.Second)
		if _, err := create(c.svc, c.ctx, c.caller, sandbox.CreateRequest{Shape: python}); !refusedAtCap(err) {
			t.Fatalf("a create at the cap a second on = %v, want live_sandbox_cap", err)
		}
		if atCap, below := counted(t, c); atCap != 1 || below != 0 {
			t.Fatalf("counted %v at the cap and %v below, want only the count within the second", atCap, below)
		}
	})

	t.Run("a restore at the cap is counted as a create is, and goes once a place is free", func(t *testing.T) {
		t.Parallel()
		c := capped(t, 2)
		paused := c.held[1]
		if _, err := c.svc.Pause(c.ctx, space.Caller{ID: "acme", Key: "acme"}, paused.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := create(c.svc, c.ctx, c.caller, sandbox.CreateRequest{Shape: python}); err != nil {
			t.Fatalf("a create into the place the pause freed = %v", err)
		}
		for i, want := range []float64{0, 1} { // refused by its booking, then by a count
			if _, err := c.svc.Restore(c.ctx, c.caller, paused.ID); !refusedAtCap(err) {
				t.Fatalf("restore %d at the cap = %v, want live_sandbox_cap", i, err)
			}
			if atCap, _ := counted(t, c); atCap != want {
				t.Fatalf("after restore %d at the cap: counted %v at the cap, want %v", i, atCap, want)
			}
		}
		if _, err := c.svc.Delete(c.ctx, "acme", c.held[0].ID); err != nil {
			t.Fatal(err)
		}
		if _, err := c.svc.Restore(c.ctx, c.caller, paused.ID); err != nil {
			t.Fatalf("the restore after the delete = %v, want the freed place", err)
		}
		if _, below := counted(t, c); below != 1 {
			t.Fatalf("counted %v below, want the one count that found the place", below)
		}
	})

	t.Run("a key below its cap, and one with no cap, are never counted", func(t *testing.T) {
		t.Parallel()
		c := capped(t, 0)
		for _, limit := range []int{5, 0} {
			caller := c.caller
			caller.LiveSandboxes = limit
			for range 3 {
				if _, err := create(c.svc, c.ctx, caller, sandbox.CreateRequest{Shape: python}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if atCap, below := counted(t, c); atCap != 0 || below != 0 {
			t.Fatalf("counted %v at the cap and %v below, want none", atCap, below)
		}
	})
}
