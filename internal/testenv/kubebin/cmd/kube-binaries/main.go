// Command kube-binaries builds the etcd and kube-apiserver the tests run, then the
// kube-scheduler and kwok of the fleet tests, from their modules under tools/, into the
// machine's cache (or finds them there), and prints their paths. `make test` runs it
// first, in the background, so that the build overlaps the rest of the suite; a test
// that needs a binary waits for it.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/space-sandbox/space/internal/testenv/kubebin"
)

func main() {
	log := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
	bins, err := kubebin.FindOrBuild(context.Background(), log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("etcd %s\t%s\nkube-apiserver %s\t%s\n", bins.EtcdVersion, bins.Etcd, bins.APIServerVersion, bins.APIServer)
	fleet, err := kubebin.FindOrBuildFleet(context.Background(), log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("kube-scheduler %s\t%s\nkwok %s\t%s\n", fleet.SchedulerVersion, fleet.Scheduler, fleet.KwokVersion, fleet.Kwok)
}
