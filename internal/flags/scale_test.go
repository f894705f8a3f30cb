package flags

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space"
)

// largeQuota is a quota flag at a platform's size: clients allowlisted clients spread
// over tiers tiers (every tenth with a rate entry of its own), the first tier the
// floor. generation moves every tier's burst, so that two generations differ.
func largeQuota(clients, tiers int, generation int) string {
	return largeQuotaOf(clients, tiers, generation, false)
}

// largeQuotaOf is largeQuota; when distinct, each client's entry also sets a
// concurrency of its own, so that no two entries are the same text.
func largeQuotaOf(clients, tiers int, generation int, distinct bool) string {
	var b strings.Builder
	b.WriteString(`{"tiers": {`)
	for i := range tiers {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"tier-` + strconv.Itoa(i) + `": {"refill_rps": ` + strconv.Itoa(1+i) +
			`, "burst": ` + strconv.Itoa(5+i+generation) + `, "concurrency": 10, "live_sandboxes": 50}`)
	}
	b.WriteString(`}, "clients": {`)
	for i := range clients {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"tenant-` + strconv.Itoa(i) + `": {"tier": "tier-` + strconv.Itoa(i%tiers) + `"`)
		if distinct {
			b.WriteString(`, "concurrency": ` + strconv.Itoa(1+i))
		}
		b.WriteString(`}`)
	}
	b.WriteString(`}, "rate": {`)
	for i := 0; i < clients; i += 10 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"tenant-` + strconv.Itoa(i) + `": {"refill_rps": 3, "burst": 9}`)
	}
	b.WriteString(`}}`)
	return b.String()
}

// largeEnv is defaultEnv with largeQuota's first tier as the floor.
func largeEnv() Env {
	env := defaultEnv()
	env.FallbackTier = "tier-0"
	return env
}

// BenchmarkReloadAtSize is one reload of a quota flag with 10,000 clients and 20 tiers,
// from the file's bytes to the first request served under it: read, decode, validate,
// swap, and the Resolver's parse of the new value (on the reload's event, or by the
// request, whichever comes first). The target is 100 ms. Its entries are 20 texts, one
// a tier, as a table of clients that each name their tier is; every entry its own
// text is the most a table of that size costs (decodeObject and parseQuotas then
// share nothing).
func BenchmarkReloadAtSize(b *testing.B) {
	for _, c := range []struct {
		name     string
		distinct bool
	}{{"entries of 20 texts", false}, {"every entry its own text", true}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			f := setup(b, quotaFile(largeQuotaOf(10_000, 20, 0, c.distinct)), withPoll(time.Hour), withEnv(largeEnv()))
			f.resolver.Resolve(ctx, "tenant-7")
			files := [2]string{quotaFile(largeQuotaOf(10_000, 20, 1, c.distinct)), quotaFile(largeQuotaOf(10_000, 20, 2, c.distinct))}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				b.StopTimer()
				f.writeAtomic(files[i%2])
				want := int64(5 + 7 + 1 + i%2) // tenant-7's burst, tier-7's, in that file
				i++
				b.StartTimer()
				if res := f.provider.Reload(); res.Err != nil || res.Unchanged {
					b.Fatalf("reload: %+v", res)
				}
				for deadline := time.Now().Add(waitTimeout); ; {
					if c := f.resolver.Resolve(ctx, "tenant-7"); c.ClientRate != nil && c.ClientRate.Burst == want {
						break
					}
					if time.Now().After(deadline) {
						b.Fatalf("tenant-7 not on the reloaded flag within %v", waitTimeout)
					}
					time.Sleep(50 * time.Microsecond)
				}
			}
		})
	}
}

// BenchmarkResolveAtSize is a request's Resolve under the 10,000-client flag: the
// per-request cost must not grow with the table.
func BenchmarkResolveAtSize(b *testing.B) {
	ctx := context.Background()
	f := setup(b, quotaFile(largeQuota(10_000, 20, 0)), withPoll(time.Hour), withEnv(largeEnv()))
	ids := make([]space.ClientID, 10_000)
	for i := range ids {
		ids[i] = space.ClientID("tenant-" + strconv.Itoa(i))
	}
	f.resolver.Resolve(ctx, ids[0])
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		f.resolver.Resolve(ctx, ids[i%len(ids)])
		i++
	}
}

func TestReloadAtSize(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	// burstOf is tenant-7's burst (tier-7's) under the largeQuota of generation g.
	burstOf := func(g int) int64 { return int64(5 + 7 + g) }

	t.Run("a reloaded flag is in service when its reload is signalled", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(largeQuota(10_000, 20, 0)), withEnv(largeEnv()))
		if c := f.resolver.Resolve(ctx, "tenant-7"); c.ClientRate == nil || c.ClientRate.Burst != burstOf(0) {
			t.Fatalf("tenant-7 resolved to %+v", c.ClientRate)
		}
		f.update(largeQuota(10_000, 20, 1))
		// No request parses from here: one that had to would be served the value
		// parsed last (the next test's case).
		f.resolver.parsing.Lock()
		defer f.resolver.parsing.Unlock()
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				if c := f.resolver.Resolve(ctx, "tenant-7"); c.ClientRate == nil || c.ClientRate.Burst != burstOf(1) {
					t.Errorf("after the reload's signal tenant-7 resolved to %+v, want the new burst %d", c.ClientRate, burstOf(1))
				}
			})
		}
		wg.Wait()
	})

	t.Run("a value nobody prepared is parsed on the event, before a request meets it", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(largeQuota(10_000, 20, 0)), withEnv(largeEnv()), unprepared())
		if c := f.resolver.Resolve(ctx, "tenant-7"); c.ClientRate == nil || c.ClientRate.Burst != burstOf(0) {
			t.Fatalf("tenant-7 resolved to %+v", c.ClientRate)
		}
		f.update(largeQuota(10_000, 20, 1))
		deadline := time.Now().Add(waitTimeout)
		for {
			s := f.resolver.seen.Load()
			if b := s.q.Tiers["tier-7"].Burst; s.err == nil && b != nil && *b == burstOf(1) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the new flag was not parsed within %v of its reload without a request", waitTimeout)
			}
			time.Sleep(time.Millisecond)
		}
		if c := f.resolver.Resolve(ctx, "tenant-7"); c.ClientRate == nil || c.ClientRate.Burst != burstOf(1) {
			t.Fatalf("after the reload tenant-7 resolved to %+v", c.ClientRate)
		}
	})

	t.Run("while a value nobody prepared is parsed, requests get the last one and nothing of it is kept", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(largeQuota(10_000, 20, 0)), withEnv(largeEnv()), withPoll(time.Hour), unprepared())
		f.resolver.Resolve(ctx, "tenant-7")
		f.resolver.parsing.Lock() // a parse of the new value under way, as far as requests can tell
		f.writeAtomic(quotaFile(largeQuota(10_000, 20, 1)))
		if res := f.provider.Reload(); res.Err != nil || res.Unchanged {
			t.Fatalf("reload: %+v", res)
		}
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				if c := f.resolver.Resolve(ctx, "tenant-7"); c.ClientRate == nil || c.ClientRate.Burst != burstOf(0) {
					t.Errorf("during the parse tenant-7 resolved to %+v, want the last parsed value's burst %d", c.ClientRate, burstOf(0))
				}
			})
		}
		wg.Wait() // none of them waited for the parse
		f.resolver.parsing.Unlock()
		if c := f.resolver.Resolve(ctx, "tenant-7"); c.ClientRate == nil || c.ClientRate.Burst != burstOf(1) {
			t.Fatalf("after the parse tenant-7 resolved to %+v, want burst %d: a caller of the old value was kept", c.ClientRate, burstOf(1))
		}
	})

	t.Run("the first failing client of a large table is the one reported, whatever the map order", func(t *testing.T) {
		t.Parallel()
		raw := strings.Replace(largeQuota(2_000, 2, 0), `"tenant-1500": {"tier": "tier-0"}`, `"tenant-1500": {"concurrency": -1}`, 1)
		raw = strings.Replace(raw, `"tenant-42": {"tier": "tier-0"}`, `"tenant-42": {"concurrency": "x"}`, 1)
		for range 20 {
			_, err := ParseQuotas(decode(t, raw)) // a new map each time, iterated in a new order
			if err == nil || !strings.Contains(err.Error(), "clients.tenant-1500:") {
				t.Fatalf("err = %v, want the first failing id in order, tenant-1500", err)
			}
		}
	})
}
