package bench

import (
	"fmt"
	"strings"
	"time"
)

// mib renders bytes in MiB.
func mib(b float64) float64 { return b / (1 << 20) }

// point is the memory phase's point at n tenants, nil when there is none.
func (r *ScaleResult) point(n int) *HeapPoint {
	for i := range r.Points {
		if r.Points[i].Tenants == n {
			return &r.Points[i]
		}
	}
	return nil
}

// heapBound is the memory target: the live heap (allocated bytes after a forced
// collection) at Tenants at most this much above the start, about 670 bytes a tenant
// over all the replica's per-key state (each per-key map bounded at keyed.DefaultMax
// keys). The heap in use is shown beside it: it also counts the free slots of spans
// that hold a live entry, which the allocator fills again before it takes new spans,
// so it follows what was allocated between two collections (GOGC, config.GCPercent,
// 400) as much as what is kept.
const heapBound = 64 << 20

// scaleExpirySlack is how long past their refill time idle keys may stay: Redis
// deletes an expired key when a read meets it or its expiry cycle samples it.
const scaleExpirySlack = 10 * time.Second

// scaleGrowth is the live heap in bytes from the start to Tenants, from Tenants to
// Steady, and from Steady to Beyond, and whether the four points exist.
func (r *ScaleResult) scaleGrowth() (toSize, settling, steady float64, ok bool) {
	start, at, settled, last := r.point(0), r.point(r.Tenants), r.point(r.Steady), r.point(r.Beyond)
	if start == nil || at == nil || settled == nil || last == nil {
		return 0, 0, 0, false
	}
	return at.HeapAlloc - start.HeapAlloc, settled.HeapAlloc - at.HeapAlloc, last.HeapAlloc - settled.HeapAlloc, true
}

// stopped reports whether the heap stopped growing with tenants past the maps' bound:
// its growth per tenant from Steady to Beyond at most a tenth of that from the start
// to Tenants.
func (r *ScaleResult) stopped() bool {
	toSize, _, steady, ok := r.scaleGrowth()
	if !ok {
		return false
	}
	perBefore := toSize / float64(r.Tenants)
	perAfter := steady / float64(r.Beyond-r.Steady)
	return perAfter <= max(perBefore, 0)/10
}

// scaleTargets are the scenario's targets.
func (r *Report) scaleTargets() []Target {
	s := r.Scale
	if s == nil {
		return nil
	}
	var ts []Target
	if toSize, settling, steady, ok := s.scaleGrowth(); ok {
		start, at, settled, last := s.point(0), s.point(s.Tenants), s.point(s.Steady), s.point(s.Beyond)
		ts = append(ts, Target{fmt.Sprintf("a replica's live heap after %s tenants ≤ %d MiB above its start", count(s.Tenants), heapBound>>20),
			fmt.Sprintf("%.1f → %.1f MiB (%+.1f MiB, %.0f bytes a tenant; heap in use %+.1f MiB, RSS %.0f MiB)", mib(start.HeapAlloc), mib(at.HeapAlloc), mib(toSize), toSize/float64(s.Tenants), mib(at.HeapInuse-start.HeapInuse), mib(at.RSS)),
			toSize <= heapBound})
		ts = append(ts, Target{fmt.Sprintf("the live heap stops growing from %s to %s tenants (per tenant ≤ a tenth of the first %s's)", count(s.Steady), count(s.Beyond), count(s.Tenants)),
			fmt.Sprintf("%.1f → %.1f MiB (%+.1f MiB, %.0f bytes a tenant; heap in use %+.1f MiB); from %s to %s, as the maps' evictions and sweeps start, %+.1f MiB (%.0f bytes a tenant)",
				mib(settled.HeapAlloc), mib(last.HeapAlloc), mib(steady), steady/float64(s.Beyond-s.Steady), mib(last.HeapInuse-settled.HeapInuse),
				count(s.Tenants), count(s.Steady), mib(settling), settling/float64(s.Steady-s.Tenants)),
			s.stopped()})
		ts = append(ts, Target{fmt.Sprintf("/metrics samples do not grow from %s to %s tenants", count(s.Tenants), count(s.Beyond)),
			fmt.Sprintf("%d at the start, %d at %s, %d at %s", start.Series, at.Series, count(s.Tenants), last.Series, count(s.Beyond)),
			last.Series <= at.Series})
	}
	if d := s.Decisions; len(d.Spread) > 0 {
		st := ratioStats(d.Spread, d.One)
		got := st.format("%.2f×")
		if len(d.PeerSpread) > 0 {
			got += " (redis_rate's own: " + ratioStats(d.PeerSpread, d.PeerOne).format("%.2f×") + ")"
		}
		if len(d.RedisCPU[0]) > 0 {
			got += fmt.Sprintf("; Redis CPU a decision %s µs over %s keys against %s over one (redis_rate %s against %s)", summarize(d.RedisCPU[0]).format("%.2f"), count(d.Keys),
				summarize(d.RedisCPU[1]).format("%.2f"), summarize(d.RedisCPU[2]).format("%.2f"), summarize(d.RedisCPU[3]).format("%.2f"))
		}
		ts = append(ts, Target{fmt.Sprintf("decisions/s over %s client keys ≥ 0.9× over one key (Admitter from Go, %d goroutines)", count(d.Keys), d.Goroutines),
			got, st.Median >= 0.9})
	}
	if f := s.Flat; f.Spread != nil {
		st := ratioStats(f.Spread.RPS, f.One.RPS)
		ts = append(ts, Target{fmt.Sprintf("refused creates/s spread over %s tenants ≥ 0.9× one tenant's (at size, the same path)", count(f.Keys)),
			st.format("%.2f×"), st.Median >= 0.9})
	}
	if l := s.Reload; len(l.QuietP99) > 0 {
		st := ratioStats(l.ReloadP99, l.QuietP99)
		ts = append(ts, Target{fmt.Sprintf("p99 of refused creates while a %s-client flag reloads every %s ≤ 1.25× without reloads", count(l.Clients), l.Every),
			st.format("%.2f×") + " (p50 " + ratioStats(l.ReloadP50, l.QuietP50).format("%.2f×") + ")", st.Median <= 1.25})
	}
	if d := s.Redis; d.Keys > 0 {
		ts = append(ts, Target{fmt.Sprintf("%s idle client keys gone within %s of their refill time (%s)", count(d.Keys), scaleExpirySlack, d.Refill),
			fmt.Sprintf("gone %s after the last write; %.0f bytes a key (MEMORY USAGE %.0f)", d.GoneAfter.Round(100*time.Millisecond), d.BytesPerKey, d.MemoryUsage),
			d.GoneAfter > 0 && d.GoneAfter <= d.Refill+scaleExpirySlack})
	}
	return ts
}

// scaleSummary writes the scenario's lines of the plain-text summary.
func (r *Report) scaleSummary(b *strings.Builder) {
	s := r.Scale
	if s == nil {
		return
	}
	for _, p := range s.Points {
		fmt.Fprintf(b, "  scale: %7d tenants: heap in use %.1f MiB, alloc %.1f MiB, RSS %.1f MiB, %d /metrics samples\n",
			p.Tenants, mib(p.HeapInuse), mib(p.HeapAlloc), mib(p.RSS), p.Series)
	}
	fmt.Fprintf(b, "  scale: the tenants' creates: %.0f/s; %s\n", s.PerSec, outcomes(s.Outcomes))
	if d := s.Decisions; len(d.Spread) > 0 {
		fmt.Fprintf(b, "  scale: decisions/s from Go (%d goroutines): %s keys %s, one key %s; redis_rate %s and %s\n", d.Goroutines, count(d.Keys),
			summarize(d.Spread).format("%.0f"), summarize(d.One).format("%.0f"), summarize(d.PeerSpread).format("%.0f"), summarize(d.PeerOne).format("%.0f"))
	}
	if f := s.Flat; f.Spread != nil {
		for _, row := range f.rows() {
			fmt.Fprintf(b, "  scale: refused creates/s, %-28s %s, p50 %s ms, p99 %s ms, %s last-use writes a create\n", row.Name+":",
				summarize(row.RPS).format("%.0f"), summarize(row.P50).format("%.2f"), summarize(row.P99).format("%.2f"), summarize(f.Touches[row.Name]).format("%.2f"))
		}
	}
	if l := s.Reload; len(l.QuietP99) > 0 {
		fmt.Fprintf(b, "  scale: reload of a %s-client flag every %s: p50 %s ms vs %s ms, p99 %s ms vs %s ms; %s reloads a run (%s in the quiet segments), %s ms of CPU each\n",
			count(l.Clients), l.Every, summarize(l.ReloadP50).format("%.2f"), summarize(l.QuietP50).format("%.2f"),
			summarize(l.ReloadP99).format("%.2f"), summarize(l.QuietP99).format("%.2f"),
			summarize(l.Reloads).format("%.0f"), summarize(l.QuietReloads).format("%.0f"), summarize(l.CPUPerReload).format("%.0f"))
		fmt.Fprintf(b, "  scale: rename of the flags file to the new flag in service (polled every %s): median %s ms, longest %s ms (%d renames timed)\n",
			l.Poll, summarize(l.InService50).format("%.0f"), summarize(l.InServiceMax).format("%.0f"), l.Observed)
	}
	d := s.Redis
	fmt.Fprintf(b, "  scale: %s idle client keys: %.0f bytes each (MEMORY USAGE %.0f); DBSIZE %d → %d, back %s after the last write (refill time %s)\n",
		count(d.Keys), d.BytesPerKey, d.MemoryUsage, d.Peak, d.Baseline, d.GoneAfter.Round(time.Millisecond), d.Refill)
}

// scaleMarkdown writes the scenario's section of docs/benchmarks.md.
func (r *Report) scaleMarkdown(b *strings.Builder) {
	s := r.Scale
	if s == nil || len(s.Points) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("### 12. A hundred thousand tenants\n\n")
	w("`BENCH_ARGS='-only scale' make bench`, bench/bench/scale.go: real `space-api` processes built from the tree, a private `redis-server`, a database of the bench's own. ")
	w("Every tenant is an API key of its own (`SPACE_AUTH_MODE=api_key`), issued straight into `api_keys` as `space-api keys create` issues them (only the SHA-256 stored), under a quota flag that holds a tier table and no client list: ")
	w("each key's client is then a budget key of its own, on the floor tier (`SPACE_FALLBACK_TIER`). That is how a platform of this size runs space-api: the key table bounds the ids, and the flag stays a few hundred bytes. ")
	w("A gateway's `X-Client-ID` with a quota flag listing every tenant would put a %s-entry flag in every replica, and skip the key lookup and the key's last-use record, one of the per-key maps measured here. ", count(s.Tenants))
	w("Every tenant's bucket is emptied first by one real decision of the product's `Admitter` (the tier's rate: refill %g, burst %d): every create below is **refused by the tenant's own bucket**, after the whole per-key path — the key's lookup, the tier, the concurrency lease, the reservation, the two-bucket decision in Redis, the undo. ",
		s.Rate.RefillRPS, s.Rate.Burst)
	w("An admitted create would add a sandbox that stays (its rows, the simulated substrate's state), which grows with sandboxes, not tenants; a create refused by an empty cluster bucket would be refused from memory, before any per-key state, once the replica knows that bucket empty.\n\n")

	start := s.Points[0]
	w("**Memory.** One replica (`SPACE_REFUSAL_CACHE_MAX_AGE=0`, which changes nothing for a tenant's first create), %d unmeasured warm-up tenants, then %s distinct tenants creating once each, closed loop over %d connections (%.0f creates/s). ",
		s.WarmUp, count(s.Beyond), s.Conns, s.PerSec)
	w("At each point the bench forces a collection in the replica (`GET /debug/pprof/heap?gc=1` on the internal listener runs `runtime.GC` before it writes the profile), then reads `go_memstats_heap_inuse_bytes` and `go_memstats_heap_alloc_bytes` from `/metrics`, its samples (lines not starting with `#`), and `VmRSS` from `/proc/<pid>/status`: the points count what is live, not garbage the collector had yet to reach. One run: the points come from one replica's life.\n\n")
	w("| tenants | heap in use MiB | vs start | heap alloc MiB | RSS MiB | /metrics samples |\n|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range s.Points {
		w("| %s | %.1f | %+.1f | %.1f | %.1f | %d |\n", countOrStart(p.Tenants), mib(p.HeapInuse), mib(p.HeapInuse-start.HeapInuse), mib(p.HeapAlloc), mib(p.RSS), p.Series)
	}
	w("\nAnswers: %s.\n\n", outcomes(s.Outcomes))
	if at, last := s.point(s.Tenants), s.point(s.Beyond); at != nil && last != nil {
		w("Where the live heap is, by allocation site (the innermost function of the product on the stack ← its caller in the product), from the heap profile of each point's collection, scaled by the sampling rate as `go tool pprof` scales it; the sites holding most at %s tenants:\n\n", count(s.Beyond))
		w("| site | start MiB | %s MiB | %s MiB |\n|---|---:|---:|---:|\n", count(s.Tenants), count(s.Beyond))
		for i, site := range last.Sites {
			if i == 10 {
				break
			}
			w("| `%s` | %.1f | %.1f | %.1f |\n", site.Site, mib(start.siteBytes(site.Site)), mib(at.siteBytes(site.Site)), mib(site.Bytes))
		}
		w("\nEach per-key map of a replica (`internal/keyed`: admission's remembered buckets, the concurrency places, API keys' last use) holds at most %s keys, and forgets the least recently used down to nine tenths past it; before that, a key idle for a while is forgotten once its entry knows nothing its next use would not learn (a bucket full again after 10 s, places after 10 s, a key's last use after a minute). Here every tenant's bucket is empty and never refills (the tier's refill is 0), so the remembered buckets stay, up to the bound: the worst case. The refusal pace keeps no per-key state (a fixed table of 4,096 counts). `/metrics` names at most `SPACE_METRICS_BUDGET_KEYS` (%d) budget keys.\n\n", count(s.Bound), s.BudgetKeys)
	}

	if d := s.Decisions; len(d.Spread) > 0 {
		w("**Decisions/s over %s keys.** The product's `Admitter` from Go, %d goroutines, %s a run, on a `redis-server` of its own holding %s full client buckets (written in the script's state format under the production key names, as in section 5): each decision for a random one of them, or all for one; the allow path, so every decision writes. Beside it, redis_rate's `Allow` over as many keys of its own on the same server: what a larger keyspace costs Redis itself (its hash table, the CPU's caches) shows in both ratios alike. The four arms in a rotating order each run.\n\n",
			count(d.Keys), d.Goroutines, d.Duration, count(d.Keys))
		w("| keys | space decisions/s | vs one key | Redis CPU µs a decision | redis_rate decisions/s | vs one key | Redis CPU µs a decision |\n|---|---:|---:|---:|---:|---:|---:|\n")
		w("| %s | %s | %s | %s | %s | %s | %s |\n", count(d.Keys), summarize(d.Spread).format("%.0f"), ratioStats(d.Spread, d.One).format("%.2f×"), summarize(d.RedisCPU[0]).format("%.2f"),
			summarize(d.PeerSpread).format("%.0f"), ratioStats(d.PeerSpread, d.PeerOne).format("%.2f×"), summarize(d.RedisCPU[2]).format("%.2f"))
		w("| one | %s | | %s | %s | | %s |\n\n", summarize(d.One).format("%.0f"), summarize(d.RedisCPU[1]).format("%.2f"), summarize(d.PeerOne).format("%.0f"), summarize(d.RedisCPU[3]).format("%.2f"))
		w("Redis CPU is the server's main thread's (`INFO cpu`, user and system, reading requests and writing replies included) over the arm's decisions. A decision over a key Redis has not touched lately costs it more than one over the key it just wrote (the key's entries in its two tables miss the processor's caches); where Redis is most of what a decision waits for, as at %d goroutines on this machine, that difference is what the spread arm loses.\n\n", d.Goroutines)
	}

	if f := s.Flat; f.Spread != nil {
		w("**Flat in tenants.** Refused creates/s under `wrk` (1 thread, %d connections, %s a run, closed loop, every arm %s unmeasured first), each request with the `Authorization` of the next tenant of a list, rendered once before the run so that one tenant or %s cost `wrk` alike. ",
			f.Connections, f.Duration, f.WarmUp, count(f.Keys))
		w("At size: the memory phase's replica, after its %s tenants, with `SPACE_REFUSAL_CACHE_MAX_AGE=0`, so that both arms' refusals are asked of Redis (the same path); the spread arm goes through the %s tenants in order, one create each (a run sends fewer creates than there are tenants, and the next run goes on where it stopped). ",
			count(s.Beyond), count(f.Keys))
		w("Fresh: a replica started beside it with the default configuration, where one tenant's flood is refused from memory (no Redis, no Postgres but the key's lookup) and %s tenants' creates cannot be. The four arms in a rotating order each run.\n\n", count(f.Keys))
		w("| arm | refused creates/s | vs one tenant, same replica | p50 ms | p99 ms | API key last-use writes a create |\n|---|---:|---:|---:|---:|---:|\n")
		for _, pair := range [][2]*HTTPRow{{f.Spread, f.One}, {f.One, f.One}, {f.FreshSpread, f.FreshOne}, {f.FreshOne, f.FreshOne}} {
			row := pair[0]
			w("| %s | %s | %s | %s | %s | %s |\n", row.Name, summarize(row.RPS).format("%.0f"), ratioStats(row.RPS, pair[1].RPS).format("%.2f×"),
				summarize(row.P50).format("%.2f"), summarize(row.P99).format("%.2f"), summarize(f.Touches[row.Name]).format("%.2f"))
		}
		w("\n%s tenants at size against a fresh replica's, the same refusals: %s. Answers other than 429: %s.\n\n", count(f.Keys),
			ratioStats(f.Spread.RPS, f.FreshSpread.RPS).format("%.2f×"), orNone(unexpectedRows(f.rows())))
	}

	if l := s.Reload; len(l.QuietP99) > 0 {
		w("**Reload at size.** A `trusted_header` replica whose quota flag lists %s clients on %d tiers (%d KiB); creates refused by each client's own bucket (emptied first, as above), open loop at %d/s, each the next client of the list (each client every %.0f s: never refused from memory), in %s segments, %d of each side a run, alternating: ",
			count(l.Clients), l.Tiers, l.FlagBytes>>10, l.Rate, float64(l.Clients)/float64(l.Rate), l.Segment, l.Rounds)
		w("in one the flags file is rewritten every %s (write, then rename over it; two generations in turn, which differ in the `default` entry's concurrency, under no listed client: every reload is a whole flag read, parsed and swapped, and decides no request differently), in the other not; `SPACE_FLAGS_POLL_INTERVAL=%s`, so that every rewrite is a reload. ", l.Every, l.Poll)
		w("Refused creates, not admitted ones: an admitted create adds a sandbox start and a sandbox that stays; the refused one runs everything a reload touches (the identity, the flag's evaluation, the tier's limits, the charge). p50 and p99 over every segment of a side in a run.\n\n")
		w("| | without reloads | reloading | ratio |\n|---|---:|---:|---:|\n")
		w("| p50 ms | %s | %s | %s |\n", summarize(l.QuietP50).format("%.2f"), summarize(l.ReloadP50).format("%.2f"), ratioStats(l.ReloadP50, l.QuietP50).format("%.2f×"))
		w("| p99 ms | %s | %s | %s |\n", summarize(l.QuietP99).format("%.2f"), summarize(l.ReloadP99).format("%.2f"), ratioStats(l.ReloadP99, l.QuietP99).format("%.2f×"))
		w("| reloads the replica counted (`space_flags_reloads_total{result=\"success\"}`) | %s | %s | |\n\n", summarize(l.QuietReloads).format("%.0f"), summarize(l.Reloads).format("%.0f"))
		w("The reload's own time: space-api counts each reload and sets `space_flags_last_reload_success_timestamp_seconds` when the new flag is in service. Read just before each next rename (the quiet segments read it as often), it puts the new flag in service **%s ms after the rename at the median, %s ms at the longest** (%d renames timed), which is the reload (read, hash, decode, validate, swap) plus the wait for the next poll, up to %s. ",
			summarize(l.InService50).format("%.0f"), summarize(l.InServiceMax).format("%.0f"), l.Observed, l.Poll)
		w("The replica's CPU time (`/proc/<pid>/stat`) in the reloading segments less that in the quiet ones, under the same load, is **%s ms per reload** (the reload, the resolver's parse of the new value, collecting the old one), on cores shared with everything else; `go test ./internal/flags -bench ReloadAtSize` measures the reload in process. Answers: %s.\n\n",
			summarize(l.CPUPerReload).format("%.0f"), outcomes(l.Outcomes))
	}

	d := s.Redis
	w("**Redis.** %s idle client keys made by real decisions (the product's `Admitter`, 8 goroutines, %s) on a `redis-server` of their own: **%.0f bytes per key** (`used_memory` growth over the keys there; `MEMORY USAGE` of the last %d made, the key's own allocation without its share of the keyspace's tables, %.0f bytes). Their bucket (burst 1, refilled in %s) is full again %s after its decision, and Redis forgets it: `DBSIZE` %d right after the last write, back to %d (the cluster key) **%s** after it, polled while the scenario's other phases ran.\n\n",
		count(d.Keys), d.MakeTime.Round(100*time.Millisecond), d.BytesPerKey, d.Sampled, d.MemoryUsage, d.Refill, d.Refill, d.Peak, d.Baseline, d.GoneAfter.Round(time.Millisecond))
}

func countOrStart(n int) string {
	if n == 0 {
		return "start"
	}
	return count(n)
}

// unexpectedRows renders the unexpected answers of rows, "" for none.
func unexpectedRows(rows []*HTTPRow) string {
	var parts []string
	for _, r := range rows {
		if u := r.unexpected(); u != "" {
			parts = append(parts, r.Name+": "+u)
		}
	}
	return strings.Join(parts, "; ")
}
