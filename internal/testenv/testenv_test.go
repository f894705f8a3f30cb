package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestDatabases(t *testing.T) {
	t.Parallel()

	t.Run("each test gets its own migrated database", func(t *testing.T) {
		t.Parallel()
		ctx := Context(t)
		a, b := DB(t), DB(t)
		if _, err := a.Exec(ctx, "INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib) VALUES (gen_random_uuid(), 'acme', 'acme', 'running', 't', 1, 1, 1)"); err != nil {
			t.Fatalf("the schema is not there: %v", err)
		}
		var n int
		if err := b.QueryRow(ctx, "SELECT count(*) FROM sandboxes").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("the second database sees %d rows of the first", n)
		}
	})

	t.Run("a transaction is rolled back when its test ends", func(t *testing.T) {
		t.Parallel()
		var id string
		t.Run("insert", func(t *testing.T) {
			tx := Tx(t)
			if err := tx.QueryRow(context.Background(), "INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib) VALUES (gen_random_uuid(), 'acme', 'acme', 'running', 't', 1, 1, 1) RETURNING id::text").Scan(&id); err != nil {
				t.Fatal(err)
			}
		})
		tx := Tx(t)
		err := tx.QueryRow(context.Background(), "SELECT id::text FROM sandboxes WHERE id = $1", id).Scan(&id)
		if err != pgx.ErrNoRows {
			t.Fatalf("the row outlived its test: err = %v", err)
		}
	})
}

func TestOutages(t *testing.T) {
	t.Parallel()

	t.Run("a cut proxy refuses and a restored one forwards again", func(t *testing.T) {
		t.Parallel()
		url, proxy := ProxyDatabaseURL(t, DatabaseURL(t))
		ctx := Context(t)
		ping := func() error {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			return conn.Ping(ctx)
		}
		if err := ping(); err != nil {
			t.Fatalf("through the proxy: %v", err)
		}
		proxy.Cut()
		if err := ping(); err == nil {
			t.Fatal("a cut proxy still forwards")
		}
		proxy.Restore()
		if err := ping(); err != nil {
			t.Fatalf("after restore: %v", err)
		}
	})

	t.Run("a muted proxy lets a write commit and drops its reply", func(t *testing.T) {
		t.Parallel()
		direct := DatabaseURL(t)
		url, proxy := ProxyDatabaseURL(t, direct)
		ctx := Context(t)
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, "CREATE TABLE muted (n int)"); err != nil {
			t.Fatal(err)
		}
		proxy.Mute()
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		if _, err := conn.Exec(wctx, "INSERT INTO muted VALUES (1)"); err == nil {
			t.Fatal("a write through a muted proxy was answered")
		}
		check, err := pgx.Connect(ctx, direct)
		if err != nil {
			t.Fatal(err)
		}
		defer check.Close(context.Background())
		Eventually(t, 10*time.Second, "the unanswered write to commit", func() bool {
			var n int
			return check.QueryRow(ctx, "SELECT count(*) FROM muted").Scan(&n) == nil && n == 1
		})
		proxy.Cut()
		proxy.Restore()
		again, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatalf("after restore: %v", err)
		}
		defer again.Close(context.Background())
		var n int
		if err := again.QueryRow(ctx, "SELECT count(*) FROM muted").Scan(&n); err != nil || n != 1 {
			t.Fatalf("after restore: %d rows, %v; want the muted write's 1", n, err)
		}
	})

	t.Run("a private redis server stops and starts on the same address", func(t *testing.T) {
		t.Parallel()
		srv := StartRedis(t)
		c := dialRedis(t, []string{srv.Addr})
		ctx := Context(t)
		srv.Stop()
		if err := c.Ping(ctx).Err(); err == nil {
			t.Fatal("a stopped redis answered")
		}
		srv.Start()
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("a restarted redis: %v", err)
		}
	})
}
