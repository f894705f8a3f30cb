package flags

import (
	"context"
	"testing"
	"time"

	"github.com/open-feature/go-sdk/openfeature"

	"github.com/space-sandbox/space"
)

// benchQuota is a quota flag of a realistic size: 200 allowlisted clients, half of them
// with a rate entry, one of which is malformed.
func benchQuota() string {
	clients, rates := "", ""
	for i := range 200 {
		if i > 0 {
			clients += ","
		}
		clients += `"client-` + itoa(i) + `": {"concurrency": 20, "live_sandboxes": 200}`
		if i%2 == 0 {
			if rates != "" {
				rates += ","
			}
			rates += `"client-` + itoa(i) + `": {"refill_rps": 10, "burst": 40}`
		}
	}
	rates += `, "client-1": {"refill_rps": -1, "burst": 1}, "unknown": {"refill_rps": 1, "burst": 5}`
	return `{"clients": {` + clients + `}, "default": {"concurrency": 10, "live_sandboxes": 50}, "rate": {` + rates + `}}`
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	s := ""
	for ; i > 0; i /= 10 {
		s = string(rune('0'+i%10)) + s
	}
	return s
}

// BenchmarkResolve measures the per-request cost: one OpenFeature evaluation of the
// quota flag through the file provider, the cached parse, the limits.
func BenchmarkResolve(b *testing.B) {
	ctx := context.Background()
	cases := []struct{ name, id string }{
		{"an allowlisted client with a rate entry", "client-0"},
		{"an allowlisted client on the env rate", "client-3"},
		{"a malformed rate entry (warning suppressed)", "client-1"},
		{"an unallowlisted id", "somebody-else"},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			f := setup(b, quotaFile(benchQuota()), withPoll(time.Hour))
			f.resolver.Resolve(ctx, space.ClientID(c.id)) // parse and warn once, outside the loop
			b.ReportAllocs()
			for b.Loop() {
				f.resolver.Resolve(ctx, space.ClientID(c.id))
			}
		})
	}
	b.Run("in parallel", func(b *testing.B) {
		f := setup(b, quotaFile(benchQuota()), withPoll(time.Hour))
		f.resolver.Resolve(ctx, "client-0")
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				f.resolver.Resolve(ctx, "client-0")
			}
		})
	})
	b.Run("without flags", func(b *testing.B) {
		r := NewResolver(ResolverOptions{Env: defaultEnv(), Logger: discardLogger()})
		b.ReportAllocs()
		for b.Loop() {
			r.Resolve(ctx, "client-0")
		}
	})
}

// BenchmarkEvaluateQuotaFlag is the OpenFeature SDK's share of Resolve: the evaluation
// alone.
func BenchmarkEvaluateQuotaFlag(b *testing.B) {
	ctx := context.Background()
	f := setup(b, quotaFile(benchQuota()), withPoll(time.Hour))
	b.ReportAllocs()
	for b.Loop() {
		_, _ = f.client.ObjectValueDetails(ctx, QuotaFlag, nil, openfeature.EvaluationContext{})
	}
}

// BenchmarkParseQuotas is what the Resolver's cache saves per request.
func BenchmarkParseQuotas(b *testing.B) {
	v := decode(b, benchQuota())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseQuotas(v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkResolveCachedParse and BenchmarkResolveParseEachTime are one Resolve of an
// allowlisted client with and without the Resolver's parse cache (keyed by the
// identity of the provider's value): what the cache saves on every request.
func BenchmarkResolveCachedParse(b *testing.B) {
	ctx := context.Background()
	f := setup(b, quotaFile(benchQuota()), withPoll(time.Hour))
	f.resolver.Resolve(ctx, "client-0")
	b.ReportAllocs()
	for b.Loop() {
		f.resolver.Resolve(ctx, "client-0")
	}
}

// BenchmarkResolveParseEachTime: see BenchmarkResolveCachedParse.
func BenchmarkResolveParseEachTime(b *testing.B) {
	ctx := context.Background()
	f := setup(b, quotaFile(benchQuota()), withPoll(time.Hour))
	f.resolver.Resolve(ctx, "client-0")
	b.ReportAllocs()
	for b.Loop() {
		f.resolver.seen.Store(nil) // forget the last parse, as a Resolver without the cache would
		f.resolver.Resolve(ctx, "client-0")
	}
}
