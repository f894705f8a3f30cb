// Package pool is the warm pool: sandboxes started ahead of demand, one row per slot in
// Postgres keyed by the full shape. A create of exactly a slot's shape claims it and
// costs no activation budget; the Replenisher keeps each shape at a target that
// follows the shape's demand between the flag's bounds (demand.go), charging the
// cluster bucket for every warm-up so that refilling the pool never bypasses the
// cluster budget, and only from what the users leave (a refill reserve).
package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/metric"
	"github.com/space-sandbox/space/internal/substrate"
)

// Slot is a warm pool member.
type Slot struct {
	ID    string
	Shape space.Shape
	// Version is the template version the slot was warmed from.
	Version string
	// Ref is the slot's reference on the substrate.
	Ref string
}

// Options configure a Pool.
type Options struct {
	DB        *pgxpool.Pool
	Substrate substrate.Substrate
	// Targets, when set, are the flag's bounds, reported beside the ready counts with
	// the target the replenisher computed within them (space_pool_target_slots,
	// space_pool_target_min_slots, space_pool_target_max_slots), and every target shape
	// gets a ready count, 0 when it has no slot, so a pool below its target is a
	// comparison of two series that always exist.
	Targets func(ctx context.Context) ([]Target, error)
	// Registerer receives the claim counters and the scrape-time gauges; nil registers
	// nothing.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Now is the clock the demand is recorded by (default time.Now): the replenisher's.
	Now func() time.Time
}

// Pool claims and retires slots, and counts the claims as the demand the pool follows.
type Pool struct {
	db       *pgxpool.Pool
	sub      substrate.Substrate
	logger   *slog.Logger
	now      func() time.Time
	claims   *prometheus.CounterVec
	byTmpl   *prometheus.CounterVec
	demandMu sync.Mutex
	demand   map[space.Shape]int64 // claims not yet added to pool_demand
}

// New returns a Pool.
func New(opts Options) *Pool {
	p := &Pool{db: opts.DB, sub: opts.Substrate, logger: opts.Logger, now: opts.Now, demand: map[space.Shape]int64{}}
	if p.logger == nil {
		p.logger = slog.New(slog.DiscardHandler)
	}
	if p.now == nil {
		p.now = time.Now
	}
	p.claims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_pool_claims_total",
		Help: "Warm pool claims by result: hit (a ready slot of the exact shape was claimed) or miss.",
	}, []string{"result"})
	p.claims = metric.Register(opts.Registerer, p.claims)
	for _, r := range []string{"hit", "miss"} {
		p.claims.WithLabelValues(r)
	}
	p.byTmpl = metric.Register(opts.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_pool_claims_by_template_total",
		Help: "Warm pool claims by template and result (hit or miss): the warm-hit ratio of a template is hit / (hit + miss).",
	}, []string{"template", "result"}))
	metric.Register(opts.Registerer, prometheus.Collector(&readyCollector{db: opts.DB, targets: opts.Targets}))
	return p
}

// claimSQL marks the oldest ready slot of exactly a shape, warmed from a template
// version, as claimed by sandbox $6, provided that sandbox's row exists: a claim sent
// in one round trip behind the insert of its row claims nothing when the insert made
// no row (a live cap refused it). A slot of another version (the template changed
// since it was warmed) is never claimed: the replenisher retires it. SKIP LOCKED lets
// concurrent claims pass each other instead of queueing on one row, and never hands
// one slot to two claims.
const claimSQL = `UPDATE pool_slots SET state = 'claimed', sandbox_id = $6, updated_at = now()
	WHERE id = (
		SELECT id FROM pool_slots
		WHERE state = 'ready' AND template = $1 AND cpu_millis = $2 AND memory_mib = $3 AND disk_gib = $4
			AND template_version = $5
		ORDER BY created_at
		LIMIT 1
		FOR UPDATE SKIP LOCKED
	) AND EXISTS (SELECT 1 FROM sandboxes WHERE id = $6)
	RETURNING id::text, coalesce(substrate_ref, '')`

// A Claim is a warm slot's claim queued on a batch (QueueClaim): its result is read,
// and counted, once the batch has run.
type Claim struct {
	p    *Pool
	slot *Slot
	hit  bool
}

// QueueClaim queues on b the claim of the oldest ready slot of exactly shape, warmed
// from template version, for sandboxID (see claimSQL), so that a booking can send
// its row and its claim in one round trip, one transaction.
func (p *Pool) QueueClaim(b *pgx.Batch, shape space.Shape, version, sandboxID string) *Claim {
	c := &Claim{p: p, slot: &Slot{Shape: shape, Version: version}}
	b.Queue(claimSQL, shape.Template, shape.CPUMillis, shape.MemoryMiB, shape.DiskGiB, version, sandboxID).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&c.slot.ID, &c.slot.Ref)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return fmt.Errorf("claim slot: %w", err)
		}
		c.hit = true
		return nil
	})
	return c
}

// Slot returns the claimed slot, nil for a miss, once the batch that carried the claim
// has run without error (its transaction committed), and counts the claim: a miss is
// demand as much as a hit, since it is what a pool too small for its shape turns away.
// Call it once.
func (c *Claim) Slot() *Slot {
	p, shape := c.p, c.slot.Shape
	p.countDemand(shape)
	// Both of a template's series exist from its first claim, so that its warm-hit
	// ratio reads 0, not nothing, until its first hit.
	hit, miss := p.byTmpl.WithLabelValues(shape.Template, "hit"), p.byTmpl.WithLabelValues(shape.Template, "miss")
	if !c.hit {
		p.claims.WithLabelValues("miss").Inc()
		miss.Inc()
		return nil
	}
	p.claims.WithLabelValues("hit").Inc()
	hit.Inc()
	return c.slot
}

// Claim claims, inside tx, the oldest ready slot of exactly shape, warmed from template
// version, for sandboxID, whose row tx has made (see claimSQL); nil when there is none.
// The claim is counted when tx's statements ran, whether or not it commits.
func (p *Pool) Claim(ctx context.Context, tx pgx.Tx, shape space.Shape, version, sandboxID string) (*Slot, error) {
	b := &pgx.Batch{}
	c := p.QueueClaim(b, shape, version, sandboxID)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return c.Slot(), nil
}

// Consume removes a claimed slot once its sandbox has adopted it: the slot is now the
// sandbox and no longer part of the pool.
func (p *Pool) Consume(ctx context.Context, slot *Slot) error {
	if _, err := p.db.Exec(ctx, "DELETE FROM pool_slots WHERE id = $1", slot.ID); err != nil {
		return fmt.Errorf("consume slot %s: %w", slot.ID, err)
	}
	return nil
}

// Discard removes a claimed slot whose adoption failed and stops it on the substrate,
// so that a broken slot is never offered again; the replenisher replaces it.
func (p *Pool) Discard(ctx context.Context, slot *Slot) {
	if _, err := p.db.Exec(ctx, "DELETE FROM pool_slots WHERE id = $1", slot.ID); err != nil {
		p.logger.WarnContext(ctx, "discard slot", "slot", slot.ID, "err", err)
	}
	if slot.Ref != "" {
		if err := p.sub.Stop(ctx, slot.Ref); err != nil {
			p.logger.WarnContext(ctx, "stop discarded slot", "slot", slot.ID, "ref", slot.Ref, "err", err)
		}
	}
}

// kind is a shape warmed from one template version: the unit the replenisher counts.
type kind struct {
	Shape   space.Shape
	Version string
}

// counts returns the ready and the warming slots by shape and template version.
func (p *Pool) counts(ctx context.Context) (ready, warming map[kind]int, err error) {
	rows, err := p.db.Query(ctx, `SELECT template, cpu_millis, memory_mib, disk_gib, template_version, state, count(*)
		FROM pool_slots WHERE state IN ('ready', 'warming')
		GROUP BY template, cpu_millis, memory_mib, disk_gib, template_version, state`)
	if err != nil {
		return nil, nil, fmt.Errorf("count slots: %w", err)
	}
	defer rows.Close()
	ready, warming = map[kind]int{}, map[kind]int{}
	for rows.Next() {
		var k kind
		var state string
		var n int
		if err := rows.Scan(&k.Shape.Template, &k.Shape.CPUMillis, &k.Shape.MemoryMiB, &k.Shape.DiskGiB, &k.Version, &state, &n); err != nil {
			return nil, nil, fmt.Errorf("count slots: %w", err)
		}
		if state == "ready" {
			ready[k] = n
		} else {
			warming[k] = n
		}
	}
	return ready, warming, rows.Err()
}

// insertWarming records a slot about to warm from template version, so that it counts
// toward the target before the (slow) warm-up starts.
func (p *Pool) insertWarming(ctx context.Context, k kind) (string, error) {
	id := uuid.NewString()
	_, err := p.db.Exec(ctx, `INSERT INTO pool_slots (id, template, cpu_millis, memory_mib, disk_gib, template_version, state)
		VALUES ($1, $2, $3, $4, $5, $6, 'warming')`, id, k.Shape.Template, k.Shape.CPUMillis, k.Shape.MemoryMiB, k.Shape.DiskGiB, k.Version)
	if err != nil {
		return "", fmt.Errorf("insert warming slot: %w", err)
	}
	return id, nil
}

func (p *Pool) markReady(ctx context.Context, id, ref string) error {
	tag, err := p.db.Exec(ctx, `UPDATE pool_slots SET state = 'ready', substrate_ref = $2, updated_at = now()
		WHERE id = $1 AND state = 'warming'`, id, ref)
	if err != nil {
		return fmt.Errorf("mark slot %s ready: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("mark slot %s ready: the slot is gone", id)
	}
	return nil
}

func (p *Pool) deleteSlot(ctx context.Context, id string) error {
	_, err := p.db.Exec(ctx, "DELETE FROM pool_slots WHERE id = $1", id)
	if err != nil {
		return fmt.Errorf("delete slot %s: %w", id, err)
	}
	return nil
}

// retire removes up to n ready slots of a kind, newest first, and stops them.
func (p *Pool) retire(ctx context.Context, k kind, n int) (int, error) {
	rows, err := p.db.Query(ctx, `DELETE FROM pool_slots WHERE id IN (
			SELECT id FROM pool_slots
			WHERE state = 'ready' AND template = $1 AND cpu_millis = $2 AND memory_mib = $3 AND disk_gib = $4
				AND template_version = $6
			ORDER BY created_at DESC
			LIMIT $5
			FOR UPDATE SKIP LOCKED
		) RETURNING coalesce(substrate_ref, '')`, k.Shape.Template, k.Shape.CPUMillis, k.Shape.MemoryMiB, k.Shape.DiskGiB, n, k.Version)
	if err != nil {
		return 0, fmt.Errorf("retire slots: %w", err)
	}
	refs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("retire slots: %w", err)
	}
	for _, ref := range refs {
		if ref == "" {
			continue
		}
		if err := p.sub.Stop(ctx, ref); err != nil {
			p.logger.WarnContext(ctx, "stop retired slot", "ref", ref, "err", err)
		}
	}
	return len(refs), nil
}

// ReapStale forgets slots stuck in warming or claimed for longer than age: the replica
// that was warming or adopting them died. It stops nothing itself: a warming slot's
// half-made resource, and a claimed slot's resource that no sandbox ended up running,
// are stopped by the reconciler's sweep as resources no row accounts for, while one
// its sandbox did adopt is that sandbox's (the reconciler settles the sandbox).
func (p *Pool) ReapStale(ctx context.Context, age time.Duration) (int64, error) {
	tag, err := p.db.Exec(ctx, `DELETE FROM pool_slots
		WHERE state IN ('warming', 'claimed') AND updated_at < now() - make_interval(secs => $1)`, age.Seconds())
	if err != nil {
		return 0, fmt.Errorf("reap stale slots: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Slots returns which of ids are slot rows, in any state: the reconciler's sweep
// stops a slot resource only when its row is gone.
func (p *Pool) Slots(ctx context.Context, ids []string) (map[string]bool, error) {
	rows, err := p.db.Query(ctx, "SELECT id::text FROM pool_slots WHERE id = ANY($1::uuid[])", ids)
	if err != nil {
		return nil, fmt.Errorf("look up slots: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("look up slots: %w", err)
	}
	out := make(map[string]bool, len(found))
	for _, id := range found {
		out[id] = true
	}
	return out, nil
}

var (
	readyDesc = prometheus.NewDesc("space_pool_ready_slots",
		"Ready warm pool slots by shape, read from Postgres at scrape time (the same on every replica: aggregate with max).",
		[]string{"shape"}, nil)
	warmingDesc = prometheus.NewDesc("space_pool_warming_slots",
		"Warm pool slots warming by shape, read from Postgres at scrape time (the same on every replica: aggregate with max): with the ready ones, what the target counts.",
		[]string{"shape"}, nil)
	targetDesc = prometheus.NewDesc("space_pool_target_slots",
		"Slots (ready + warming) the replenisher keeps for each shape: the target it computed from demand within the flag's min and max, read at scrape time (the same on every replica: aggregate with max).",
		[]string{"shape"}, nil)
	minDesc = prometheus.NewDesc("space_pool_target_min_slots",
		"The warm pool flag's min for each shape: the target never goes below it (the same on every replica: aggregate with max).",
		[]string{"shape"}, nil)
	maxDesc = prometheus.NewDesc("space_pool_target_max_slots",
		"The warm pool flag's max for each shape: the target never goes above it (the same on every replica: aggregate with max).",
		[]string{"shape"}, nil)
	demandDesc = prometheus.NewDesc("space_pool_demand_slots",
		"The slots each shape's demand keeps in flight: its recent claim rate times its warm-up time, what the target adds a spare to (the same on every replica: aggregate with max).",
		[]string{"shape"}, nil)
	warmupDesc = prometheus.NewDesc("space_pool_warmup_seconds",
		"The warm-up time the replenisher expects of each shape: a moving average of its successful warm-ups (the same on every replica: aggregate with max).",
		[]string{"shape"}, nil)
)

// readyCollector reads the ready counts and the computed targets at scrape time, so
// that every replica reports the pool as it is, not as the replica that last
// replenished saw it; and the flag's bounds beside them.
type readyCollector struct {
	db      *pgxpool.Pool
	targets func(ctx context.Context) ([]Target, error)
}

func (c *readyCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{readyDesc, warmingDesc, targetDesc, minDesc, maxDesc, demandDesc, warmupDesc} {
		ch <- d
	}
}

func (c *readyCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ready, warming := map[string]float64{}, map[string]float64{}
	if c.targets != nil {
		c.collectTargets(ctx, ch, ready, warming)
	}
	rows, err := c.db.Query(ctx, `SELECT template, cpu_millis, memory_mib, disk_gib, state, count(*)
		FROM pool_slots WHERE state IN ('ready', 'warming') GROUP BY 1, 2, 3, 4, 5`)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(readyDesc, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var s space.Shape
		var state string
		var n float64
		if err := rows.Scan(&s.Template, &s.CPUMillis, &s.MemoryMiB, &s.DiskGiB, &state, &n); err != nil {
			ch <- prometheus.NewInvalidMetric(readyDesc, err)
			return
		}
		if state == "ready" {
			ready[s.String()] = n
		} else {
			warming[s.String()] = n
		}
	}
	if err := rows.Err(); err != nil {
		ch <- prometheus.NewInvalidMetric(readyDesc, err)
		return
	}
	for shape, n := range ready {
		ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, n, shape)
	}
	for shape, n := range warming {
		ch <- prometheus.MustNewConstMetric(warmingDesc, prometheus.GaugeValue, n, shape)
	}
}

// collectTargets reports every flagged shape's bounds, and its computed target,
// demand and warm-up time as the replenisher last saved them; before it has (no
// replica has replenished yet), the target is the min and the rest 0. Each flagged
// shape gets counts of 0 in ready and warming, for Collect to fill.
func (c *readyCollector) collectTargets(ctx context.Context, ch chan<- prometheus.Metric, ready, warming map[string]float64) {
	ts, err := c.targets(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(targetDesc, err)
		return
	}
	saved, err := loadTargets(ctx, c.db)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(targetDesc, err)
		return
	}
	for _, t := range ts {
		shape := t.Shape.String()
		sv, ok := saved[t.Shape]
		target := t.Min
		if ok {
			target = min(max(sv.Target, t.Min), t.Max)
		}
		ch <- prometheus.MustNewConstMetric(targetDesc, prometheus.GaugeValue, float64(target), shape)
		ch <- prometheus.MustNewConstMetric(minDesc, prometheus.GaugeValue, float64(t.Min), shape)
		ch <- prometheus.MustNewConstMetric(maxDesc, prometheus.GaugeValue, float64(t.Max), shape)
		ch <- prometheus.MustNewConstMetric(demandDesc, prometheus.GaugeValue, sv.DemandSlots, shape)
		ch <- prometheus.MustNewConstMetric(warmupDesc, prometheus.GaugeValue, sv.Warmup.Seconds(), shape)
		ready[shape], warming[shape] = 0, 0
	}
}
