// Command space-api is the sandbox admission controller.
//
//	space-api [serve]   serve the public and internal listeners (default)
//	space-api migrate   apply database migrations (ours and River's)
//	space-api keys      create, list and revoke API keys
//	space-api config    print every configuration variable with its default
//	space-api version   print the version
//
// Configuration comes from environment variables, declared in internal/config; see
// docs/configuration.md. The service itself is internal/app; this is its entry point.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/space-sandbox/space/internal/app"
)

// version is set at build time with -ldflags "-X main.version=..."; otherwise the
// module build info says it.
var version = ""

func main() {
	app.SetVersion(version)
	app.TuneGC(os.Getenv, debug.SetGCPercent)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "space-api:", err)
		os.Exit(1)
	}
}
