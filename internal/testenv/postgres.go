package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/migrations"
)

// Every test database is a copy of a template database migrated once per schema
// version: CREATE DATABASE ... TEMPLATE takes tens of milliseconds where migrating takes
// seconds. Test databases are named with their creation time so that leftovers of a
// killed run are dropped by a later one.
const (
	templatePrefix = "spacetmpl_"
	testDBPrefix   = "spacetest_"
	leftoverAge    = time.Hour
	templateLockID = 0x5ace_7e57
)

var (
	templateOnce sync.Once
	templateName string
	templateErr  error

	sharedOnce sync.Once
	sharedPool *pgxpool.Pool
	sharedErr  error
)

// DatabaseURL returns the URL of a fresh, migrated database that only this test uses,
// dropped when the test ends. Use it to start a whole server (Main); use DB for a pool.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	base := require(t, envDatabaseURL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tmpl, err := migratedTemplate(ctx, base)
	if err != nil {
		t.Fatalf("test database template: %v (is Postgres running? %s)", err, StartCommand)
	}
	return createDatabase(t, base, tmpl)
}

// EmptyDatabaseURL returns the URL of a fresh database with no schema at all, dropped
// when the test ends: for tests of migrations and of an unmigrated database.
func EmptyDatabaseURL(t testing.TB) string {
	t.Helper()
	return createDatabase(t, require(t, envDatabaseURL), "template0")
}

func createDatabase(t testing.TB, base, template string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, drop, err := CreateDatabase(ctx, base, template)
	if err != nil {
		t.Fatalf("%v; start the services with\n\t%s", err, StartCommand)
	}
	t.Cleanup(drop)
	return url
}

// CreateDatabase creates a database of the caller's own on the Postgres server of
// baseURL (any database on it that the user may connect to), a copy of template ("" for
// the server's default, template1), and returns its URL and a function that drops it,
// closing whatever is still connected. Its name, spacetest_<unix time>_<random>, lets
// DropLeftoverDatabases drop it an hour later should the caller be killed before it
// could.
func CreateDatabase(ctx context.Context, baseURL, template string) (url string, drop func(), err error) {
	name := fmt.Sprintf("%s%d_%s", testDBPrefix, time.Now().Unix(), RandomID(4))
	admin, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect %s: %w", store.Redact(baseURL), err)
	}
	defer admin.Close(ctx)
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if _, err := admin.Exec(ctx, sql); err != nil {
		return "", nil, fmt.Errorf("create database %s on %s: %w", name, store.Redact(baseURL), err)
	}
	drop = func() {
		// Its own context: drop runs at the end of a test or a run, when the caller's
		// context may be done already.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, baseURL)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
	return store.WithDatabase(baseURL, name), drop, nil
}

// DropLeftoverDatabases drops the databases CreateDatabase made more than an hour ago
// on the server of baseURL: those of a run that was killed before it could drop them.
func DropLeftoverDatabases(ctx context.Context, baseURL string) error {
	admin, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return fmt.Errorf("connect %s: %w", store.Redact(baseURL), err)
	}
	defer admin.Close(ctx)
	dropLeftovers(ctx, admin)
	return nil
}

// DB returns a pool on a fresh, migrated database that only this test uses.
func DB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return Pool(t, DatabaseURL(t))
}

// Pool opens a pool on url, closed when the test ends.
func Pool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Tx returns a transaction on a migrated database shared by the tests of this process,
// rolled back when the test ends: the cheapest isolation for tests of queries.
func Tx(t testing.TB) pgx.Tx {
	t.Helper()
	base := require(t, envDatabaseURL)
	sharedOnce.Do(func() {
		// The shared database outlives any one test, so it is not tied to t's cleanup;
		// it is dropped as a leftover by a later run.
		sharedPool, sharedErr = sharedDatabase(base)
	})
	if sharedErr != nil {
		t.Fatalf("shared test database: %v", sharedErr)
	}
	ctx := context.Background()
	tx, err := sharedPool.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func sharedDatabase(base string) (*pgxpool.Pool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tmpl, err := migratedTemplate(ctx, base)
	if err != nil {
		return nil, err
	}
	// Never dropped by this process (see Tx): DropLeftoverDatabases drops it in a
	// later run.
	url, _, err := CreateDatabase(ctx, base, tmpl)
	if err != nil {
		return nil, err
	}
	return pgxpool.New(context.Background(), url)
}

// migratedTemplate returns the name of the template database for the current schema,
// creating and migrating it the first time, under an advisory lock because test
// binaries of several packages start at once.
func migratedTemplate(ctx context.Context, base string) (string, error) {
	templateOnce.Do(func() {
		templateName, templateErr = createTemplate(ctx, base)
	})
	return templateName, templateErr
}

func createTemplate(ctx context.Context, base string) (string, error) {
	sum, err := schemaHash()
	if err != nil {
		return "", err
	}
	name := templatePrefix + sum
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("connect %s: %w", store.Redact(base), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockID); err != nil {
		return "", err
	}
	defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", templateLockID) //nolint:errcheck

	dropLeftovers(ctx, admin)

	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	// A half-made template of an interrupted run is not marked datistemplate: redo it.
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", err
	}
	pool, err := pgxpool.New(ctx, store.WithDatabase(base, name))
	if err != nil {
		return "", err
	}
	err = store.Migrate(ctx, pool, nil)
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH is_template true ALLOW_CONNECTIONS false"); err != nil {
		return "", err
	}
	return name, nil
}

// dropLeftovers drops test databases of runs that ended without cleaning up, and
// templates of other schema versions.
func dropLeftovers(ctx context.Context, admin *pgx.Conn) {
	rows, err := admin.Query(ctx, "SELECT datname FROM pg_database WHERE datname LIKE 'spacetest\\_%'")
	if err != nil {
		return
	}
	names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	for _, n := range names {
		parts := strings.SplitN(strings.TrimPrefix(n, testDBPrefix), "_", 2)
		sec, err := strconv.ParseInt(parts[0], 10, 64)
		if err != nil || time.Since(time.Unix(sec, 0)) < leftoverAge {
			continue
		}
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{n}.Sanitize()+" WITH (FORCE)")
	}
}

// schemaHash identifies the schema: our migration files and River's migration count.
func schemaHash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "river:%s", store.RiverSchemaVersion())
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
