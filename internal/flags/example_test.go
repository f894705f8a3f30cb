package flags_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/open-feature/go-sdk/openfeature/isolated"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/flags"
)

func ExampleResolver() {
	dir, _ := os.MkdirTemp("", "flags")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "flags.json")
	_ = os.WriteFile(path, []byte(`{"flags": {"space-api-client-concurrency-quotas": {
		"state": "ENABLED", "defaultVariant": "on", "variants": {"on": {
			"clients": {"acme": {"concurrency": 20}},
			"rate": {"acme": {"refill_rps": 10, "burst": 40}, "unknown": null}}}}}}`), 0o644)

	log := slog.New(slog.DiscardHandler)
	provider, err := flags.NewFileProvider(flags.FileProviderOptions{Path: path, PollInterval: 2 * time.Second, Logger: log})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	api := isolated.NewAPI() // an OpenFeature API of its own, not the global one
	defer func() { _ = api.Shutdown(ctx) }()
	if err := api.SetProviderAndWait(ctx, provider); err != nil {
		fmt.Println(err)
		return
	}
	envRate := space.Rate{RefillRPS: 1, Burst: 5}
	resolver := flags.NewResolver(flags.ResolverOptions{
		Client: api.NewClient(),
		Env:    flags.Env{AdmissionEnabled: true, Cluster: space.Rate{RefillRPS: 100, Burst: 200}, ClientRate: &envRate},
		Logger: log,
	})
	for _, id := range []space.ClientID{"acme", "mallory"} {
		l := resolver.Resolve(ctx, id)
		fmt.Printf("%s: key=%s concurrency=%d live=%d rate=%v exempt=%v source=%s\n",
			id, l.Key, l.Concurrency, l.LiveSandboxes, l.ClientRate, l.ClientExempt, l.RateSource)
	}
	// Output:
	// acme: key=acme concurrency=20 live=50 rate=&{10 40} exempt=false source=flag
	// mallory: key=unknown concurrency=10 live=50 rate=<nil> exempt=true source=flag
}
