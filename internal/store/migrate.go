// Package store opens space-api's Postgres and migrates its schema: our goose
// migrations (migrations/) and River's queue tables. Queries live with the package that
// owns them (sandbox, pool, dispatcher); this package owns only what they share.
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/space-sandbox/space/migrations"
)

// migrateLockID is the advisory lock that serialises migrations, so that replicas (or
// a Helm Job racing an init container) starting together migrate one at a time.
const migrateLockID = 0x5ace_0001

// DefaultMaxConns is the connection pool size when SPACE_DATABASE_URL does not set
// pool_max_conns.
const DefaultMaxConns = 32

// ErrNotMigrated is returned by CheckMigrated when the schema is behind the binary.
var ErrNotMigrated = errors.New("database is not migrated: run `space-api migrate` first")

// Open connects to Postgres and checks it answers.
func Open(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse SPACE_DATABASE_URL: %w", err)
	}
	// pgxpool's default (the larger of 4 and the CPU count) starves a server that
	// answers thousands of requests a second and runs background work beside them; a
	// pool_max_conns in the URL still wins.
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping postgres: %w", err)
	}
	return pool, nil
}

// Migrate applies every pending migration, ours then River's. It is idempotent and
// safe to run from several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrate: acquire: %w", err)
	}
	defer conn.Release()
	// Polled, not waited for: a replica blocked in pg_advisory_lock holds a snapshot
	// for as long as it waits, and a CREATE INDEX CONCURRENTLY of the replica holding
	// the lock waits for every older snapshot to end, on another connection, where
	// Postgres's deadlock detector cannot see the cycle.
	for {
		var locked bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", migrateLockID).Scan(&locked); err != nil {
			return fmt.Errorf("migrate: lock: %w", err)
		}
		if locked {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrate: lock: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrateLockID) //nolint:errcheck // released with the session anyway

	ddl, err := ddlPool(ctx, pool)
	if err != nil {
		return err
	}
	defer ddl.Close()
	provider, db, err := gooseProvider(ddl)
	if err != nil {
		return err
	}
	defer db.Close()
	// A step that could not take its lock within DDLLockTimeout gave the live traffic
	// queued behind it its turn: it is tried again, a few times, before the whole
	// migration fails and says so.
	for attempt := 1; ; attempt++ {
		results, err := provider.Up(ctx)
		var partial *goose.PartialError
		if errors.As(err, &partial) {
			// The steps applied before the one that failed are in the error, not in
			// the results.
			results = partial.Applied
		}
		for _, r := range results {
			logger.Info("applied migration", "source", r.Source.Path, "duration", r.Duration)
		}
		if partial != nil && partial.Failed != nil {
			logger.Warn("migration step failed", "source", partial.Failed.Source.Path, "duration", partial.Failed.Duration, "err", partial.Err)
		}
		if err == nil {
			break
		}
		if !isLockTimeout(err) || attempt == ddlAttempts {
			if isLockTimeout(err) {
				return fmt.Errorf("migrate: space schema: a step waited %s for a table's lock %d times, behind a long transaction; "+
					"run the migration again when it is over: %w", DDLLockTimeout, attempt, err)
			}
			return fmt.Errorf("migrate: space schema: %w", err)
		}
		logger.Warn("a migration step timed out waiting for its lock; trying again", "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(ddlBackoff()):
		}
	}

	migrator, err := riverMigrator(pool, logger)
	if err != nil {
		return err
	}
	res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return fmt.Errorf("migrate: river schema: %w", err)
	}
	for _, v := range res.Versions {
		logger.Info("applied river migration", "version", v.Version, "name", v.Name)
	}
	return nil
}

// CheckMigrated returns an error wrapping ErrNotMigrated when any migration, ours or
// River's, is pending. serve calls it before it listens.
func CheckMigrated(ctx context.Context, pool *pgxpool.Pool) error {
	provider, db, err := gooseProvider(pool)
	if err != nil {
		return err
	}
	defer db.Close()
	current, target, err := provider.GetVersions(ctx)
	if err != nil {
		return fmt.Errorf("check migrations: %w", err)
	}
	if current < target {
		return fmt.Errorf("%w (schema at version %d of %d)", ErrNotMigrated, current, target)
	}
	migrator, err := riverMigrator(pool, nil)
	if err != nil {
		return err
	}
	res, err := migrator.Validate(ctx, nil)
	if err != nil {
		return fmt.Errorf("check river migrations: %w", err)
	}
	if !res.OK {
		return fmt.Errorf("%w (river: %v)", ErrNotMigrated, res.Messages)
	}
	return nil
}

// DDLLockTimeout is the lock_timeout of every migration step: a step waiting longer
// than this for a table's lock (behind a long transaction) gives up rather than make
// every create, completion and scrape queue behind it; Migrate tries it again. Every
// write to the table waits behind the step for as long as it waits, so this is the
// longest a create is held up by a migration: under a second (make bench's
// migrations scenario measured 5.1 s with the 5 s this was).
const DDLLockTimeout = 800 * time.Millisecond

// ddlAttempts is how many times Migrate tries a step that timed out on its lock:
// about a minute of patience with ddlBackoff between the attempts.
const ddlAttempts = 20

// ddlBackoff is the wait before a step is tried again: 1 to 3 s, jittered so that two
// replicas migrating at once (one waits for the other's advisory lock anyway) and the
// long transaction's own retries do not fall into step.
func ddlBackoff() time.Duration {
	return time.Second + rand.N(2*time.Second)
}

// ddlPool is a pool of pool's database whose sessions wait at most DDLLockTimeout for
// a lock: one connection, so that the session settings hold for every step.
func ddlPool(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Pool, error) {
	cfg := pool.Config()
	cfg.MaxConns, cfg.MinConns = 1, 0
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = fmt.Sprintf("%dms", DDLLockTimeout.Milliseconds())
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("migrate: connect: %w", err)
	}
	return p, nil
}

// isLockTimeout reports whether err is Postgres giving up on a lock (lock_timeout).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

func gooseProvider(pool *pgxpool.Pool) (*goose.Provider, interface{ Close() error }, error) {
	db := stdlib.OpenDBFromPool(pool)
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithDisableGlobalRegistry(true))
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("migrations: %w", err)
	}
	return provider, db, nil
}

func riverMigrator(pool *pgxpool.Pool, logger *slog.Logger) (*rivermigrate.Migrator[pgxTx], error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("river migrator: %w", err)
	}
	return m, nil
}

type pgxTx = pgx.Tx

// WithDatabase returns the Postgres URL base pointing at database name instead.
func WithDatabase(base, name string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base
	}
	u.Path = "/" + name
	return u.String()
}

// Redact returns a Postgres URL with its password hidden, for messages.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "the database URL"
	}
	return u.Redacted()
}

// RiverSchemaVersion names the newest River migration this binary carries, so that
// test templates are rebuilt when River is upgraded.
func RiverSchemaVersion() string {
	m, err := rivermigrate.New(riverpgxv5.New(nil), &rivermigrate.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return "unknown"
	}
	all := m.AllVersions()
	if len(all) == 0 {
		return "0"
	}
	return fmt.Sprintf("%d", all[len(all)-1].Version)
}
