package store_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/testenv"
	"github.com/space-sandbox/space/migrations"
)

// TestAMigrationStepGivesWay holds the migrations' lock_timeout: a step that waits for
// a table's lock behind a long transaction gives up within DDLLockTimeout, so that the
// writes queued behind it go on, and is tried again until the transaction is over.
func TestAMigrationStepGivesWay(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	pool := testenv.Pool(t, testenv.EmptyDatabaseURL(t))
	// The schema of the release before the lifecycle's columns.
	db := stdlib.OpenDBFromPool(pool)
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.UpTo(ctx, 13); err != nil {
		t.Fatal(err)
	}
	db.Close()

	// A long transaction holds sandboxes (a report reading it, say) until the test
	// ends it.
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, "LOCK TABLE sandboxes IN ACCESS SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Buffer{}
	migrated := make(chan error, 1)
	go func() { migrated <- store.Migrate(ctx, pool, slog.New(slog.NewTextHandler(logs, nil))) }()
	// A create's insert, sent once the migration's ALTER waits for its lock: without
	// the lock timeout it would queue behind the ALTER until the long transaction ends.
	testenv.Eventually(t, 30*time.Second, "the migration to wait for the table's lock", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query ILIKE 'ALTER TABLE sandboxes%')`).Scan(&waiting)
		return err == nil && waiting
	})
	inserted := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib)
			VALUES (gen_random_uuid(), 'acme', 'acme', 'running', 'python-3.12', 1000, 2048, 10)`)
		inserted <- err
	}()
	select {
	case err := <-inserted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // a failure bound: it gives way within a lock timeout
		t.Fatal("a create's insert still waits behind the migration, 30 s on: the step did not give way")
	}
	select {
	case err := <-migrated:
		t.Fatalf("the migration ended (%v) while the long transaction still held the table", err)
	default:
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-migrated:
		if err != nil {
			t.Fatalf("the migration after the long transaction: %v", err)
		}
	case <-time.After(2 * time.Minute): // a failure bound
		t.Fatal("the migration did not finish within 2 minutes of the long transaction's end")
	}
	if !strings.Contains(logs.String(), "timed out waiting for its lock") {
		t.Errorf("the migration logged no retry:\n%s", logs.String())
	}
	if err := store.CheckMigrated(context.WithoutCancel(ctx), pool); err != nil {
		t.Fatal(err)
	}
}
