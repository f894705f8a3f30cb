package store_test

import (
	"errors"
	"testing"

	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("an empty database is refused, then migrated, then accepted", func(t *testing.T) {
		t.Parallel()
		ctx := testenv.Context(t)
		pool := testenv.Pool(t, testenv.EmptyDatabaseURL(t))

		if err := store.CheckMigrated(ctx, pool); !errors.Is(err, store.ErrNotMigrated) {
			t.Fatalf("CheckMigrated on an empty database = %v, want ErrNotMigrated", err)
		}
		if err := store.Migrate(ctx, pool, nil); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		if err := store.CheckMigrated(ctx, pool); err != nil {
			t.Fatalf("CheckMigrated after migrate = %v", err)
		}
		for _, table := range []string{"sandboxes", "pool_slots", "river_job", "goose_db_version"} {
			var ok bool
			if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil || !ok {
				t.Errorf("table %s missing after migrate (err %v)", table, err)
			}
		}
	})

	t.Run("a second migrate is a no-op", func(t *testing.T) {
		t.Parallel()
		ctx := testenv.Context(t)
		pool := testenv.Pool(t, testenv.EmptyDatabaseURL(t))
		if err := store.Migrate(ctx, pool, nil); err != nil {
			t.Fatal(err)
		}
		var before int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM goose_db_version").Scan(&before); err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx, pool, nil); err != nil {
			t.Fatalf("second migrate: %v", err)
		}
		var after int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM goose_db_version").Scan(&after); err != nil {
			t.Fatal(err)
		}
		if after != before {
			t.Fatalf("second migrate recorded %d more versions", after-before)
		}
	})

	t.Run("replicas migrating at once all succeed", func(t *testing.T) {
		t.Parallel()
		ctx := testenv.Context(t)
		url := testenv.EmptyDatabaseURL(t)
		errs := make(chan error, 3)
		for range 3 {
			go func() { errs <- store.Migrate(ctx, testenv.Pool(t, url), nil) }()
		}
		for range 3 {
			if err := <-errs; err != nil {
				t.Errorf("concurrent migrate: %v", err)
			}
		}
		if err := store.CheckMigrated(ctx, testenv.Pool(t, url)); err != nil {
			t.Fatal(err)
		}
	})
}
