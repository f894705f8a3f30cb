package replicas

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestRoster(t *testing.T) {
	t.Parallel()

	type bundle struct {
		ctx context.Context
		tx  pgx.Tx
	}
	setup := func(t *testing.T) *bundle {
		t.Helper()
		return &bundle{ctx: testenv.Context(t), tx: testenv.Tx(t)}
	}
	roster := func(t *testing.T, db store.Querier, id string) *Roster {
		t.Helper()
		r, err := New(Options{DB: db, ID: id})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return r
	}
	beat := func(t *testing.T, ctx context.Context, r *Roster, want int) {
		t.Helper()
		n, err := r.Beat(ctx)
		if err != nil {
			t.Fatalf("Beat(%s): %v", r.ID(), err)
		}
		if n != want || r.Count() != want {
			t.Fatalf("Beat(%s) = %d, Count %d; want %d", r.ID(), n, r.Count(), want)
		}
	}
	// joined makes a roster for each id, and beats each in turn: the nth counts n.
	joined := func(t *testing.T, b *bundle, ids ...string) []*Roster {
		t.Helper()
		var rs []*Roster
		for i, id := range ids {
			r := roster(t, b.tx, id)
			beat(t, b.ctx, r, i+1)
			rs = append(rs, r)
		}
		return rs
	}

	t.Run("a replica alone counts itself, before and after its first heartbeat", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := roster(t, b.tx, "a")
		if r.Count() != 1 {
			t.Fatalf("Count before any heartbeat = %d, want 1", r.Count())
		}
		beat(t, b.ctx, r, 1)
		beat(t, b.ctx, r, 1)
	})

	t.Run("replicas count each other", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		x := joined(t, b, "x", "y", "z")[0]
		beat(t, b.ctx, x, 3)
	})

	t.Run("a replica not seen within the TTL is not counted, and its row goes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := b.tx.Exec(b.ctx, `INSERT INTO replicas (id, seen_at) VALUES ('late', now() - interval '14 seconds'), ('dead', now() - interval '16 seconds')`); err != nil {
			t.Fatal(err)
		}
		r := roster(t, b.tx, "live") // TTL 15s: three intervals of 5s
		beat(t, b.ctx, r, 2)
		var ids []string
		rows, _ := b.tx.Query(b.ctx, `SELECT id FROM replicas ORDER BY id`)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != 2 || ids[0] != "late" || ids[1] != "live" {
			t.Fatalf("rows after the heartbeat: %v, want [late live]: the dead one deleted", ids)
		}
	})

	t.Run("a replica that leaves is not counted at the next heartbeat", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rs := joined(t, b, "x", "y")
		x, y := rs[0], rs[1]
		if err := y.Leave(b.ctx); err != nil {
			t.Fatal(err)
		}
		beat(t, b.ctx, x, 1)
	})

	t.Run("a failed heartbeat keeps the last count", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		y := joined(t, b, "x", "y")[1]
		if err := b.tx.Rollback(b.ctx); err != nil {
			t.Fatal(err)
		}
		if n, err := y.Beat(b.ctx); err == nil || n != 2 || y.Count() != 2 {
			t.Fatalf("Beat on a closed transaction = %d, %v, Count %d; want an error and the last count, 2", n, err, y.Count())
		}
	})

	t.Run("the count is exported as space_replicas", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		reg := prometheus.NewRegistry()
		if _, err := b.tx.Exec(b.ctx, `INSERT INTO replicas (id) VALUES ('other')`); err != nil {
			t.Fatal(err)
		}
		r, err := New(Options{DB: b.tx, ID: "me", Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		if got := testutil.ToFloat64(r.gauge); got != 1 {
			t.Fatalf("space_replicas before a heartbeat = %v, want 1", got)
		}
		beat(t, b.ctx, r, 2)
		if n, err := testutil.GatherAndCount(reg, "space_replicas"); err != nil || n != 1 {
			t.Fatalf("gathered %d space_replicas series, %v; want 1", n, err)
		}
		if got := testutil.ToFloat64(r.gauge); got != 2 {
			t.Fatalf("space_replicas = %v, want 2", got)
		}
	})

	t.Run("run beats every interval and leaves when stopped", func(t *testing.T) {
		t.Parallel()
		db := store.Wrap(testenv.DB(t))
		ctx := testenv.Context(t)
		other := roster(t, db, "other")
		beat(t, ctx, other, 1)
		// A TTL of a minute: the other row, written once, stays live throughout.
		r, err := New(Options{DB: db, ID: "runner", Interval: 10 * time.Millisecond, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		beats := make(chan int, 100)
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.Run(runCtx, func(n int, err error) {
				if err != nil && runCtx.Err() == nil { // a beat cut by the stop may fail
					t.Errorf("heartbeat: %v", err)
				}
				select {
				case beats <- n:
				default: // the test reads only the first few
				}
			})
		}()
		for range 3 {
			select {
			case n := <-beats:
				if n != 2 {
					t.Fatalf("a heartbeat counted %d, want 2", n)
				}
			case <-ctx.Done():
				t.Fatal("no heartbeat")
			}
		}
		beat(t, ctx, other, 2)
		stop()
		<-done
		beat(t, ctx, other, 1)
	})

	t.Run("options that cannot work are refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := New(Options{}); err == nil {
			t.Error("New without a DB: no error")
		}
		if _, err := New(Options{DB: b.tx, Interval: time.Second, TTL: 500 * time.Millisecond}); err == nil {
			t.Error("New with a TTL shorter than the interval: no error")
		}
		if _, err := New(Options{DB: b.tx, Interval: -time.Second}); err == nil {
			t.Error("New with a negative interval: no error")
		}
	})
}
