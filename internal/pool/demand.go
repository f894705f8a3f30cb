package pool

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/space-sandbox/space"
)

// Demand is what a pool follows: the claims of its shape, hits and misses alike (a
// miss is demand the pool failed to meet, and the very thing a bigger pool is for).
// Every replica claims, but one replenishes, so the claims are counted where every
// replica can add to them and the replenisher can read them: Postgres, in
// pool_demand (migration 00012), one row per shape and second.
//
// A claim itself writes nothing there: it adds to a counter in memory, and each
// replica adds its counters to the table about once a second (Pool.RunDemand), one
// statement for all its shapes. Claims happen inside the create's transaction, where a
// counter row of their own would serialise every create of a shape on one row lock;
// a Redis counter would make a warm hit, which today needs no Redis at all, depend on
// it. What the table costs instead is a second of lag, small beside a warm-up's
// seconds, and the counts of the last second of a replica that dies.

// demandBucket is the width of one pool_demand row.
const demandBucket = time.Second

// The windows the claim rate is measured over: the long one smooths a steady rate,
// the short one sees a burst within seconds. The rate is the higher of the two, the
// short one counted one standard deviation low (claimRate), so that a pool grows as
// soon as a burst starts, not at every chance cluster of a quiet baseline, and the
// cooldown, not the long window, decides how long it stays grown.
const (
	longWindow  = time.Minute
	shortWindow = 15 * time.Second
)

// FlushDemand adds the claims this replica counted since its last flush to
// pool_demand, at the second of Options.Now. A failed write keeps them for the next
// flush.
func (p *Pool) FlushDemand(ctx context.Context) error {
	p.demandMu.Lock()
	counts := p.demand
	p.demand = map[space.Shape]int64{}
	p.demandMu.Unlock()
	if len(counts) == 0 {
		return nil
	}
	var templates []string
	var cpu, mem, disk []int32
	var claims []int64
	for s, n := range counts {
		templates = append(templates, s.Template)
		cpu, mem, disk = append(cpu, int32(s.CPUMillis)), append(mem, int32(s.MemoryMiB)), append(disk, int32(s.DiskGiB))
		claims = append(claims, n)
	}
	at := p.now().Truncate(demandBucket)
	_, err := p.db.Exec(ctx, `INSERT INTO pool_demand AS d (at, template, cpu_millis, memory_mib, disk_gib, claims)
		SELECT $1, * FROM unnest($2::text[], $3::int[], $4::int[], $5::int[], $6::bigint[])
		ON CONFLICT (at, template, cpu_millis, memory_mib, disk_gib) DO UPDATE SET claims = d.claims + excluded.claims`,
		at, templates, cpu, mem, disk, claims)
	if err != nil {
		p.demandMu.Lock()
		for s, n := range counts {
			p.demand[s] += n
		}
		p.demandMu.Unlock()
		return fmt.Errorf("record demand: %w", err)
	}
	return nil
}

// RunDemand flushes the demand every interval (default DefaultDemandFlush) until ctx
// ends, and once more then.
func (p *Pool) RunDemand(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultDemandFlush
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := p.FlushDemand(fctx); err != nil {
				p.logger.WarnContext(ctx, "record warm pool demand", "err", err)
			}
			return
		case <-t.C:
			if err := p.FlushDemand(ctx); err != nil && ctx.Err() == nil {
				p.logger.WarnContext(ctx, "record warm pool demand", "err", err)
			}
		}
	}
}

// DefaultDemandFlush is how often a replica adds its claims to pool_demand.
const DefaultDemandFlush = time.Second

// countDemand counts one claim of shape.
func (p *Pool) countDemand(shape space.Shape) {
	p.demandMu.Lock()
	p.demand[shape]++
	p.demandMu.Unlock()
}

// demandRates reads the claim rate of every shape with claims in the long window
// ending at now, and deletes what is older than it.
func (p *Pool) demandRates(ctx context.Context, now time.Time) (map[space.Shape]float64, error) {
	rows, err := p.db.Query(ctx, `SELECT template, cpu_millis, memory_mib, disk_gib,
			sum(claims), coalesce(sum(claims) FILTER (WHERE at > $2), 0)
		FROM pool_demand WHERE at > $1 AND at <= $3
		GROUP BY 1, 2, 3, 4`, now.Add(-longWindow), now.Add(-shortWindow), now)
	if err != nil {
		return nil, fmt.Errorf("read demand: %w", err)
	}
	out := map[space.Shape]float64{}
	var s space.Shape
	var long, short int64
	_, err = pgx.ForEachRow(rows, []any{&s.Template, &s.CPUMillis, &s.MemoryMiB, &s.DiskGiB, &long, &short}, func() error {
		out[s] = claimRate(long, short)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read demand: %w", err)
	}
	return out, nil
}

// purgeDemand deletes the demand no window reads any more.
func (p *Pool) purgeDemand(ctx context.Context, now time.Time) error {
	if _, err := p.db.Exec(ctx, "DELETE FROM pool_demand WHERE at <= $1", now.Add(-longWindow)); err != nil {
		return fmt.Errorf("purge demand: %w", err)
	}
	return nil
}

// claimRate is the rate the target follows, in claims per second, from the claims of
// the long and the short window. The short window's count n is taken as n - √n, one
// standard deviation below it: independent claims at a steady rate scatter that much
// around their mean, and a short window of a quiet baseline would otherwise read its
// luckiest 15 seconds as demand, which the cooldown then holds for minutes. A burst's
// count is far above that scatter.
func claimRate(long, short int64) float64 {
	n := float64(short)
	return math.Max(float64(long)/longWindow.Seconds(), (n-math.Sqrt(n))/shortWindow.Seconds())
}

// spare is the margin above the slots demand keeps in flight. A warm-up is refilled
// the moment its slot is claimed and is ready a warm-up time later, so a pool of n
// slots misses when more than n claims arrive within one warm-up time; claims that
// arrive independently number r×w ± √(r×w) in that time (r the rate, w the warm-up
// time), and a spare of two of those deviations keeps the pool ahead in about 97% of
// warm-up times. The cooldown, holding the highest target of the last minutes, covers
// most of the rest.
func spare(inFlight float64) float64 {
	if inFlight <= 0 {
		return 0
	}
	return 2 * math.Sqrt(inFlight)
}

// proposed is the target demand asks for: the slots it keeps in flight, rate × warm-up
// time, plus the spare, clamped to the flag's bounds.
func proposed(rate float64, warmup time.Duration, lo, hi int) int {
	inFlight := rate * warmup.Seconds()
	n := int(math.Ceil(inFlight + spare(inFlight) - 1e-9))
	return min(max(n, lo), hi)
}

// hold is the scale-down cooldown of one shape: the highest target proposed within the
// last cooldown. A proposal lower than the current target takes effect only once the
// target has not been asked for during a whole cooldown, so a burst that comes back
// within it finds its slots still there.
//
// It is the running maximum of the proposals over a sliding window: samples kept in
// time order with decreasing values, each dropped once a later one is at least as
// high (it can never be the maximum again) or once it is older than the window.
type hold struct {
	samples []holdSample
}

type holdSample struct {
	at time.Time
	n  int
}

// add records proposal n at now and returns the target: the highest proposal since
// now - cooldown.
func (h *hold) add(now time.Time, n int, cooldown time.Duration) int {
	for len(h.samples) > 0 && h.samples[len(h.samples)-1].n <= n {
		h.samples = h.samples[:len(h.samples)-1]
	}
	h.samples = append(h.samples, holdSample{at: now, n: n})
	for len(h.samples) > 1 && now.Sub(h.samples[0].at) > cooldown {
		h.samples = h.samples[1:]
	}
	return h.samples[0].n
}

// peak is when the target was last asked for in full.
func (h *hold) peak() time.Time { return h.samples[0].at }

// ewma is an exponentially weighted moving average of warm-up times; zero until its
// first sample.
type ewma struct {
	v time.Duration
}

// ewmaWeight is the weight of a new sample: the estimate follows a change of the
// warm-up time (a bigger image, a busier cluster) within a few warm-ups.
const ewmaWeight = 0.3

func (e *ewma) add(d time.Duration) {
	if e.v == 0 {
		e.v = d
		return
	}
	e.v = time.Duration(ewmaWeight*float64(d) + (1-ewmaWeight)*float64(e.v))
}

// computed is what the replenisher made of a shape's demand, as pool_targets keeps it.
type computed struct {
	Target int
	// DemandSlots is the slots the demand keeps in flight: claim rate × warm-up time.
	DemandSlots float64
	Warmup      time.Duration
	// PeakAt is when the demand last asked for the whole target: the cooldown runs
	// from it.
	PeakAt time.Time
}

// saveTargets replaces pool_targets with targets, at now.
func (p *Pool) saveTargets(ctx context.Context, now time.Time, targets map[space.Shape]computed) error {
	var templates []string
	var cpu, mem, disk, target []int32
	var demand, warmup []float64
	var peak []time.Time
	for s, c := range targets {
		templates = append(templates, s.Template)
		cpu, mem, disk = append(cpu, int32(s.CPUMillis)), append(mem, int32(s.MemoryMiB)), append(disk, int32(s.DiskGiB))
		target = append(target, int32(c.Target))
		demand, warmup, peak = append(demand, c.DemandSlots), append(warmup, c.Warmup.Seconds()), append(peak, c.PeakAt)
	}
	err := pgx.BeginFunc(ctx, p.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM pool_targets t WHERE NOT EXISTS (
				SELECT 1 FROM unnest($1::text[], $2::int[], $3::int[], $4::int[]) AS u(template, cpu_millis, memory_mib, disk_gib)
				WHERE (u.template, u.cpu_millis, u.memory_mib, u.disk_gib) = (t.template, t.cpu_millis, t.memory_mib, t.disk_gib))`,
			templates, cpu, mem, disk); err != nil {
			return err
		}
		if len(templates) == 0 {
			return nil
		}
		_, err := tx.Exec(ctx, `INSERT INTO pool_targets (template, cpu_millis, memory_mib, disk_gib, target, demand_slots, warmup_seconds, peak_at, updated_at)
			SELECT *, $9::timestamptz FROM unnest($1::text[], $2::int[], $3::int[], $4::int[], $5::int[], $6::float8[], $7::float8[], $8::timestamptz[])
			ON CONFLICT (template, cpu_millis, memory_mib, disk_gib) DO UPDATE SET target = excluded.target,
				demand_slots = excluded.demand_slots, warmup_seconds = excluded.warmup_seconds, peak_at = excluded.peak_at,
				updated_at = excluded.updated_at`,
			templates, cpu, mem, disk, target, demand, warmup, peak, now)
		return err
	})
	if err != nil {
		return fmt.Errorf("save pool targets: %w", err)
	}
	return nil
}

// loadTargets reads pool_targets.
func (p *Pool) loadTargets(ctx context.Context) (map[space.Shape]computed, error) {
	return loadTargets(ctx, p.db)
}

func loadTargets(ctx context.Context, db *pgxpool.Pool) (map[space.Shape]computed, error) {
	rows, err := db.Query(ctx, `SELECT template, cpu_millis, memory_mib, disk_gib, target, demand_slots, warmup_seconds, peak_at
		FROM pool_targets`)
	if err != nil {
		return nil, fmt.Errorf("read pool targets: %w", err)
	}
	out := map[space.Shape]computed{}
	var s space.Shape
	var c computed
	var warmup float64
	_, err = pgx.ForEachRow(rows, []any{&s.Template, &s.CPUMillis, &s.MemoryMiB, &s.DiskGiB, &c.Target, &c.DemandSlots, &warmup, &c.PeakAt}, func() error {
		c.Warmup = time.Duration(warmup * float64(time.Second))
		out[s] = c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read pool targets: %w", err)
	}
	return out, nil
}
