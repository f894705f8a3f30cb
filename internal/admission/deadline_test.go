package admission

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDeadlines(t *testing.T) {
	t.Parallel()

	const timeout = 100 * time.Millisecond
	setup := func(t *testing.T) *deadlines {
		t.Helper()
		return newDeadlines(timeout)
	}
	base := time.Unix(1_800_000_000, 0)

	t.Run("every call's deadline is between the timeout and an eighth more after it starts", func(t *testing.T) {
		t.Parallel()
		d := setup(t)
		for i := range 2000 {
			now := base.Add(time.Duration(i) * 137 * time.Microsecond)
			dl, ok := d.at(now).Deadline()
			if !ok {
				t.Fatal("a slot context without a deadline")
			}
			if got := dl.Sub(now); got < timeout || got > timeout+timeout/8 {
				t.Fatalf("call at +%s: deadline in %s, want within [%s, %s]", now.Sub(base), got, timeout, timeout+timeout/8)
			}
		}
	})

	t.Run("calls in one slot share a context and the next slot has its own", func(t *testing.T) {
		t.Parallel()
		d := setup(t)
		a, b := d.at(base), d.at(base.Add(timeout/8-time.Nanosecond))
		if a != b {
			t.Fatal("two calls in one slot got different contexts")
		}
		if c := d.at(base.Add(timeout / 8)); c == a {
			t.Fatal("a call in the next slot got the previous slot's context")
		}
	})

	t.Run("a slot's context is done at its deadline", func(t *testing.T) {
		t.Parallel()
		d := newDeadlines(8 * time.Millisecond)
		ctx := d.at(time.Now())
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("slot context not done 10s after an 8ms deadline")
		}
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("err = %v, want DeadlineExceeded", ctx.Err())
		}
	})

	t.Run("a caller's sooner deadline is kept and its values pass through", func(t *testing.T) {
		t.Parallel()
		r := runner{deadlines: setup(t), direct: true}
		type key struct{}
		parent := context.WithValue(context.Background(), key{}, "v")
		soon, cancel := context.WithTimeout(parent, time.Millisecond)
		defer cancel()
		own, _ := soon.Deadline()
		if got, _ := r.bound(soon).Deadline(); !got.Equal(own) {
			t.Fatalf("deadline %v, want the caller's own %v", got, own)
		}
		b := r.bound(parent)
		if b.Value(key{}) != "v" {
			t.Fatal("the caller's values are lost under the slot deadline")
		}
		if _, ok := b.Deadline(); !ok {
			t.Fatal("no deadline for a caller without one")
		}
	})

	t.Run("a caller already gone is not called", func(t *testing.T) {
		t.Parallel()
		r := runner{deadlines: setup(t), direct: true}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		called := false
		if _, err := r.call(ctx, func(context.Context) (any, error) { called = true; return nil, nil }); !errors.Is(err, context.Canceled) || called {
			t.Fatalf("err %v, called %t; want Canceled and no call", err, called)
		}
	})
}
