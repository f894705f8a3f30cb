package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The soak scenario (`-only soak`): steady creates and deletes against one space-api
// whose retention is short, to show that the tables stop growing and the creates do
// not slow down as the history turns over. The server runs with
// SPACE_RETENTION_SANDBOXES and SPACE_RETENTION_OPERATIONS at sizes.soakRetention and
// SPACE_RECONCILE_INTERVAL at 1 s (retention deletes in the reconciler's round), one
// client whose rate and caps no run reaches. An open loop sends sizes.soakRate
// synchronous creates a second, each deleted sizes.soakHold after its 201, and
// sizes.soakAsyncRate queued ones (Prefer: respond-async), each followed until its
// operation succeeds and then deleted, for sizes.soakDur (the -soak flag sets another
// duration). Every sizes.soakEvery a sampler reads the rows of sandboxes, operations
// and River's river_job, their total relation sizes (indexes and TOAST included), the
// database's size, and the creates' latency over the window since the last sample.
// At the end, the rows retention deleted (space_retention_deleted_total, scraped from
// the server's internal /metrics).

// SoakSample is one reading of the tables, and the creates of the window before it.
type SoakSample struct {
	AtSec                                  float64
	Sandboxes, Operations, RiverJobs       int64
	SandboxesMB, OperationsMB, RiverJobsMB float64
	DatabaseMB                             float64
	// Creates are the synchronous creates due in the window, their P50 and P99 in ms
	// from when each was due; Queued the queued creates, QueuedP99 their 202's.
	Creates   int
	P50, P99  float64
	Queued    int
	QueuedP99 float64
	// DeadSandboxes and DeadOperations are the tables' dead rows (n_dead_tup) before
	// any vacuum of this sample; AutoVacuums the times autovacuum vacuumed either so
	// far; Vacuumed the tables the sampler vacuumed in its stead (vacuumLikeAutovacuum).
	DeadSandboxes, DeadOperations int64
	AutoVacuums                   int64
	Vacuumed                      []string
	// Load is the machine's load average over the last minute (/proc/loadavg), which
	// on the shared machine says how much else ran beside.
	Load float64
}

// SoakResult is the soak scenario.
type SoakResult struct {
	Duration, Every, Retention, Reconcile, Hold time.Duration
	Rate, AsyncRate                             int
	Samples                                     []SoakSample
	// Created are the sandboxes made (201s, and queued creates whose operation
	// succeeded); Deleted those deleted (204 or 202).
	Created, Deleted int
	// Outcomes counts every answer: "create 201", "queued 202", "operation succeeded",
	// "delete 204", anything else by what it was.
	Outcomes map[string]int
	// Failed counts the creates, queued creates and deletes that did not get their
	// answer (a status other than the one expected, no answer, an operation that
	// failed or did not end within 30 s).
	Failed int
	// Purged is space_retention_deleted_total by table at the end.
	Purged map[string]float64
	// Errors are the first few requests that got no answer, with why.
	Errors []string
	// ServerErrors are the server's log lines at level ERROR.
	ServerErrors int
}

func runSoak(ctx context.Context, env *Env, sz sizes) (*SoakResult, error) {
	res := &SoakResult{Duration: sz.soakDur, Every: sz.soakEvery, Retention: sz.soakRetention, Reconcile: time.Second,
		Hold: sz.soakHold, Rate: sz.soakRate, AsyncRate: sz.soakAsyncRate, Outcomes: map[string]int{}, Purged: map[string]float64{}}
	st, err := env.newStack(ctx)
	if err != nil {
		return nil, err
	}
	defer st.close()
	flags, err := flagsFile(map[string]quota{soakClient: {Concurrency: 1000, LiveSandboxes: 5000}},
		map[string]*rateEntry{soakClient: {RefillRPS: 1e6, Burst: 1e6}}, nil)
	if err != nil {
		return nil, err
	}
	srv, err := env.startServer(ctx, serverConfig{Name: "soak", DB: st.db, RedisAddr: st.redis.Addr, Flags: flags, Env: map[string]string{
		"SPACE_RETENTION_SANDBOXES":                     res.Retention.String(),
		"SPACE_RETENTION_OPERATIONS":                    res.Retention.String(),
		"SPACE_RECONCILE_INTERVAL":                      res.Reconcile.String(),
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS": "1000000",
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST":      "1000000",
	}})
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	conn, err := pgx.Connect(ctx, st.db.URL)
	if err != nil {
		return nil, fmt.Errorf("soak: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	d := &soakDriver{base: srv.PublicURL, hold: res.Hold, outcomes: map[string]int{},
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}}}
	defer d.client.CloseIdleConnections()
	t0 := time.Now()
	sending, stop := context.WithTimeout(ctx, res.Duration)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() { d.pace(sending, ctx, t0, res.Rate, d.syncCreate) })
	wg.Go(func() { d.pace(sending, ctx, t0, res.AsyncRate, d.queuedCreate) })

	var samples []SoakSample
	for i := 1; ; i++ {
		at := t0.Add(time.Duration(i) * res.Every)
		if at.After(t0.Add(res.Duration)) {
			break
		}
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil, ctx.Err()
		case <-time.After(time.Until(at)):
		}
		s, err := sampleTables(ctx, conn)
		if err == nil {
			s.Vacuumed, err = vacuumLikeAutovacuum(ctx, conn)
		}
		if err != nil {
			stop()
			wg.Wait()
			return nil, err
		}
		s.AtSec = at.Sub(t0).Seconds()
		s.Load = loadAverage()
		samples = append(samples, s)
		env.logf("soak: %3.0f s: %d sandboxes (%.1f MB, %d dead), %d operations (%.1f MB, %d dead), %d river jobs; %d autovacuums, vacuumed %v",
			s.AtSec, s.Sandboxes, s.SandboxesMB, s.DeadSandboxes, s.Operations, s.OperationsMB, s.DeadOperations, s.RiverJobs, s.AutoVacuums, s.Vacuumed)
		if err := srv.alive(); err != nil {
			stop()
			wg.Wait()
			return nil, err
		}
	}
	wg.Wait()

	// Each window's creates, by when they were due.
	calls := d.results()
	for i := range samples {
		from, to := 0.0, samples[i].AtSec
		if i > 0 {
			from = samples[i-1].AtSec
		}
		var syncs, queued []time.Duration
		for _, c := range calls {
			if at := c.due.Sub(t0).Seconds(); at < from || at >= to || !c.ok {
				continue
			}
			if c.queued {
				queued = append(queued, c.latency)
			} else {
				syncs = append(syncs, c.latency)
			}
		}
		samples[i].Creates, samples[i].Queued = len(syncs), len(queued)
		samples[i].P50, samples[i].P99 = ms(percentile(syncs, 50)), ms(percentile(syncs, 99))
		samples[i].QueuedP99 = ms(percentile(queued, 99))
	}
	res.Samples = samples
	d.mu.Lock()
	res.Created, res.Deleted, res.Failed, res.Errors = d.created, d.deleted, d.failed, d.errors
	for k, v := range d.outcomes {
		res.Outcomes[k] = v
	}
	d.mu.Unlock()
	for _, table := range []string{"sandboxes", "operations"} {
		v, err := srv.metric(ctx, "space_retention_deleted_total", "table", table)
		if err != nil {
			return nil, err
		}
		res.Purged[table] = v
	}
	if b, err := os.ReadFile(srv.LogPath); err == nil {
		res.ServerErrors = strings.Count(string(b), `"level":"ERROR"`)
	}
	return res, nil
}

// loadAverage is the machine's load average over the last minute; 0 when unknown.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	_, _ = fmt.Sscan(string(b), &l)
	return l
}

// soakClient is the soak's one client.
const soakClient = "bench-soak"

// soakBody is the soak's create: the cold shape of the HTTP scenario.
const soakBody = coldBody

// sampleTables reads the tables' rows and sizes.
func sampleTables(ctx context.Context, conn *pgx.Conn) (SoakSample, error) {
	var s SoakSample
	var sb, op, rj, dbBytes int64
	err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM sandboxes), (SELECT count(*) FROM operations), (SELECT count(*) FROM river_job),
			pg_total_relation_size('sandboxes'), pg_total_relation_size('operations'), pg_total_relation_size('river_job'),
			pg_database_size(current_database())`).Scan(&s.Sandboxes, &s.Operations, &s.RiverJobs, &sb, &op, &rj, &dbBytes)
	if err != nil {
		return s, fmt.Errorf("soak: sample the tables: %w", err)
	}
	mb := func(n int64) float64 { return float64(n) / (1 << 20) }
	s.SandboxesMB, s.OperationsMB, s.RiverJobsMB, s.DatabaseMB = mb(sb), mb(op), mb(rj), mb(dbBytes)
	err = conn.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup) FILTER (WHERE relname = 'sandboxes'), 0), coalesce(sum(n_dead_tup) FILTER (WHERE relname = 'operations'), 0),
			coalesce(sum(autovacuum_count), 0)
		FROM pg_stat_user_tables WHERE relname IN ('sandboxes', 'operations')`).Scan(&s.DeadSandboxes, &s.DeadOperations, &s.AutoVacuums)
	if err != nil {
		return s, fmt.Errorf("soak: the tables' dead rows: %w", err)
	}
	return s, nil
}

// vacuumLikeAutovacuum vacuums sandboxes and operations when autovacuum, at its
// default settings, would have: the table's dead rows over 50 + 20% of its live ones,
// and no vacuum of it for a minute (autovacuum_naptime). The services' Postgres is
// shared by every test database of the machine: its autovacuum launcher starts each
// worker in the database whose last visit is the oldest, one never visited first, and
// with the tests' databases coming and going the bench's database, visited once when
// it was made, waited minutes for its second visit (a table of 2,000 rows, updated
// whole every 2 s, went 3 minutes unvisited with 120,000 dead rows). The sampler
// stands in for that visit, so that the sizes measured are those of the product's
// writes under the default autovacuum, not of the machine's churn of databases; it
// returns the tables it vacuumed.
func vacuumLikeAutovacuum(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT relname FROM pg_stat_user_tables
		WHERE relname IN ('sandboxes', 'operations') AND n_dead_tup > 50 + 0.2 * n_live_tup
			AND coalesce(greatest(last_autovacuum, last_vacuum), '-infinity') < now() - interval '1 minute'
		ORDER BY relname`)
	if err != nil {
		return nil, fmt.Errorf("soak: tables due a vacuum: %w", err)
	}
	due, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("soak: tables due a vacuum: %w", err)
	}
	for _, t := range due {
		if _, err := conn.Exec(ctx, "VACUUM "+pgx.Identifier{t}.Sanitize()); err != nil {
			return nil, fmt.Errorf("soak: vacuum %s: %w", t, err)
		}
	}
	return due, nil
}

// soakDriver sends the soak's load and counts its answers.
type soakDriver struct {
	base   string
	hold   time.Duration
	client *http.Client

	mu                       sync.Mutex
	errors                   []string
	calls                    []soakCall
	outcomes                 map[string]int
	created, deleted, failed int
}

// soakCall is one create: when it was due, how long its answer took from then, and
// whether it was the answer expected.
type soakCall struct {
	due     time.Time
	latency time.Duration
	queued  bool
	ok      bool
}

func (d *soakDriver) count(outcome string, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.outcomes[outcome]++
	if !ok {
		d.failed++
	}
}

func (d *soakDriver) results() []soakCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]soakCall(nil), d.calls...)
}

// pace calls send every 1/rate s until sending is done, each in a goroutine of its
// own running under ctx, and waits for the last.
func (d *soakDriver) pace(sending, ctx context.Context, t0 time.Time, rate int, send func(context.Context, time.Time)) {
	if rate <= 0 {
		return
	}
	interval := time.Second / time.Duration(rate)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 1; ; i++ {
		due := t0.Add(time.Duration(i) * interval)
		select {
		case <-sending.Done():
			return
		case <-time.After(time.Until(due)):
		}
		wg.Go(func() { send(ctx, due) })
	}
}

// request sends one request of the soak's client and returns its status and body.
func (d *soakDriver) request(ctx context.Context, method, path, body string, header ...string) (int, []byte, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("X-Client-ID", soakClient)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// syncCreate creates a sandbox and deletes it hold after.
func (d *soakDriver) syncCreate(ctx context.Context, due time.Time) {
	code, body, err := d.request(ctx, http.MethodPost, "/v1/sandboxes", soakBody)
	call := soakCall{due: due, latency: time.Since(due), ok: err == nil && code == http.StatusCreated}
	d.mu.Lock()
	d.calls = append(d.calls, call)
	if call.ok {
		d.created++
	}
	d.mu.Unlock()
	if !call.ok {
		d.count(d.answerName("create", code, err), false)
		return
	}
	d.count("create 201", true)
	var sb struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &sb); err != nil || sb.ID == "" {
		d.count("create 201 without an id", false)
		return
	}
	select {
	case <-time.After(d.hold):
	case <-ctx.Done():
		return
	}
	d.delete(ctx, sb.ID)
}

// queuedCreate queues a create, follows its operation until it ends, and deletes its
// sandbox.
func (d *soakDriver) queuedCreate(ctx context.Context, due time.Time) {
	code, body, err := d.request(ctx, http.MethodPost, "/v1/sandboxes", soakBody, "Prefer", "respond-async")
	call := soakCall{due: due, latency: time.Since(due), queued: true, ok: err == nil && code == http.StatusAccepted}
	d.mu.Lock()
	d.calls = append(d.calls, call)
	d.mu.Unlock()
	if !call.ok {
		d.count(d.answerName("queued", code, err), false)
		return
	}
	d.count("queued 202", true)
	var op struct {
		ID        string `json:"id"`
		State     string `json:"state"`
		SandboxID string `json:"sandbox_id"`
	}
	if err := json.Unmarshal(body, &op); err != nil || op.ID == "" {
		d.count("queued 202 without an id", false)
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for op.State != "succeeded" && op.State != "failed" {
		if time.Now().After(deadline) {
			d.count("operation not ended within 30s", false)
			return
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return
		}
		code, body, err := d.request(ctx, http.MethodGet, "/v1/operations/"+op.ID, "")
		if err != nil || code != http.StatusOK {
			d.count(d.answerName("operation get", code, err), false)
			return
		}
		if err := json.Unmarshal(body, &op); err != nil {
			d.count("operation get: "+err.Error(), false)
			return
		}
	}
	if op.State != "succeeded" {
		d.count("operation "+op.State, false)
		return
	}
	d.mu.Lock()
	d.created++
	d.mu.Unlock()
	d.count("operation succeeded", true)
	d.delete(ctx, op.SandboxID)
}

func (d *soakDriver) delete(ctx context.Context, id string) {
	code, _, err := d.request(ctx, http.MethodDelete, "/v1/sandboxes/"+id, "")
	if err != nil || (code != http.StatusNoContent && code != http.StatusAccepted) {
		d.count(d.answerName("delete", code, err), false)
		return
	}
	d.mu.Lock()
	d.deleted++
	d.mu.Unlock()
	d.count(fmt.Sprintf("delete %d", code), true)
}

// answerName names an answer that was not the one expected.
func (d *soakDriver) answerName(what string, code int, err error) string {
	if err != nil && !errors.Is(err, context.Canceled) {
		d.mu.Lock()
		if len(d.errors) < 5 {
			d.errors = append(d.errors, time.Now().Format("15:04:05.000")+" "+what+": "+err.Error())
		}
		d.mu.Unlock()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return what + ": cancelled"
	case err != nil:
		return what + ": no answer"
	}
	return fmt.Sprintf("%s %d", what, code)
}

// steady are the samples taken once the history had turned over: from twice the
// time a row is kept (hold and retention) on.
func (r *SoakResult) steady() []SoakSample {
	var out []SoakSample
	for _, s := range r.Samples {
		if s.AtSec >= 2*(r.Retention+r.Hold).Seconds() {
			out = append(out, s)
		}
	}
	return out
}

// halves are the median of the steady windows' create p99s over their first half and
// over their second half, in ms: a median, which one slow moment of the shared machine
// does not move.
func (r *SoakResult) halves() (early, late float64) {
	st := r.steady()
	if len(st) < 2 {
		return 0, 0
	}
	med := func(xs []SoakSample) float64 {
		var v []float64
		for _, x := range xs {
			v = append(v, x.P99)
		}
		return summarize(v).Median
	}
	return med(st[:len(st)/2]), med(st[len(st)/2:])
}

// Expected is the rows of sandboxes that a steady state keeps: every create's row for
// its hold (a queued one's for as long as its operation takes, counted as the hold),
// its retention and half a reconcile round.
func (r *SoakResult) Expected() float64 {
	return float64(r.Rate+r.AsyncRate) * (r.Hold + r.Retention + r.Reconcile/2).Seconds()
}

// Growth is how much a table's rows grew over the steady samples, as a share of the
// first of them: of sandboxes, or of operations.
func (r *SoakResult) Growth(of func(SoakSample) float64) (first, last, growth float64, ok bool) {
	st := r.steady()
	if len(st) < 2 {
		return 0, 0, 0, false
	}
	first, last = of(st[0]), of(st[len(st)-1])
	if first == 0 {
		return first, last, 0, false
	}
	return first, last, (last - first) / first, true
}

// Flat reports whether the rows of sandboxes and operations stopped growing: over the
// steady samples each grew by no more than a tenth.
func (r *SoakResult) Flat() bool {
	for _, of := range []func(SoakSample) float64{
		func(s SoakSample) float64 { return float64(s.Sandboxes) },
		func(s SoakSample) float64 { return float64(s.Operations) },
	} {
		_, _, g, ok := r.Growth(of)
		if !ok || g > 0.1 {
			return false
		}
	}
	return true
}

// soakTargets are the scenario's targets.
func (r *Report) soakTargets() []Target {
	s := r.Soak
	if s == nil || len(s.Samples) == 0 {
		return nil
	}
	sf, sl, sg, _ := s.Growth(func(x SoakSample) float64 { return float64(x.Sandboxes) })
	of, ol, og, _ := s.Growth(func(x SoakSample) float64 { return float64(x.Operations) })
	return []Target{{fmt.Sprintf("under retention of %s, the rows of sandboxes and operations stop growing (≤ +10%% from %s on, %s of steady creates and deletes)",
		s.Retention, time.Duration(2*(s.Retention+s.Hold)), s.Duration),
		fmt.Sprintf("sandboxes %.0f → %.0f (%+.0f%%), operations %.0f → %.0f (%+.0f%%); no create failed: %v", sf, sl, 100*sg, of, ol, 100*og, s.Failed == 0),
		s.Flat() && s.Failed == 0}}
}

// soakSummary writes the scenario's lines of the plain-text summary.
func (r *Report) soakSummary(b *strings.Builder) {
	s := r.Soak
	if s == nil || len(s.Samples) == 0 {
		return
	}
	first, last := s.Samples[0], s.Samples[len(s.Samples)-1]
	fmt.Fprintf(b, "  soak %s at %d creates/s + %d queued/s, retention %s: sandboxes %d → %d rows (%.1f → %.1f MB), operations %d → %d (%.1f → %.1f MB), river_job %d → %d; create p99 %.1f → %.1f ms; %d made, %d deleted, %d failed; retention deleted %.0f sandboxes, %.0f operations; flat %v\n",
		s.Duration, s.Rate, s.AsyncRate, s.Retention, first.Sandboxes, last.Sandboxes, first.SandboxesMB, last.SandboxesMB,
		first.Operations, last.Operations, first.OperationsMB, last.OperationsMB, first.RiverJobs, last.RiverJobs,
		first.P99, last.P99, s.Created, s.Deleted, s.Failed, s.Purged["sandboxes"], s.Purged["operations"], s.Flat())
}

// soakMarkdown writes the scenario's section of docs/benchmarks.md.
func (r *Report) soakMarkdown(b *strings.Builder) {
	s := r.Soak
	if s == nil || len(s.Samples) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("### 11. Soak: steady creates and deletes under retention\n\n")
	w("`-only soak`, bench/bench/soak.go: one space-api with `SPACE_RETENTION_SANDBOXES` and `SPACE_RETENTION_OPERATIONS` at %s and `SPACE_RECONCILE_INTERVAL` %s (retention deletes in the reconciler's round), one client whose rate and caps the load never reaches. ", s.Retention, s.Reconcile)
	w("An open loop sends %d creates/s, each deleted %s after its 201, and %d queued creates/s (`Prefer: respond-async`), each followed until its operation succeeds and then deleted, for **%s** (a longer soak: `space-bench -only soak -soak 30m`). ", s.Rate, s.Hold, s.AsyncRate, s.Duration)
	w("Every %s the tables' rows and total relation sizes (indexes and TOAST included) are read, with the creates' latency over the window before, from when each create was due. ", s.Every)
	w("A steady state keeps about (creates/s + queued/s) × (hold + retention + half a round) = %.0f rows of sandboxes and queued/s × retention of operations; River keeps its completed jobs a day (its own cleaner), so `river_job` grows through any soak shorter than that.\n\n", s.Expected())
	w("The services' Postgres is shared by every test database of the machine, and its autovacuum launcher leaves a database made minutes ago waiting for its second visit while the tests' new ones take their turns; so the sampler vacuums a table when autovacuum at its defaults would have (dead rows over 50 + 20%% of the live ones, no vacuum for a minute), and says so.\n\n")
	w("| at | sandboxes rows (MB) | operations rows (MB) | dead rows before the sample's vacuum | river_job rows (MB) | database MB | creates in the window | create p50 / p99 ms | queued p99 ms | load average |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	row := func(x SoakSample) {
		vac := ""
		if len(x.Vacuumed) > 0 {
			vac = " (vacuumed " + strings.Join(x.Vacuumed, ", ") + ")"
		}
		w("| %.0f s | %d (%.2f) | %d (%.2f) | %d / %d%s | %d (%.2f) | %.1f | %d | %.1f / %.1f | %.1f | %.1f |\n", x.AtSec, x.Sandboxes, x.SandboxesMB, x.Operations, x.OperationsMB,
			x.DeadSandboxes, x.DeadOperations, vac, x.RiverJobs, x.RiverJobsMB, x.DatabaseMB, x.Creates, x.P50, x.P99, x.QueuedP99, x.Load)
	}
	// Every sample of a short soak; the first three and the last three of a long one.
	for i, x := range s.Samples {
		if len(s.Samples) > 8 && i == 3 {
			w("| … | | | | | | | | | |\n")
		}
		if len(s.Samples) <= 8 || i < 3 || i >= len(s.Samples)-3 {
			row(x)
		}
	}
	sf, sl, sg, _ := s.Growth(func(x SoakSample) float64 { return float64(x.Sandboxes) })
	of, ol, og, _ := s.Growth(func(x SoakSample) float64 { return float64(x.Operations) })
	// The sizes grow until the dead rows between two vacuums have pages to go to, then
	// stay: the first steady sample, the middle one and the last show both.
	var sizes []string
	if st := s.steady(); len(st) > 0 {
		for _, x := range []SoakSample{st[0], st[len(st)/2], st[len(st)-1]} {
			sizes = append(sizes, fmt.Sprintf("%.2f MB at %.0f s", x.SandboxesMB+x.OperationsMB, x.AtSec))
		}
	}
	state := "stopped growing"
	if !s.Flat() {
		state = "**did not stop growing**"
	}
	w("\nFrom %s on (twice a row's hold and retention), the rows %s: sandboxes %.0f → %.0f (%+.0f%%), operations %.0f → %.0f (%+.0f%%); the two tables' size %s. ",
		time.Duration(2*(s.Retention+s.Hold)), state, sf, sl, 100*sg, of, ol, 100*og, strings.Join(sizes, ", "))
	early, late := s.halves()
	vacuums := 0
	for _, x := range s.Samples {
		vacuums += len(x.Vacuumed)
	}
	w("The median of those windows' create p99s: %.1f ms over their first half, %.1f ms over their second. Autovacuum vacuumed the two tables %d times, the sampler %d times. ",
		early, late, s.Samples[len(s.Samples)-1].AutoVacuums, vacuums)
	w("Over the run: %d sandboxes made, %d deleted, %d creates, queued creates or deletes without their answer (%s); retention deleted %.0f sandboxes and %.0f operations (`space_retention_deleted_total`); the server logged %d errors.\n\n",
		s.Created, s.Deleted, s.Failed, outcomes(s.Outcomes), s.Purged["sandboxes"], s.Purged["operations"], s.ServerErrors)
	if len(s.Errors) > 0 {
		w("Requests without an answer: %s.\n\n", strings.Join(s.Errors, "; "))
	}
}
