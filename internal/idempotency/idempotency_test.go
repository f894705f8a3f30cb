package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/idempotency"
	"github.com/space-sandbox/space/internal/testenv"
	"github.com/space-sandbox/space/migrations"
)

func TestParse(t *testing.T) {
	t.Parallel()

	for name, tc := range map[string]struct {
		values []string
		want   string
	}{
		"no field is no key":                  {nil, ""},
		"a bare key is taken as is":           {[]string{"order 42/retry-1"}, "order 42/retry-1"},
		"a quoted key is the string it holds": {[]string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		"a quoted key unescapes its escapes":  {[]string{`"a\"b\\c"`}, `a"b\c`},
		"a 255-character key is accepted":     {[]string{strings.Repeat("k", 255)}, strings.Repeat("k", 255)},
		"a quoted 255-character key is too":   {[]string{`"` + strings.Repeat("k", 255) + `"`}, strings.Repeat("k", 255)},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := idempotency.Parse(tc.values)
			if err != nil || got != tc.want {
				t.Fatalf("Parse(%q) = %q, %v; want %q", tc.values, got, err, tc.want)
			}
		})
	}

	for name, values := range map[string][]string{
		"a key sent twice":                    {"a", "b"},
		"an empty key":                        {""},
		"an empty quoted key":                 {`""`},
		"a key of 256 characters":             {strings.Repeat("k", 256)},
		"a key with a tab":                    {"a\tb"},
		"a key not in ASCII":                  {"naïve"},
		"a key with DEL":                      {"x\x7f"},
		"a key of NULs":                       {string(make([]byte, 10))},
		"a quoted key with an unknown escape": {`"a\nb"`},
		"a quoted key with a bare quote":      {`"a"b"`},
		"a quoted key left open":              {`"abc`},
		"a quoted key ending in a backslash":  {`"abc\"`},
	} {
		t.Run(name+" is refused naming the header", func(t *testing.T) {
			_, err := idempotency.Parse(values)
			var de *space.Error
			if !errors.As(err, &de) || de.Code != space.EINVALID || de.Field != idempotency.Header {
				t.Fatalf("Parse(%q) = %v, want EINVALID naming %s", values, err, idempotency.Header)
			}
		})
	}

	t.Run("a bare and a quoted key name the same key", func(t *testing.T) {
		bare, err1 := idempotency.Parse([]string{"k-1"})
		quoted, err2 := idempotency.Parse([]string{`"k-1"`})
		if err1 != nil || err2 != nil || bare != quoted {
			t.Fatalf("bare %q (%v), quoted %q (%v)", bare, err1, quoted, err2)
		}
	})
}

func TestHash(t *testing.T) {
	t.Parallel()

	base := idempotency.Hash("create", "", []byte(`{"template":"python"}`))
	for name, other := range map[string]string{
		"another op":                idempotency.Hash("create (synchronous)", "", []byte(`{"template":"python"}`)),
		"another body":              idempotency.Hash("create", "", []byte(`{"template":"node"}`)),
		"bytes moved between parts": idempotency.Hash("create", `{"template":"python"}`, nil),
		"another target":            idempotency.Hash("create", "x", []byte(`{"template":"python"}`)),
	} {
		if other == base {
			t.Errorf("%s hashes like the request", name)
		}
	}
	if again := idempotency.Hash("create", "", []byte(`{"template":"python"}`)); again != base {
		t.Error("the same request hashes differently")
	}
}

type bundle struct {
	ctx context.Context
	tx  pgx.Tx
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{ctx: testenv.Context(t), tx: testenv.Tx(t)}
}

func (b *bundle) record(client space.ClientID, key, hash string) *idempotency.Record {
	return &idempotency.Record{Client: client, Key: key, RequestHash: hash, SandboxID: uuid.NewString()}
}

func TestClaim(t *testing.T) {
	t.Parallel()

	t.Run("a free key is claimed for the time to live", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rec := b.record("acme", "k", "h1")
		prev, err := idempotency.Claim(b.ctx, b.tx, rec, time.Hour)
		if err != nil || prev != nil {
			t.Fatalf("Claim = %+v, %v; want the key claimed", prev, err)
		}
		if got := rec.ExpiresAt.Sub(rec.CreatedAt); got != time.Hour {
			t.Fatalf("the claim lasts %s, want 1h", got)
		}
	})

	t.Run("a repeat gets the first claim, with what it made", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.record("acme", "k", "h1")
		first.OperationID = uuid.NewString()
		if _, err := idempotency.Claim(b.ctx, b.tx, first, time.Hour); err != nil {
			t.Fatal(err)
		}
		prev, err := idempotency.Claim(b.ctx, b.tx, b.record("acme", "k", "h1"), time.Hour)
		if err != nil || prev == nil {
			t.Fatalf("Claim of a repeat = %+v, %v; want the first claim", prev, err)
		}
		if prev.SandboxID != first.SandboxID || prev.OperationID != first.OperationID {
			t.Fatalf("the repeat got %+v, want the first's sandbox %s and operation %s", prev, first.SandboxID, first.OperationID)
		}
	})

	t.Run("a key sent with a different request is unprocessable, naming the header", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := idempotency.Claim(b.ctx, b.tx, b.record("acme", "k", "h1"), time.Hour); err != nil {
			t.Fatal(err)
		}
		_, err := idempotency.Claim(b.ctx, b.tx, b.record("acme", "k", "h2"), time.Hour)
		var de *space.Error
		if !errors.Is(err, idempotency.ErrReused) || !errors.As(err, &de) || de.Code != space.EUNPROCESSABLE || de.Field != idempotency.Header {
			t.Fatalf("Claim with another request = %v, want EUNPROCESSABLE naming %s", err, idempotency.Header)
		}
	})

	t.Run("keys are per client", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := idempotency.Claim(b.ctx, b.tx, b.record("acme", "k", "h1"), time.Hour); err != nil {
			t.Fatal(err)
		}
		prev, err := idempotency.Claim(b.ctx, b.tx, b.record("globex", "k", "h2"), time.Hour)
		if err != nil || prev != nil {
			t.Fatalf("another client's claim of the same key = %+v, %v; want its own claim", prev, err)
		}
	})

	t.Run("an expired key names nothing and is claimed again, by any request", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := idempotency.Claim(b.ctx, b.tx, b.record("acme", "k", "h1"), time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, err := b.tx.Exec(b.ctx, "UPDATE idempotency_keys SET expires_at = now() - interval '1 second'"); err != nil {
			t.Fatal(err)
		}
		if got, err := idempotency.Get(b.ctx, b.tx, "acme", "k"); err != nil || got != nil {
			t.Fatalf("Get of an expired key = %+v, %v; want none", got, err)
		}
		again := b.record("acme", "k", "h2")
		prev, err := idempotency.Claim(b.ctx, b.tx, again, time.Hour)
		if err != nil || prev != nil {
			t.Fatalf("Claim of an expired key = %+v, %v; want it claimed", prev, err)
		}
		got, err := idempotency.Get(b.ctx, b.tx, "acme", "k")
		if err != nil || got == nil || got.RequestHash != "h2" || got.SandboxID != again.SandboxID {
			t.Fatalf("the key now names %+v (%v), want the new request", got, err)
		}
	})

	t.Run("a purge deletes expired keys only", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, k := range []string{"old-1", "old-2", "live"} {
			if _, err := idempotency.Claim(b.ctx, b.tx, b.record("acme", k, "h"), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.tx.Exec(b.ctx, "UPDATE idempotency_keys SET expires_at = now() - interval '1 hour' WHERE key LIKE 'old-%'"); err != nil {
			t.Fatal(err)
		}
		n, err := idempotency.Purge(b.ctx, b.tx)
		if err != nil || n != 2 {
			t.Fatalf("Purge = %d, %v; want 2", n, err)
		}
		var left []string
		rows, _ := b.tx.Query(b.ctx, "SELECT key FROM idempotency_keys")
		left, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(left) != 1 || left[0] != "live" {
			t.Fatalf("left %v (%v), want [live]", left, err)
		}
	})

	t.Run("concurrent claims of one key leave one owner, and every other sees it", func(t *testing.T) {
		t.Parallel()
		ctx := testenv.Context(t)
		db := testenv.DB(t)
		const n = 16
		var wg sync.WaitGroup
		type result struct {
			mine string
			prev *idempotency.Record
			err  error
		}
		results := make(chan result, n)
		start := make(chan struct{})
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				rec := &idempotency.Record{Client: "acme", Key: "k", RequestHash: "h", SandboxID: uuid.NewString()}
				var prev *idempotency.Record
				err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
					var err error
					prev, err = idempotency.Claim(ctx, tx, rec, time.Hour)
					return err
				})
				results <- result{mine: rec.SandboxID, prev: prev, err: err}
			}()
		}
		close(start)
		wg.Wait()
		close(results)
		var winners []string
		var seen []string
		for r := range results {
			switch {
			case r.err != nil:
				t.Fatalf("claim: %v", r.err)
			case r.prev == nil:
				winners = append(winners, r.mine)
			default:
				seen = append(seen, r.prev.SandboxID)
			}
		}
		if len(winners) != 1 {
			t.Fatalf("%d claims won, want 1", len(winners))
		}
		for _, s := range seen {
			if s != winners[0] {
				t.Fatalf("a loser saw sandbox %s, want the winner's %s", s, winners[0])
			}
		}
	})
}

// TestMigration checks that migration 00007 carries the keys of queued operations over
// to idempotency_keys, so a repeat queued before the upgrade still finds its operation.
func TestMigration(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	pool := testenv.Pool(t, testenv.EmptyDatabaseURL(t))
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.UpTo(ctx, 6); err != nil {
		t.Fatalf("migrate to 6: %v", err)
	}
	opID, sbID := uuid.NewString(), uuid.NewString()
	hash := idempotency.Hash("create", "", []byte(`{}`))
	if _, err := pool.Exec(ctx, `INSERT INTO operations (id, kind, client, sandbox_id, idempotency_key, request_hash, admission_deadline, created_at)
		VALUES ($1, 'create', 'acme', $2, 'k', $3, now(), now() - interval '1 hour')`, opID, sbID, hash); err != nil {
		t.Fatal(err)
	}
	if _, err := provider.UpTo(ctx, 7); err != nil {
		t.Fatalf("migrate to 7: %v", err)
	}
	got, err := idempotency.Get(ctx, pool, "acme", "k")
	if err != nil || got == nil {
		t.Fatalf("the operation's key after the migration = %+v, %v; want it kept", got, err)
	}
	if got.OperationID != opID || got.SandboxID != sbID || got.RequestHash != hash {
		t.Fatalf("the key names %+v, want operation %s", got, opID)
	}
	if left := got.ExpiresAt.Sub(got.CreatedAt); left != 24*time.Hour {
		t.Fatalf("the carried key lasts %s from its operation, want 24h", left)
	}
	if _, err := provider.DownTo(ctx, 6); err != nil {
		t.Fatalf("migrate back down to 6: %v", err)
	}
}
