package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

// The lifecycle scenario (`-only lifecycle`): what one enforcement round of
// internal/sandbox's Lifecycle costs at scale. A database of the bench's own holds
// sizes.lifecycleLive running sandboxes of sizes.lifecycleClients clients, written by
// one INSERT ... SELECT generate_series and then vacuumed and analyzed (as autovacuum
// would have left a table of that size); every stride-th of them (sizes.lifecycleDue
// in all, spread through the table and across the clients) has its idle deadline in
// the past, the rest theirs 10 to 20 minutes ahead and their max lifetime hours ahead.
// The simulated substrate, with no latency, holds a resource for each due sandbox, so
// that its pause (a snapshot) succeeds. Each run, on a table loaded afresh:
//
//   - the due query (sandbox.DueQuery, the very SQL and batch bound of a round) under
//     EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON), as the first query of a round runs it
//     and once more as a generic plan, which a connection's cached statement may switch
//     to after five executions: its time in Postgres and whether it reads the
//     sandboxes_lifecycle_due index;
//   - one Lifecycle.Round, from a Service and a Lifecycle built as internal/app
//     builds them, which takes every due action: its wall time, its due queries and
//     the actions it took;
//   - a second round right after, with nothing due: what every round costs in steady
//     state; and the due query explained once more, with nothing due;
//   - the checks: every due sandbox paused exactly once (one snapshot each, its row
//     paused for idle), no other row touched.

// LifecycleRun is one run of the lifecycle scenario.
type LifecycleRun struct {
	// RoundMS is the wall time of the round that took the due actions; Queries the due
	// queries it ran; Pauses the idle pauses it took; Other every other outcome it
	// counted (another action, a failure, a sandbox that moved on: none expected).
	RoundMS float64
	Queries int
	Pauses  int
	Other   int
	// Due is the due query explained before the round, as a round's first query runs
	// it; Generic the same as a generic plan; IdleDue the due query right after the
	// rounds, with nothing due.
	Due, Generic, IdleDue Explained
	// IdleRoundMS is the wall time of the round right after, with nothing due; its
	// due queries and the actions it counted (none expected).
	IdleRoundMS float64
	IdleQueries int
	IdleOther   int
	// What the rows and the substrate say after both rounds: due rows paused for idle,
	// other rows paused or ended (none expected), rows still running; snapshots the
	// substrate took, due sandboxes it snapshotted exactly once, resources left.
	PausedDue, PausedOther, Running  int
	Snapshots, SnapshottedOnce, Left int
}

// Explained is one EXPLAIN ANALYZE of the due query.
type Explained struct {
	// ExecMS and PlanMS are Postgres's "Execution Time" and "Planning Time".
	ExecMS, PlanMS float64
	// Rows is what the query returned; Buffers the shared blocks it hit or read;
	// Estimated the rows the planner expected of the node that reads the index.
	Rows, Buffers, Estimated int
	// Plan is its nodes, outermost first ("Limit → Index Scan using … on sandboxes").
	Plan string
	// UsesIndex is true when a node reads sandboxes_lifecycle_due; SeqScan when one
	// reads the whole of sandboxes.
	UsesIndex, SeqScan bool
}

// LifecycleResult is the lifecycle scenario.
type LifecycleResult struct {
	Live, Due, Clients int
	// Batch is the due query's bound (sandbox.DueQuery); Interval the rounds'.
	Batch    int
	Interval time.Duration
	// Lifecycle is every client's.
	Lifecycle space.Lifecycle
	Runs      []LifecycleRun
}

// lifecycleIndex is the index the due query is built for (migrations/00014).
const lifecycleIndex = "sandboxes_lifecycle_due"

// benchLifecycle is every client's lifecycle: docs/contract.md's example tier, a
// cap of paused sandboxes included, so that each pause counts its client's first.
var benchLifecycle = space.Lifecycle{MaxLifetime: 24 * time.Hour, IdleTimeout: 15 * time.Minute, IdleAction: space.IdlePause,
	PausedRetention: 7 * 24 * time.Hour, PausedSandboxes: 100}

func runLifecycle(ctx context.Context, env *Env, runs int, sz sizes) (*LifecycleResult, error) {
	if sz.lifecycleDue <= 0 || sz.lifecycleLive%sz.lifecycleDue != 0 {
		return nil, fmt.Errorf("lifecycle: %d live sandboxes are not a whole number of times %d due", sz.lifecycleLive, sz.lifecycleDue)
	}
	_, args := sandbox.DueQuery()
	batch, _ := args[0].(int)
	res := &LifecycleResult{Live: sz.lifecycleLive, Due: sz.lifecycleDue, Clients: sz.lifecycleClients, Batch: batch,
		Interval: config.Default().Lifecycle.Interval, Lifecycle: benchLifecycle}
	db, drop, err := env.benchDatabase(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	for i := range runs {
		run, err := res.run(ctx, db)
		if err != nil {
			return nil, fmt.Errorf("run %d: %w", i+1, err)
		}
		env.logf("lifecycle: run %d: round %.1f ms (%d pauses, %d queries), due query %.2f ms (%s), idle round %.2f ms",
			i+1, run.RoundMS, run.Pauses, run.Queries, run.Due.ExecMS, run.Due.Plan, run.IdleRoundMS)
		res.Runs = append(res.Runs, run)
	}
	return res, nil
}

// benchDatabase creates a database of the bench's own and migrates it; drop closes
// and drops it.
func (e *Env) benchDatabase(ctx context.Context) (*pgxpool.Pool, func(), error) {
	e.leftovers.Do(func() {
		if err := testenv.DropLeftoverDatabases(ctx, e.AdminURL); err != nil {
			e.logf("dropping leftover databases: %v", err)
		}
	})
	url, drop, err := testenv.CreateDatabase(ctx, e.AdminURL, "")
	if err != nil {
		return nil, nil, fmt.Errorf("bench database: %w", err)
	}
	db, err := store.Open(ctx, url)
	if err != nil {
		drop()
		return nil, nil, err
	}
	if err := store.Migrate(ctx, db, nil); err != nil {
		db.Close()
		drop()
		return nil, nil, err
	}
	return db, func() { db.Close(); drop() }, nil
}

// run loads the table afresh and measures one round and the idle round after it.
func (r *LifecycleResult) run(ctx context.Context, db *pgxpool.Pool) (LifecycleRun, error) {
	var out LifecycleRun
	due, err := r.load(ctx, db)
	if err != nil {
		return out, err
	}
	sim := substrate.NewSimulated(substrate.SimulatedOptions{})
	for id, client := range due {
		if _, err := sim.StartCold(ctx, substrate.Spec{SandboxID: id, Client: space.ClientID(client), Shape: benchShape}); err != nil {
			return out, err
		}
	}
	if out.Due, err = explainDue(ctx, db, false); err != nil {
		return out, err
	}
	if out.Generic, err = explainDue(ctx, db, true); err != nil {
		return out, err
	}

	// As cmd/space-api's wire.go builds them; a round charges nothing (a pause or an
	// end is no activation), so there is no Charger, and no pool demand to follow.
	reg := prometheus.NewRegistry()
	svc := sandbox.New(sandbox.Options{
		DB: db, Pool: pool.New(pool.Options{DB: db, Substrate: sim, Registerer: reg}), Substrate: sim,
		Catalog: sandbox.Catalog{Templates: substrate.Templates{benchShape.Template: {Name: benchShape.Template, Image: "python:3.12-slim"}},
			Max: space.Shape{CPUMillis: 8000, MemoryMiB: 16384, DiskGiB: 100}},
		IdempotencyTTL: config.Default().IdempotencyKeyTTL,
		Registerer:     reg,
	})
	life, err := sandbox.NewLifecycle(sandbox.LifecycleOptions{Service: svc, Interval: r.Interval, Registerer: reg,
		Resolve: func(_ context.Context, owner space.ClientID) space.Caller {
			return space.Caller{ID: owner, Key: space.ClientKey(owner), Allowlisted: true, Tier: "pro", Lifecycle: r.Lifecycle}
		}})
	if err != nil {
		return out, err
	}
	round := func() (float64, sandbox.LifecycleResult, error) {
		start := time.Now()
		res, err := life.Round(ctx)
		wall := ms(time.Since(start))
		if err == nil && !res.Leader {
			err = fmt.Errorf("the round did not take the lifecycle lock of a database of its own")
		}
		return wall, res, err
	}
	wall, busy, err := round()
	if err != nil {
		return out, err
	}
	out.RoundMS, out.Queries = wall, busy.Queries
	out.Pauses = busy.Taken[[2]string{"pause", space.ReasonIdle}]
	out.Other = lifecycleTaken(busy) - out.Pauses + busy.Failed + busy.Skipped
	wall, idle, err := round()
	if err != nil {
		return out, err
	}
	out.IdleRoundMS, out.IdleQueries, out.IdleOther = wall, idle.Queries, lifecycleTaken(idle)+idle.Failed+idle.Skipped
	if out.IdleDue, err = explainDue(ctx, db, false); err != nil {
		return out, err
	}

	ids := make([]string, 0, len(due))
	for id := range due {
		ids = append(ids, id)
	}
	if err := db.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE state = 'paused' AND pause_reason = 'idle' AND id = ANY($1::uuid[])),
			count(*) FILTER (WHERE state <> 'running' AND NOT (state = 'paused' AND pause_reason = 'idle' AND id = ANY($1::uuid[]))),
			count(*) FILTER (WHERE state = 'running')
		FROM sandboxes`, ids).Scan(&out.PausedDue, &out.PausedOther, &out.Running); err != nil {
		return out, fmt.Errorf("count the rows after the rounds: %w", err)
	}
	snapshots := map[string]int{}
	for _, c := range sim.Calls() {
		if c.Op == substrate.OpSnapshot {
			out.Snapshots++
			snapshots[c.SandboxID]++
		}
	}
	for id := range due {
		if snapshots[id] == 1 {
			out.SnapshottedOnce++
		}
	}
	out.Left = sim.Running()
	return out, nil
}

// lifecycleTaken is how many actions res counts.
func lifecycleTaken(res sandbox.LifecycleResult) int {
	n := 0
	for _, v := range res.Taken {
		n += v
	}
	return n
}

// load empties sandboxes and fills it with r.Live running sandboxes, r.Due of them
// due, and returns the due ones' owners by id.
func (r *LifecycleResult) load(ctx context.Context, db *pgxpool.Pool) (map[string]string, error) {
	stride := r.Live / r.Due
	// Every stride-th row is due, its idle deadline 1 s to r.Due s ago (the earliest
	// the one written last); the others' 10 to 20 minutes ahead. Created over the last
	// 12 hours, each ends at its max lifetime, a day after its creation. The clients
	// are a hash of the row's number: each has about r.Live / r.Clients sandboxes, and
	// the due ones are spread across them.
	if _, err := db.Exec(ctx, `TRUNCATE sandboxes CASCADE`); err != nil {
		return nil, fmt.Errorf("empty sandboxes: %w", err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib,
			substrate_ref, created_at, updated_at, expires_at, idle_at, idle_action)
		SELECT g.id, g.client, g.client, 'running', $4, $5, $6, $7,
			'sim-' || g.id::text, g.created, g.created, g.created + make_interval(secs => $8),
			CASE WHEN g.i % $3 = 0 THEN now() - make_interval(secs => 1 + g.i / $3)
				ELSE now() + make_interval(secs => 600 + abs(hashint4(g.i + 1)) % 600) END,
			'pause'
		FROM (SELECT i, gen_random_uuid() AS id, 'bench-client-' || abs(hashint4(i)) % $2 AS client,
				now() - make_interval(secs => i % 43200) AS created
			FROM generate_series(1, $1::int) i) g`,
		r.Live, r.Clients, stride, benchShape.Template, benchShape.CPUMillis, benchShape.MemoryMiB, benchShape.DiskGiB,
		r.Lifecycle.MaxLifetime.Seconds()); err != nil {
		return nil, fmt.Errorf("load %d sandboxes: %w", r.Live, err)
	}
	if _, err := db.Exec(ctx, `VACUUM (ANALYZE) sandboxes`); err != nil {
		return nil, fmt.Errorf("vacuum sandboxes: %w", err)
	}
	rows, err := db.Query(ctx, `SELECT id::text, client FROM sandboxes WHERE idle_at <= now()`)
	if err != nil {
		return nil, fmt.Errorf("read the due sandboxes: %w", err)
	}
	defer rows.Close()
	due := map[string]string{}
	for rows.Next() {
		var id, client string
		if err := rows.Scan(&id, &client); err != nil {
			return nil, err
		}
		due[id] = client
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(due) != r.Due {
		return nil, fmt.Errorf("%d sandboxes due after the load, want %d", len(due), r.Due)
	}
	return due, nil
}

// explainDue runs the due query under EXPLAIN ANALYZE: as a round's first execution
// runs it (its plan made for the batch bound it is given), or, generic, as a
// prepared statement's generic plan, made for any bound.
func explainDue(ctx context.Context, db *pgxpool.Pool, generic bool) (Explained, error) {
	var out Explained
	sql, args := sandbox.DueQuery()
	conn, err := db.Acquire(ctx)
	if err != nil {
		return out, err
	}
	defer conn.Release()
	var raw []byte
	if !generic {
		err = conn.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&raw)
	} else {
		// A session's prepared statement, explained under force_generic_plan; both are
		// undone before the connection goes back to the pool.
		defer func() {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "DEALLOCATE bench_due; RESET plan_cache_mode")
		}()
		if _, err = conn.Exec(ctx, "PREPARE bench_due AS "+sql); err == nil {
			if _, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err == nil {
				err = conn.QueryRow(ctx, fmt.Sprintf("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE bench_due(%d)", args[0]), pgx.QueryExecModeSimpleProtocol).Scan(&raw)
			}
		}
	}
	if err != nil {
		return out, fmt.Errorf("explain the due query: %w", err)
	}
	return parseExplain(raw)
}

// planNode is a node of EXPLAIN's JSON.
type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	PlanRows     float64    `json:"Plan Rows"`
	ActualRows   float64    `json:"Actual Rows"`
	SharedHit    int        `json:"Shared Hit Blocks"`
	SharedRead   int        `json:"Shared Read Blocks"`
	Plans        []planNode `json:"Plans"`
}

// parseExplain reads EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)'s answer.
func parseExplain(raw []byte) (Explained, error) {
	var out Explained
	var doc []struct {
		Plan          planNode `json:"Plan"`
		PlanningTime  float64  `json:"Planning Time"`
		ExecutionTime float64  `json:"Execution Time"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc) != 1 {
		return out, fmt.Errorf("EXPLAIN's JSON (%v): %.200s", err, raw)
	}
	top := doc[0].Plan
	out.ExecMS, out.PlanMS = doc[0].ExecutionTime, doc[0].PlanningTime
	out.Rows, out.Buffers = int(top.ActualRows), top.SharedHit+top.SharedRead
	var describe func(n planNode) string
	describe = func(n planNode) string {
		s := n.NodeType
		if n.IndexName != "" {
			s += " using " + n.IndexName
		}
		if n.RelationName != "" {
			s += " on " + n.RelationName
		}
		if n.IndexName == lifecycleIndex {
			out.UsesIndex, out.Estimated = true, int(n.PlanRows)
		}
		out.SeqScan = out.SeqScan || n.NodeType == "Seq Scan" && n.RelationName == "sandboxes"
		var kids []string
		for _, k := range n.Plans {
			kids = append(kids, describe(k))
		}
		switch len(kids) {
		case 0:
			return s
		case 1:
			return s + " → " + kids[0]
		}
		return s + " → (" + strings.Join(kids, "; ") + ")"
	}
	out.Plan = describe(top)
	return out, nil
}

// PerAction is a run's round wall time per action taken, in ms.
func (r LifecycleRun) PerAction() float64 {
	if r.Pauses+r.Other == 0 {
		return 0
	}
	return r.RoundMS / float64(r.Pauses+r.Other)
}

// column returns f of each run.
func (r *LifecycleResult) column(f func(LifecycleRun) float64) []float64 {
	out := make([]float64, len(r.Runs))
	for i, run := range r.Runs {
		out[i] = f(run)
	}
	return out
}

// indexed reports whether every explain of every run read the index and none read
// the whole table.
func (r *LifecycleResult) indexed() bool {
	for _, run := range r.Runs {
		for _, e := range []Explained{run.Due, run.Generic, run.IdleDue} {
			if !e.UsesIndex || e.SeqScan {
				return false
			}
		}
	}
	return len(r.Runs) > 0
}

// lifecycleTargets are the scenario's targets.
func (r *Report) lifecycleTargets() []Target {
	l := r.Lifecycle
	if l == nil || len(l.Runs) == 0 {
		return nil
	}
	return []Target{{fmt.Sprintf("the due query at %s live sandboxes reads %s, no seq scan (custom and generic plans, due and idle)", count(l.Live), lifecycleIndex),
		l.Runs[0].Due.Plan, l.indexed()}}
}

// lifecycleSummary writes the scenario's lines of the plain-text summary.
func (r *Report) lifecycleSummary(b *strings.Builder) {
	l := r.Lifecycle
	if l == nil {
		return
	}
	fmt.Fprintf(b, "  lifecycle %s live, %s due: round %s ms (%s ms per action), idle round %s ms; due query %s ms in Postgres (generic plan %s ms, nothing due %s ms)\n",
		count(l.Live), count(l.Due), summarize(l.column(func(x LifecycleRun) float64 { return x.RoundMS })).format("%.0f"),
		summarize(l.column(LifecycleRun.PerAction)).format("%.2f"),
		summarize(l.column(func(x LifecycleRun) float64 { return x.IdleRoundMS })).format("%.2f"),
		summarize(l.column(func(x LifecycleRun) float64 { return x.Due.ExecMS })).format("%.2f"),
		summarize(l.column(func(x LifecycleRun) float64 { return x.Generic.ExecMS })).format("%.2f"),
		summarize(l.column(func(x LifecycleRun) float64 { return x.IdleDue.ExecMS })).format("%.2f"))
	for i, run := range l.Runs {
		fmt.Fprintf(b, "  lifecycle run %d: %d pauses (%d other), %d due queries, idle round %d queries (%d other); %d due paused (%d snapshotted once), %d other rows moved, %d left on the substrate; plan %s\n",
			i+1, run.Pauses, run.Other, run.Queries, run.IdleQueries, run.IdleOther, run.PausedDue, run.SnapshottedOnce, run.PausedOther, run.Left, run.Due.Plan)
	}
}

// lifecycleMarkdown writes the scenario's section of docs/benchmarks.md.
func (r *Report) lifecycleMarkdown(b *strings.Builder) {
	l := r.Lifecycle
	if l == nil || len(l.Runs) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	col := func(f func(LifecycleRun) float64) Stat { return summarize(l.column(f)) }
	first := l.Runs[0]
	w("### 8. Lifecycle: one enforcement round at %s live sandboxes\n\n", count(l.Live))
	w("`-only lifecycle`, bench/bench/lifecycle.go: a database of the bench's own holds %s running sandboxes of %s clients, written with one `INSERT ... SELECT generate_series` and then `VACUUM (ANALYZE)`; ", count(l.Live), count(l.Clients))
	w("%s of them, spread through the table and across the clients, are idle past their deadline, the others' idle deadlines 10 to 20 minutes ahead and every max lifetime hours ahead. ", count(l.Due))
	w("Every client's lifecycle is docs/contract.md's example tier (idle %s → pause, max lifetime %s, retention %s, a cap of %d paused sandboxes, which each pause counts first). ",
		hours(l.Lifecycle.IdleTimeout), hours(l.Lifecycle.MaxLifetime), hours(l.Lifecycle.PausedRetention), l.Lifecycle.PausedSandboxes)
	w("The simulated substrate, with no latency, holds a resource for each due sandbox, so every pause's snapshot succeeds: the round's time is the product's and Postgres's, none of it a substrate's. ")
	w("Each run loads the table afresh, explains the due query (`sandbox.DueQuery`, the round's own SQL and bound of %d) with `EXPLAIN (ANALYZE, BUFFERS)`, runs one `Lifecycle.Round` (a Service and a Lifecycle built as `internal/app` builds them, default parallelism), then a second round right after.\n\n", l.Batch)
	w("| median [min–max] of %d runs | |\n|---|---:|\n", len(l.Runs))
	w("| round that takes the %s due actions, wall ms | %s |\n", count(l.Due), col(func(x LifecycleRun) float64 { return x.RoundMS }).format("%.0f"))
	w("| per action, ms | %s |\n", col(LifecycleRun.PerAction).format("%.2f"))
	w("| actions taken | %s pauses |\n", col(func(x LifecycleRun) float64 { return float64(x.Pauses) }).format("%.0f"))
	w("| due queries the round ran (batches of %d) | %s |\n", l.Batch, col(func(x LifecycleRun) float64 { return float64(x.Queries) }).format("%.0f"))
	w("| the due query in Postgres, ms (execution; planning beside) | %s (%s) |\n", col(func(x LifecycleRun) float64 { return x.Due.ExecMS }).format("%.2f"), col(func(x LifecycleRun) float64 { return x.Due.PlanMS }).format("%.2f"))
	w("| the same as a generic plan, ms | %s |\n", col(func(x LifecycleRun) float64 { return x.Generic.ExecMS }).format("%.2f"))
	w("| round right after, nothing due, wall ms | %s |\n", col(func(x LifecycleRun) float64 { return x.IdleRoundMS }).format("%.2f"))
	w("| the due query then, nothing due, ms in Postgres (shared blocks) | %s (%s) |\n\n", col(func(x LifecycleRun) float64 { return x.IdleDue.ExecMS }).format("%.2f"),
		col(func(x LifecycleRun) float64 { return float64(x.IdleDue.Buffers) }).format("%.0f"))
	w("Plan of the due query at %s due: `%s`, %d rows, %d shared blocks; as a generic plan: `%s`; nothing due: `%s`, %d shared blocks. ",
		count(l.Due), first.Due.Plan, first.Due.Rows, first.Due.Buffers, first.Generic.Plan, first.IdleDue.Plan, first.IdleDue.Buffers)
	state := "every run"
	if !l.indexed() {
		state = "**not** every run"
	}
	w("In %s every plan reads `%s` and none scans `sandboxes` whole. ", state, lifecycleIndex)
	// The index read in its order, stopping at the bound: the plan the index is for.
	ordered := strings.HasPrefix(first.Due.Plan, "Limit → Index Scan using "+lifecycleIndex)
	w("The planner expects %s rows of the index where %s are due: Postgres keeps no statistics of a partial index's expression and takes its default third of the table", count(first.Due.Estimated), count(l.Due))
	if ordered {
		w(", which does not matter to this query: its `ORDER BY ... LIMIT` reads the index in its order and stops at the bound")
	}
	w(". ")
	w("After the rounds, in every run: %s due sandboxes paused for idle (each snapshotted once: %s), %s other rows moved, %s resources left on the substrate; the round right after took %s actions in %s due query.\n\n",
		col(func(x LifecycleRun) float64 { return float64(x.PausedDue) }).format("%.0f"),
		col(func(x LifecycleRun) float64 { return float64(x.SnapshottedOnce) }).format("%.0f"),
		col(func(x LifecycleRun) float64 { return float64(x.PausedOther) }).format("%.0f"),
		col(func(x LifecycleRun) float64 { return float64(x.Left) }).format("%.0f"),
		col(func(x LifecycleRun) float64 { return float64(x.IdleOther) }).format("%.0f"),
		col(func(x LifecycleRun) float64 { return float64(x.IdleQueries) }).format("%.0f"))
	due, round, per, idle := col(func(x LifecycleRun) float64 { return x.Due.ExecMS }), col(func(x LifecycleRun) float64 { return x.RoundMS }),
		col(LifecycleRun.PerAction), col(func(x LifecycleRun) float64 { return x.IdleRoundMS })
	w("What it means: at %s live sandboxes, finding the due ones is not what a round costs (%.2f ms in Postgres for a batch of up to %d); its %.0f ms are its %s actions, %.2f ms each, each a transaction of its own (the paused cap's lock and count, the guarded write), the snapshot and the write that records it, a few at once. ",
		count(l.Live), due.Median, l.Batch, round.Median, count(l.Due), per.Median)
	w("A real substrate's snapshot time comes on top of each pause (none here). ")
	w("A round with nothing due, which is every round in steady state, costs %.2f ms on the replica holding the lock: the lock, one indexed query that returns nothing, the unlock.\n\n", idle.Median)
}

// hours renders a lifecycle's duration in its largest whole unit: 15 min, 24 h, 7 days.
func hours(d time.Duration) string {
	switch {
	case d >= 48*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	case d >= time.Hour && d%time.Hour == 0:
		return fmt.Sprintf("%d h", d/time.Hour)
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%d min", d/time.Minute)
	}
	return d.String()
}
