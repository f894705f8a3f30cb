package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	neturl "net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/testenv"
	"github.com/space-sandbox/space/migrations"
)

// The migrations scenario (`-only migrations`): the upgrade from the release before,
// whose schema is at migration migrationsFrom, run against a database holding a
// history of its size while that release's creates go on:
//
//   - once: goose takes a fresh database to version migrationsFrom, and one INSERT ... SELECT
//     generate_series a table fills it with sizes.migrationSandboxes sandboxes (mostly
//     terminated, 2% running, some failed and paused, of sizes.migrationClients
//     clients, created over a year) and sizes.migrationOperations operations (mostly
//     succeeded, each with its finished_at, a few queued and running), with the
//     idempotency keys of the last day; then VACUUM (ANALYZE), as autovacuum would have
//     left tables of that size; each run migrates a copy of it (CREATE DATABASE ...
//     TEMPLATE), so that every run starts from the same history at the cost of a copy;
//   - the release before's writes start, an open loop at a steady rate, each in a
//     goroutine of its own (a write that waits holds back no other but through
//     Postgres) and timed from the moment it was due: synchronous creates as that release made them (a
//     transaction that takes the budget key's advisory lock, counts its live
//     sandboxes and inserts the row of the columns it knew, then the row set running)
//     and queued operations (the row of the columns it knew); for
//     sizes.migrationBaseline alone (the baseline), then through the migration;
//   - store.Migrate, as `space-api migrate` runs it: every one of our migrations from
//     migrationsFrom+1 on, then River's (a fresh database has none of River's tables;
//     one upgraded from the release before has them, at the same River version, and
//     there that part does nothing). Its log gives each migration's duration; a watcher
//     polls pg_stat_activity for the statement the migration runs, and whether it
//     waits for a lock, so that the slowest write is set beside what ran then;
//   - the checks: the schema at the head version (store.CheckMigrated) and every write
//     done.
//
// Once more, not counted in the medians, a transaction that reads sandboxes (as a
// report would) begins as the migration starts and stays open sizes.migrationHold:
// each ALTER of sandboxes queues behind it and the writes queue behind the ALTER, until
// the migration's lock_timeout (store.DDLLockTimeout) gives way.

// migrationsFrom is the release before's schema version: idempotency keys, before the
// first migration that builds an index CONCURRENTLY.
const migrationsFrom = 7

// MigrationStep is one of our migrations as Migrate logged it.
type MigrationStep struct {
	Source string // the file, 00008_operations_unfinished.sql
	MS     float64
}

// WriteLatency is what the release before's writes saw over one phase.
type WriteLatency struct {
	Writes, Failed int
	// P50, P99 and Max are in ms, from the moment each write was due.
	P50, P99, Max float64
	// Over is how many waited longer than a second.
	Over int
	// Errors are the first few failures.
	Errors []string
}

// MigrationsRun is one run of the migrations scenario.
type MigrationsRun struct {
	// CopySec is the copy of the loaded database this run migrated (CREATE DATABASE
	// ... TEMPLATE).
	CopySec float64
	// MigrateSec is store.Migrate's wall time; Steps our migrations as it logged them,
	// in order (a step applied in an attempt that gave way is not logged: see
	// Retries); OursMS their sum.
	MigrateSec float64
	Steps      []MigrationStep
	OursMS     float64
	// Retries are Migrate's "trying again" warnings: a step that gave way to a lock.
	Retries int
	// Baseline is the writes before the migration, During those due while it ran; the
	// creates and the queued operations apart.
	Baseline, During             WriteLatency
	CreatesDuring, OpsDuring     WriteLatency
	CreatesBaseline, OpsBaseline WriteLatency
	// Slowest is what the migration ran while the slowest write waited (the statement
	// seen most often, marked when it waited for a lock); SlowestAtSec when that write
	// was due, from the migration's start.
	Slowest      string
	SlowestAtSec float64
	// Version is the schema's version after the migration; Migrated whether
	// store.CheckMigrated found nothing pending (River's included); Head our newest
	// migration.
	Version, Head int64
	Migrated      bool
	// HeldSec is how long the long transaction stayed open (0: none).
	HeldSec float64
	// Waits are the stretches in which the watcher saw the migration wait for a lock.
	Waits []LockWait
}

// LockWait is a stretch of time in which a migration statement waited for a lock, in
// seconds from the migration's start.
type LockWait struct {
	FromSec, ToSec float64
	Query          string
}

// MigrationsResult is the migrations scenario.
type MigrationsResult struct {
	Sandboxes, Operations, Clients int
	// CreateRate and OpRate are the release before's writes a second.
	CreateRate, OpRate int
	Baseline           time.Duration
	LockTimeout        time.Duration
	From               int
	Runs               []MigrationsRun
	// Held is the run with the long transaction; nil when the size has none.
	Held *MigrationsRun
	Hold time.Duration
	// FillSec is the load and the vacuum of the database every run copies;
	// SandboxesMB and OperationsMB the tables' total relation sizes after it (indexes
	// and TOAST included).
	FillSec                   float64
	SandboxesMB, OperationsMB float64
}

func runMigrations(ctx context.Context, env *Env, runs int, sz sizes) (*MigrationsResult, error) {
	res := &MigrationsResult{Sandboxes: sz.migrationSandboxes, Operations: sz.migrationOperations, Clients: sz.migrationClients,
		CreateRate: sz.migrationCreateRate, OpRate: sz.migrationOpRate, Baseline: sz.migrationBaseline,
		LockTimeout: store.DDLLockTimeout, From: migrationsFrom, Hold: sz.migrationHold}
	// The history is loaded once, into a database that each run copies: a copy takes
	// seconds where the load takes a minute or more.
	loaded, drop, err := res.load(ctx, env)
	if err != nil {
		return nil, err
	}
	defer drop()
	for i := range runs {
		run, err := res.run(ctx, env, loaded, 0)
		if err != nil {
			return nil, fmt.Errorf("run %d: %w", i+1, err)
		}
		env.logf("migrations: run %d: copied in %.1f s, migrated in %.1f s (ours %.1f s); writes during: p99 %.1f ms, max %.1f ms, %d failed; baseline p99 %.1f ms",
			i+1, run.CopySec, run.MigrateSec, run.OursMS/1000, run.During.P99, run.During.Max, run.During.Failed, run.Baseline.P99)
		res.Runs = append(res.Runs, run)
	}
	if sz.migrationHold > 0 {
		run, err := res.run(ctx, env, loaded, sz.migrationHold)
		if err != nil {
			return nil, fmt.Errorf("the run with a long transaction: %w", err)
		}
		env.logf("migrations: with a %s transaction: migrated in %.1f s, %d retries; writes during: p99 %.1f ms, max %.1f ms, %d failed",
			sz.migrationHold, run.MigrateSec, run.Retries, run.During.P99, run.During.Max, run.During.Failed)
		res.Held = &run
	}
	return res, nil
}

// emptyDatabase creates a database of the bench's own with no schema.
func (e *Env) emptyDatabase(ctx context.Context) (string, func(), error) {
	e.leftovers.Do(func() {
		if err := testenv.DropLeftoverDatabases(ctx, e.AdminURL); err != nil {
			e.logf("dropping leftover databases: %v", err)
		}
	})
	url, drop, err := testenv.CreateDatabase(ctx, e.AdminURL, "")
	if err != nil {
		return "", nil, fmt.Errorf("bench database: %w", err)
	}
	return url, drop, nil
}

// namedPool opens a pool on url whose sessions carry application_name name, which the
// watcher leaves out of what it reports as the migration's.
func namedPool(ctx context.Context, url, name string, conns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = conns
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open %s pool: %w", name, err)
	}
	return p, nil
}

// load makes the database the runs copy: our schema at migrationsFrom, and the
// history. It returns its name and a function that drops it.
func (r *MigrationsResult) load(ctx context.Context, env *Env) (string, func(), error) {
	url, drop, err := env.emptyDatabase(ctx)
	if err != nil {
		return "", nil, err
	}
	fail := func(err error) (string, func(), error) { drop(); return "", nil, err }
	db, err := store.Open(ctx, url)
	if err != nil {
		return fail(err)
	}
	// Closed before any copy: a template database takes no other session.
	defer db.Close()
	if err := migrateTo(ctx, db, migrationsFrom); err != nil {
		return fail(err)
	}
	start := time.Now()
	if err := r.fill(ctx, db); err != nil {
		return fail(err)
	}
	r.FillSec = time.Since(start).Seconds()
	var sbBytes, opBytes int64
	if err := db.QueryRow(ctx, `SELECT pg_total_relation_size('sandboxes'), pg_total_relation_size('operations')`).Scan(&sbBytes, &opBytes); err != nil {
		return fail(fmt.Errorf("table sizes: %w", err))
	}
	r.SandboxesMB, r.OperationsMB = float64(sbBytes)/(1<<20), float64(opBytes)/(1<<20)
	env.logf("migrations: %s sandboxes (%.0f MB), %s operations (%.0f MB) loaded in %.1f s",
		count(r.Sandboxes), r.SandboxesMB, count(r.Operations), r.OperationsMB, r.FillSec)
	u, err := neturl.Parse(url)
	if err != nil {
		return fail(err)
	}
	return strings.TrimPrefix(u.Path, "/"), drop, nil
}

// run is one run on a copy of the loaded database; hold > 0 holds the long
// transaction that long.
func (r *MigrationsResult) run(ctx context.Context, env *Env, loaded string, hold time.Duration) (MigrationsRun, error) {
	var out MigrationsRun
	start := time.Now()
	url, drop, err := testenv.CreateDatabase(ctx, env.AdminURL, loaded)
	if err != nil {
		return out, fmt.Errorf("copy the loaded database: %w", err)
	}
	defer drop()
	out.CopySec = time.Since(start).Seconds()
	db, err := store.Open(ctx, url)
	if err != nil {
		return out, err
	}
	defer db.Close()

	writers, err := namedPool(ctx, url, "bench-writes", store.DefaultMaxConns)
	if err != nil {
		return out, err
	}
	defer writers.Close()
	w := &oldWrites{pool: writers, clients: r.Clients}
	watch, err := startWatcher(ctx, url)
	if err != nil {
		return out, err
	}
	defer watch.stop()

	writing, stopWriting := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t0 := time.Now()
	wg.Go(func() { w.pace(writing, ctx, t0, r.CreateRate, "create", w.create) })
	wg.Go(func() { w.pace(writing, ctx, t0, r.OpRate, "operation", w.operation) })
	select {
	case <-time.After(r.Baseline):
	case <-ctx.Done():
	}

	held := make(chan error, 1)
	var heldFor time.Duration
	if hold > 0 {
		holder, err := namedPool(ctx, url, "bench-holder", 1)
		if err != nil {
			stopWriting()
			wg.Wait()
			return out, err
		}
		defer holder.Close()
		tx, err := holder.Begin(ctx)
		if err == nil {
			_, err = tx.Exec(ctx, `SELECT count(*) FROM sandboxes`)
		}
		if err != nil {
			stopWriting()
			wg.Wait()
			return out, fmt.Errorf("the long transaction: %w", err)
		}
		began := time.Now()
		go func() {
			select {
			case <-time.After(hold):
			case <-ctx.Done():
			}
			heldFor = time.Since(began)
			held <- tx.Commit(context.WithoutCancel(ctx))
		}()
	} else {
		held <- nil
	}

	logs := &capture{}
	migStart := time.Now()
	merr := store.Migrate(ctx, db, slog.New(logs))
	migEnd := time.Now()
	stopWriting()
	wg.Wait()
	watch.stop()
	if err := <-held; err != nil {
		return out, fmt.Errorf("the long transaction: %w", err)
	}
	if merr != nil {
		return out, fmt.Errorf("store.Migrate with writes going on: %w", merr)
	}
	out.MigrateSec = migEnd.Sub(migStart).Seconds()
	out.HeldSec = heldFor.Seconds()
	for _, rec := range logs.records() {
		switch {
		case rec.msg == "applied migration":
			d, _ := rec.attrs["duration"].(time.Duration)
			src, _ := rec.attrs["source"].(string)
			out.Steps = append(out.Steps, MigrationStep{Source: path.Base(src), MS: ms(d)})
			out.OursMS += ms(d)
		case strings.Contains(rec.msg, "trying again"):
			out.Retries++
		}
	}

	all := w.results()
	phase := func(kind string, from, to time.Time) WriteLatency {
		var lat []time.Duration
		var l WriteLatency
		for _, s := range all {
			if (kind != "" && s.kind != kind) || s.due.Before(from) || !s.due.Before(to) {
				continue
			}
			l.Writes++
			if s.err != nil {
				l.Failed++
				if len(l.Errors) < 3 {
					l.Errors = append(l.Errors, s.kind+": "+s.err.Error())
				}
				continue
			}
			lat = append(lat, s.latency)
			if s.latency > time.Second {
				l.Over++
			}
		}
		l.P50, l.P99 = ms(percentile(lat, 50)), ms(percentile(lat, 99))
		if len(lat) > 0 {
			l.Max = ms(slices.Max(lat))
		}
		return l
	}
	out.Baseline, out.During = phase("", t0, migStart), phase("", migStart, migEnd)
	out.CreatesBaseline, out.OpsBaseline = phase("create", t0, migStart), phase("operation", t0, migStart)
	out.CreatesDuring, out.OpsDuring = phase("create", migStart, migEnd), phase("operation", migStart, migEnd)
	var slowest *written
	for i := range all {
		s := &all[i]
		if s.err == nil && !s.due.Before(migStart) && s.due.Before(migEnd) && (slowest == nil || s.latency > slowest.latency) {
			slowest = s
		}
	}
	out.Waits = watch.waits(migStart)
	if slowest != nil {
		out.SlowestAtSec = slowest.due.Sub(migStart).Seconds()
		out.Slowest = watch.during(slowest.due, slowest.due.Add(slowest.latency))
	}

	if err := db.QueryRow(ctx, `SELECT max(version_id) FROM goose_db_version WHERE is_applied`).Scan(&out.Version); err != nil {
		return out, fmt.Errorf("schema version: %w", err)
	}
	if out.Head, err = headVersion(db); err != nil {
		return out, err
	}
	cerr := store.CheckMigrated(ctx, db)
	out.Migrated = cerr == nil
	if cerr != nil && !errors.Is(cerr, store.ErrNotMigrated) {
		return out, cerr
	}
	return out, nil
}

// migrateTo takes the database to our migration version with goose, as the release
// that stopped there had left it.
func migrateTo(ctx context.Context, db *pgxpool.Pool, version int64) error {
	sqlDB := stdlib.OpenDBFromPool(db)
	defer sqlDB.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := provider.UpTo(ctx, version); err != nil {
		return fmt.Errorf("migrate to version %d: %w", version, err)
	}
	return nil
}

// headVersion is our newest migration's version.
func headVersion(db *pgxpool.Pool) (int64, error) {
	sqlDB := stdlib.OpenDBFromPool(db)
	defer sqlDB.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
	}
	srcs := provider.ListSources()
	if len(srcs) == 0 {
		return 0, errors.New("no migrations")
	}
	return srcs[len(srcs)-1].Version, nil
}

// yearSeconds is the span the history's rows were created over.
const yearSeconds = 365 * 24 * 3600

// fill loads the history, in the columns of the schema at migrationsFrom, and vacuums
// it. Every 50th sandbox runs (created within the last day), every 50th after it
// failed, every 250th from the third is paused; the rest are terminated, each ended
// a minute to two hours after its creation. The operations: a few queued and running
// (the newest), every 25th failed at its admission deadline, the rest succeeded 3 s
// after they were queued; every 5th under an Idempotency-Key, those of the last day
// with their key still live.
func (r *MigrationsResult) fill(ctx context.Context, db *pgxpool.Pool) error {
	if _, err := db.Exec(ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, template_version, cpu_millis, memory_mib, disk_gib,
			warm, metadata, substrate_ref, snapshot_ref, last_error, created_at, updated_at)
		SELECT gen_random_uuid(), g.client, g.client, g.state, g.template, left(md5(g.template || (g.i / 50000)::text), 16),
			g.cpu, g.cpu * 2, 10, g.i % 4 = 0,
			jsonb_build_object('team', 'team-' || g.i % 97, 'job', 'job-' || g.i),
			CASE WHEN g.state <> 'failed' THEN 'sim-' || g.i END,
			CASE WHEN g.state = 'paused' THEN 'snap-' || g.i END,
			CASE WHEN g.state = 'failed' THEN 'substrate: start: image pull back-off' END,
			g.created, CASE WHEN g.state = 'running' THEN g.created ELSE g.created + make_interval(secs => 60 + g.i % 7200) END
		FROM (SELECT i, 'client-' || abs(hashint4(i)) % $2 AS client,
				CASE WHEN i % 50 = 0 THEN 'running' WHEN i % 50 = 1 THEN 'failed' WHEN i % 250 = 2 THEN 'paused' ELSE 'terminated' END AS state,
				(ARRAY['python-3.12', 'node-20', 'ubuntu-24.04'])[1 + i % 3] AS template,
				(ARRAY[500, 1000, 2000])[1 + abs(hashint4(i + 7)) % 3] AS cpu,
				CASE WHEN i % 50 = 0 THEN now() - make_interval(secs => i % 86400)
					ELSE now() - make_interval(secs => ($1 - i)::float8 * $3 / $1) END AS created
			FROM generate_series(1, $1::int) i) g`, r.Sandboxes, r.Clients, float64(yearSeconds)); err != nil {
		return fmt.Errorf("load %d sandboxes: %w", r.Sandboxes, err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO operations (id, kind, client, sandbox_id, state, attempts, snoozes, last_bucket, last_error, error_code,
			idempotency_key, request_hash, request, admission_deadline, job_id, created_at, updated_at, started_at, finished_at)
		SELECT gen_random_uuid(), g.kind, g.client, gen_random_uuid(), g.state, CASE WHEN g.state = 'queued' THEN 0 ELSE 1 END, g.i % 3,
			CASE WHEN g.i % 3 > 0 THEN 'client_activation' END,
			CASE WHEN g.state = 'failed' THEN 'admission: the deadline passed' END,
			CASE WHEN g.state = 'failed' THEN 'admission_timeout' END,
			CASE WHEN g.i % 5 = 0 THEN 'key-' || g.i END,
			md5(g.i::text),
			CASE WHEN g.kind = 'create' THEN '{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10}'::jsonb ELSE '{}'::jsonb END,
			g.created + interval '5 minutes', g.i, g.created,
			CASE WHEN g.state IN ('succeeded', 'failed') THEN g.created + interval '3 seconds' ELSE g.created END,
			CASE WHEN g.state <> 'queued' THEN g.created + interval '40 milliseconds' END,
			CASE WHEN g.state IN ('succeeded', 'failed') THEN g.created + interval '3 seconds' END
		FROM (SELECT i, 'client-' || abs(hashint4(i + 1)) % $2 AS client,
				(ARRAY['create', 'create', 'create', 'create', 'restore', 'restore', 'wake'])[1 + i % 7] AS kind,
				CASE WHEN i > $1 - 20 THEN 'queued' WHEN i > $1 - 40 THEN 'running' WHEN i % 25 = 0 THEN 'failed' ELSE 'succeeded' END AS state,
				now() - make_interval(secs => ($1 - i)::float8 * $3 / $1) AS created
			FROM generate_series(1, $1::int) i) g`, r.Operations, r.Clients, float64(yearSeconds)); err != nil {
		return fmt.Errorf("load %d operations: %w", r.Operations, err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO idempotency_keys (client, key, request_hash, operation_id, sandbox_id, created_at, expires_at)
		SELECT client, idempotency_key, request_hash, id, sandbox_id, created_at, created_at + interval '24 hours'
		FROM operations WHERE idempotency_key IS NOT NULL AND created_at > now() - interval '24 hours'`); err != nil {
		return fmt.Errorf("load idempotency keys: %w", err)
	}
	if _, err := db.Exec(ctx, `VACUUM (ANALYZE) sandboxes, operations, idempotency_keys`); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	return nil
}

// written is one write of the release before.
type written struct {
	kind    string
	due     time.Time
	latency time.Duration
	err     error
}

// oldWrites are the release before's writes, as it sent them.
type oldWrites struct {
	pool    *pgxpool.Pool
	clients int
	mu      sync.Mutex
	done    []written
}

// pace sends one write every 1/rate s until writing is done, each in a goroutine of
// its own, and waits for the last; a write runs under ctx (not writing), so that
// stopping the pace does not cut one short.
func (w *oldWrites) pace(writing, ctx context.Context, t0 time.Time, rate int, kind string, write func(context.Context) error) {
	if rate <= 0 {
		return
	}
	interval := time.Second / time.Duration(rate)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 1; ; i++ {
		due := t0.Add(time.Duration(i) * interval)
		select {
		case <-writing.Done():
			return
		case <-time.After(time.Until(due)):
		}
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			err := write(wctx)
			lat := time.Since(due)
			w.mu.Lock()
			w.done = append(w.done, written{kind: kind, due: due, latency: lat, err: err})
			w.mu.Unlock()
		})
	}
}

func (w *oldWrites) results() []written {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.done)
}

func (w *oldWrites) client() string { return fmt.Sprintf("client-%d", rand.IntN(w.clients)) }

// create is a synchronous create as the release before made it (its
// internal/sandbox: checkLiveCap, insertSandbox, then setState running): the budget
// key's lock and its live count (a cap of 50) in one round trip, the row of the columns
// it knew, committed; then the row set running.
func (w *oldWrites) create(ctx context.Context) error {
	id, client := uuid.NewString(), w.client()
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, a no-op
	var live int
	b := &pgx.Batch{}
	b.Queue("SELECT pg_advisory_xact_lock(hashtextextended('space:live:' || $1, 0))", client)
	b.Queue(`SELECT count(*) FROM (
		SELECT 1 FROM sandboxes WHERE budget_key = $1 AND state IN ('starting', 'running', 'pausing', 'restoring') LIMIT $2
	) live`, client, 50).QueryRow(func(row pgx.Row) error { return row.Scan(&live) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("lock and count: %w", err)
	}
	var created, updated time.Time
	if err := tx.QueryRow(ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, template_version, cpu_millis, memory_mib, disk_gib, warm, metadata)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING created_at, updated_at`,
		id, client, client, "starting", "python-3.12", "0123456789abcdef", 1000, 2048, 10, false, []byte(`{"job":"bench"}`)).Scan(&created, &updated); err != nil {
		return fmt.Errorf("insert sandbox: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	var state string
	if err := w.pool.QueryRow(ctx, `UPDATE sandboxes SET state = 'running', substrate_ref = $2, updated_at = now()
		WHERE id = $1 AND state = 'starting' RETURNING state`, id, "sim-"+id).Scan(&state); err != nil {
		return fmt.Errorf("set running: %w", err)
	}
	return nil
}

// operation is a queued create's operation as the release before inserted it (its
// internal/dispatcher's insertOperation; its River job, in the same transaction
// there, has no table here until the migration makes River's).
func (w *oldWrites) operation(ctx context.Context) error {
	var deadline, created, updated time.Time
	err := w.pool.QueryRow(ctx, `INSERT INTO operations (id, kind, client, sandbox_id, idempotency_key, request_hash, request, admission_deadline)
		VALUES ($1, $2, $3, $4, $5, $6, $7, now() + make_interval(secs => $8))
		RETURNING admission_deadline, created_at, updated_at`,
		uuid.NewString(), "create", w.client(), uuid.NewString(), nil, "bench", []byte(`{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10}`), 300.0,
	).Scan(&deadline, &created, &updated)
	if err != nil {
		return fmt.Errorf("insert operation: %w", err)
	}
	return nil
}

// watcher polls pg_stat_activity for what the migration runs: every active statement
// of the database but the bench's own (application_name bench-*).
type watcher struct {
	conn    *pgx.Conn
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	samples []activity
}

type activity struct {
	at      time.Time
	query   string
	waiting bool
}

func startWatcher(ctx context.Context, url string) (*watcher, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = "bench-watch"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("watcher: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &watcher{conn: conn, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer conn.Close(context.WithoutCancel(ctx))
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			rows, err := conn.Query(wctx, `SELECT left(rtrim(btrim(regexp_replace(regexp_replace(query, '--[^\n]*', '', 'g'), '\s+', ' ', 'g')), ';'), 110),
					wait_event_type IS NOT DISTINCT FROM 'Lock'
				FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'
					AND backend_type = 'client backend' AND application_name NOT LIKE 'bench-%'`)
			if err != nil {
				continue
			}
			now := time.Now()
			for rows.Next() {
				a := activity{at: now}
				if rows.Scan(&a.query, &a.waiting) == nil {
					w.mu.Lock()
					w.samples = append(w.samples, a)
					w.mu.Unlock()
				}
			}
			rows.Close()
		}
	}()
	return w, nil
}

func (w *watcher) stop() {
	w.once.Do(func() { w.cancel(); <-w.done })
}

// during names the statement the migration was seen running most often in [from, to],
// "(waiting for a lock)" after it when it was seen waiting; "" when none was seen.
func (w *watcher) during(from, to time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := map[string]int{}
	waited := map[string]bool{}
	for _, a := range w.samples {
		if a.at.Before(from) || a.at.After(to) {
			continue
		}
		q := a.query
		seen[q]++
		waited[q] = waited[q] || a.waiting
	}
	best, n := "", 0
	for q, c := range seen {
		if c > n || (c == n && q < best) {
			best, n = q, c
		}
	}
	if best != "" && waited[best] {
		best += " (waiting for a lock)"
	}
	return best
}

// waits are the stretches in which a statement was seen waiting for a lock: samples of
// the same statement waiting, each less than 250 ms after the one before.
func (w *watcher) waits(t0 time.Time) []LockWait {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []LockWait
	var last time.Time
	for _, a := range w.samples {
		if !a.waiting {
			continue
		}
		at := a.at.Sub(t0).Seconds()
		if n := len(out); n > 0 && out[n-1].Query == a.query && a.at.Sub(last) < 250*time.Millisecond {
			out[n-1].ToSec = at
		} else {
			out = append(out, LockWait{FromSec: at, ToSec: at, Query: a.query})
		}
		last = a.at
	}
	return out
}

// describeWaits renders lock waits as "0.5–5.5 s (ALTER TABLE sandboxes ...), ...".
func describeWaits(ws []LockWait) string {
	var parts []string
	for _, x := range ws {
		q := x.Query
		if len(q) > 60 {
			q = q[:60] + "…"
		}
		parts = append(parts, fmt.Sprintf("%.1f–%.1f s (`%s`)", x.FromSec, x.ToSec, q))
	}
	if len(parts) == 0 {
		return "none seen"
	}
	return strings.Join(parts, ", ")
}

// capture is a slog.Handler that keeps what Migrate logs.
type capture struct {
	mu   sync.Mutex
	recs []captured
}

type captured struct {
	msg   string
	attrs map[string]any
}

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }

func (c *capture) Handle(_ context.Context, r slog.Record) error {
	rec := captured{msg: r.Message, attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Any()
		return true
	})
	c.mu.Lock()
	c.recs = append(c.recs, rec)
	c.mu.Unlock()
	return nil
}

func (c *capture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *capture) WithGroup(string) slog.Handler      { return c }

func (c *capture) records() []captured {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.recs)
}

// column returns f of each run.
func (r *MigrationsResult) column(f func(MigrationsRun) float64) []float64 {
	out := make([]float64, len(r.Runs))
	for i, run := range r.Runs {
		out[i] = f(run)
	}
	return out
}

// stepColumn is one migration's durations over the runs, in ms.
func (r *MigrationsResult) stepColumn(source string) []float64 {
	var out []float64
	for _, run := range r.Runs {
		for _, s := range run.Steps {
			if s.Source == source {
				out = append(out, s.MS)
			}
		}
	}
	return out
}

// sources are our migrations as the runs logged them, in order.
func (r *MigrationsResult) sources() []string {
	var out []string
	for _, run := range r.Runs {
		for _, s := range run.Steps {
			if !slices.Contains(out, s.Source) {
				out = append(out, s.Source)
			}
		}
	}
	return out
}

// worst is the longest write of every run during the migration, in ms, and the
// failures of all of them.
func (r *MigrationsResult) worst() (maxMS float64, failed int) {
	for _, run := range r.Runs {
		maxMS = max(maxMS, run.During.Max)
		failed += run.During.Failed + run.Baseline.Failed
	}
	return maxMS, failed
}

// migrationsTargets are the scenario's targets.
func (r *Report) migrationsTargets() []Target {
	m := r.Migrations
	if m == nil || len(m.Runs) == 0 {
		return nil
	}
	worst, failed := m.worst()
	return []Target{{fmt.Sprintf("migrating %s sandboxes and %s operations from version %d, no create of the release before waits over 1 s, none fails",
		count(m.Sandboxes), count(m.Operations), m.From),
		fmt.Sprintf("longest %.0f ms (per run %s ms), %d failed", worst, summarize(m.column(func(x MigrationsRun) float64 { return x.During.Max })).format("%.0f"), failed),
		worst <= 1000 && failed == 0}}
}

// latencyLine renders a phase's writes: p50 / p99 / max ms.
func (l WriteLatency) line() string {
	return fmt.Sprintf("p50 %.1f, p99 %.1f, max %.1f ms over %d writes (%d over 1 s, %d failed)", l.P50, l.P99, l.Max, l.Writes, l.Over, l.Failed)
}

// migrationsSummary writes the scenario's lines of the plain-text summary.
func (r *Report) migrationsSummary(b *strings.Builder) {
	m := r.Migrations
	if m == nil {
		return
	}
	for i, run := range m.Runs {
		fmt.Fprintf(b, "  migrations run %d: %s sandboxes (%.0f MB) + %s operations (%.0f MB), loaded in %.1f s, copied in %.1f s; Migrate %.1f s (ours %.1f s, %d retries); writes before: %s; during: %s; slowest at %.1f s during %q\n",
			i+1, count(m.Sandboxes), m.SandboxesMB, count(m.Operations), m.OperationsMB, m.FillSec, run.CopySec, run.MigrateSec, run.OursMS/1000, run.Retries,
			run.Baseline.line(), run.During.line(), run.SlowestAtSec, run.Slowest)
		var steps []string
		for _, s := range run.Steps {
			steps = append(steps, fmt.Sprintf("%s %.0f ms", strings.TrimSuffix(s.Source, ".sql"), s.MS))
		}
		fmt.Fprintf(b, "  migrations run %d steps: %s; at version %d of %d, migrated %v\n", i+1, strings.Join(steps, ", "), run.Version, run.Head, run.Migrated)
	}
	if h := m.Held; h != nil {
		fmt.Fprintf(b, "  migrations with a %.1f s transaction on sandboxes: Migrate %.1f s, %d retries, %d of %d steps logged; writes during: %s; slowest at %.1f s during %q; migrated %v\n",
			h.HeldSec, h.MigrateSec, h.Retries, len(h.Steps), h.Head-int64(m.From), h.During.line(), h.SlowestAtSec, h.Slowest, h.Migrated)
		fmt.Fprintf(b, "  migrations with a long transaction: lock waits %s\n", describeWaits(h.Waits))
	}
}

// migrationsMarkdown writes the scenario's section of docs/benchmarks.md.
func (r *Report) migrationsMarkdown(b *strings.Builder) {
	m := r.Migrations
	if m == nil || len(m.Runs) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	col := func(f func(MigrationsRun) float64) Stat { return summarize(m.column(f)) }
	first := m.Runs[0]
	w("### 10. Migrations: the upgrade under the release before's writes, at %s sandboxes and %s operations\n\n", count(m.Sandboxes), count(m.Operations))
	w("`-only migrations`, bench/bench/migrations.go: a database taken by goose to version %d (the release before's schema) and filled with one `INSERT ... SELECT generate_series` a table, which each run copies (`CREATE DATABASE ... TEMPLATE`): ", m.From)
	w("%s sandboxes of %s clients created over a year (2%% running, 2%% failed, 0.4%% paused, the rest terminated) and %s operations (4%% failed, a few queued and running, the rest succeeded with their `finished_at`), the idempotency keys of the last day, then `VACUUM (ANALYZE)`. ",
		count(m.Sandboxes), count(m.Clients), count(m.Operations))
	w("The release before's writes go on, an open loop, each timed from the moment it was due: %d creates/s as it made them (the budget key's advisory lock and live count, the row of the columns it knew, committed; then the row set running) and %d queued operations/s (the row of the columns it knew), for %s alone (the baseline) and then through `store.Migrate`, which runs our migrations from %d on and then River's (here its tables are made; a database upgraded from the release before has them, at the same River version). ",
		m.CreateRate, m.OpRate, m.Baseline, m.From+1)
	w("Each migration session waits at most %s for a lock (`store.DDLLockTimeout`). The durations of our migrations are those `Migrate` logs; what it ran while the slowest write waited is read from `pg_stat_activity`, polled every 50 ms.\n\n", m.LockTimeout)
	w("| median [min–max] of %d runs | |\n|---|---:|\n", len(m.Runs))
	w("| sandboxes / operations, total relation size MB (loaded once, in %.0f s with the vacuum; each run a copy) | %.0f / %.0f |\n", m.FillSec, m.SandboxesMB, m.OperationsMB)
	w("| `store.Migrate`, s | %s |\n", col(func(x MigrationsRun) float64 { return x.MigrateSec }).format("%.1f"))
	w("| of which our migrations (their logged durations), s | %s |\n", col(func(x MigrationsRun) float64 { return x.OursMS / 1000 }).format("%.1f"))
	w("| steps that gave way to a lock and were tried again | %s |\n", col(func(x MigrationsRun) float64 { return float64(x.Retries) }).format("%.0f"))
	for _, ph := range []struct {
		name string
		of   func(MigrationsRun) WriteLatency
	}{
		{"writes before the migration", func(x MigrationsRun) WriteLatency { return x.Baseline }},
		{"writes during the migration", func(x MigrationsRun) WriteLatency { return x.During }},
		{"of which creates", func(x MigrationsRun) WriteLatency { return x.CreatesDuring }},
		{"of which queued operations", func(x MigrationsRun) WriteLatency { return x.OpsDuring }},
	} {
		w("| %s: p50 / p99 / max ms | %s / %s / %s |\n", ph.name, col(func(x MigrationsRun) float64 { return ph.of(x).P50 }).format("%.1f"),
			col(func(x MigrationsRun) float64 { return ph.of(x).P99 }).format("%.1f"), col(func(x MigrationsRun) float64 { return ph.of(x).Max }).format("%.0f"))
	}
	w("| writes during the migration: over 1 s / failed / in all | %s / %s / %s |\n\n", col(func(x MigrationsRun) float64 { return float64(x.During.Over) }).format("%.0f"),
		col(func(x MigrationsRun) float64 { return float64(x.During.Failed) }).format("%.0f"), col(func(x MigrationsRun) float64 { return float64(x.During.Writes) }).format("%.0f"))
	w("| our migration | ms |\n|---|---:|\n")
	for _, src := range m.sources() {
		w("| `%s` | %s |\n", src, summarize(m.stepColumn(src)).format("%.0f"))
	}
	w("\n")
	w("The slowest write of the first run was due %.1f s into the migration, while it ran `%s`. After every run the schema is at version %d of %d and `store.CheckMigrated` finds nothing pending: %v.",
		first.SlowestAtSec, orNone(first.Slowest), first.Version, first.Head, m.allMigrated())
	if len(first.Baseline.Errors)+len(first.During.Errors) > 0 {
		w(" Failures: %s.", strings.Join(append(slices.Clone(first.Baseline.Errors), first.During.Errors...), "; "))
	}
	w("\n\n")
	if h := m.Held; h != nil {
		w("**Behind a long transaction** (one run more, not in the medians): a transaction that read `sandboxes` (`SELECT count(*)`, as a report would) began as the migration started and stayed open %.1f s. ", h.HeldSec)
		w("`store.Migrate` took %.1f s; steps that gave way to the lock after %s and were tried again: %d. The migration waited for a lock at %s, from its start. ",
			h.MigrateSec, m.LockTimeout, h.Retries, describeWaits(h.Waits))
		w("The writes during it: %s; the slowest, due %.1f s in, waited while the migration ran `%s`: a write queues behind the ALTER that waits, so each wait of the ALTER is a wait of every write to the table. ",
			h.During.line(), h.SlowestAtSec, orNone(h.Slowest))
		w("The schema at its head afterwards: %v; %d of the %d migrations were logged with their durations (those applied in an attempt that then gave way are not).\n\n", h.Migrated, len(h.Steps), h.Head-int64(m.From))
	}
}

// allMigrated reports whether every run, the held one included, ended at the head.
func (r *MigrationsResult) allMigrated() bool {
	for _, run := range append(slices.Clone(r.Runs), ptrRuns(r.Held)...) {
		if !run.Migrated || run.Version != run.Head {
			return false
		}
	}
	return len(r.Runs) > 0
}

func ptrRuns(p *MigrationsRun) []MigrationsRun {
	if p == nil {
		return nil
	}
	return []MigrationsRun{*p}
}
