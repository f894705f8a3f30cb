package sandbox_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space/internal/dispatcher"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/store"
)

func TestRetention(t *testing.T) {
	t.Parallel()

	t.Run("ended sandboxes and finished operations past their age are deleted in batches, and nothing else", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// 2,500 sandboxes that ended eight days ago (more than two batches), and beside
		// them what must stay: ended yesterday, running for a month, paused for a month.
		if _, err := b.db.Exec(b.ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib, created_at, updated_at)
			SELECT gen_random_uuid(), 'acme', 'acme', CASE WHEN i % 2 = 0 THEN 'terminated' ELSE 'failed' END, 'python-3.12', 1000, 2048, 10,
				now() - interval '9 days', now() - interval '8 days'
			FROM generate_series(1, 2500) i`); err != nil {
			t.Fatal(err)
		}
		for _, kept := range []struct{ state, age string }{{"terminated", "1 day"}, {"running", "30 days"}, {"paused", "30 days"}} {
			if _, err := b.db.Exec(b.ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib, updated_at)
				VALUES (gen_random_uuid(), 'acme', 'acme', $1, 'python-3.12', 1000, 2048, 10, now() - $2::interval)`, kept.state, kept.age); err != nil {
				t.Fatal(err)
			}
		}
		for _, op := range []struct{ state, finished string }{{"succeeded", "8 days"}, {"failed", "8 days"}, {"succeeded", "1 day"}, {"queued", ""}} {
			if _, err := b.db.Exec(b.ctx, `INSERT INTO operations (id, kind, client, sandbox_id, state, request_hash, admission_deadline, finished_at)
				VALUES (gen_random_uuid(), 'create', 'acme', gen_random_uuid(), $1, 'h', now(), CASE WHEN $2 = '' THEN NULL ELSE now() - $2::interval END)`,
				op.state, op.finished); err != nil {
				t.Fatal(err)
			}
		}
		reg := prometheus.NewRegistry()
		p := store.NewPurger(store.Wrap(b.db), reg, sandbox.Retained(7*24*time.Hour), dispatcher.Retained(7*24*time.Hour))
		n, err := p.Purge(b.ctx)
		if err != nil || n != 2502 {
			t.Fatalf("purge deleted %d (%v), want the 2,500 old sandboxes and the 2 old operations", n, err)
		}
		if left := b.count(t, "true"); left != 3 {
			t.Fatalf("%d sandboxes left, want the 3 retention keeps", left)
		}
		var ops int
		if err := b.db.QueryRow(b.ctx, "SELECT count(*) FROM operations").Scan(&ops); err != nil || ops != 2 {
			t.Fatalf("%d operations left (%v), want the one finished yesterday and the queued one", ops, err)
		}
		if got := testMetric(t, reg, "space_retention_deleted_total", "sandboxes"); got != 2500 {
			t.Errorf("space_retention_deleted_total{table=sandboxes} = %v", got)
		}
		if n, err := p.Purge(b.ctx); err != nil || n != 0 {
			t.Fatalf("a second purge deleted %d (%v), want nothing", n, err)
		}
	})

	t.Run("an age of 0 keeps everything", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := b.db.Exec(b.ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib, updated_at)
			VALUES (gen_random_uuid(), 'acme', 'acme', 'terminated', 'python-3.12', 1000, 2048, 10, now() - interval '10 years')`); err != nil {
			t.Fatal(err)
		}
		p := store.NewPurger(store.Wrap(b.db), prometheus.NewRegistry(), sandbox.Retained(0))
		if n, err := p.Purge(b.ctx); err != nil || n != 0 {
			t.Fatalf("purge with no retention deleted %d (%v)", n, err)
		}
	})

	t.Run("the purge finds its rows through the index that holds them alone", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, r := range []struct {
			retained store.Retained
			index    string
		}{{sandbox.Retained(time.Hour), "sandboxes_ended"}, {dispatcher.Retained(time.Hour), "operations_finished"}} {
			if !containsIndex(t, b, r.retained.Due, r.index) {
				t.Errorf("the retention of %s does not read %s", r.retained.Table, r.index)
			}
		}
	})
}

// containsIndex reports whether the plan of query, with sequential scans made dear
// (the test tables are nearly empty, where a scan is cheapest), reads index.
func containsIndex(t *testing.T, b *bundle, query, index string) bool {
	t.Helper()
	tx, err := b.db.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if _, err := tx.Exec(b.ctx, "SET LOCAL enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(b.ctx, "EXPLAIN "+query, 3600.0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, index) {
			return true
		}
	}
	return false
}
