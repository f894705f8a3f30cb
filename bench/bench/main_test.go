package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
)

// TestMain lets the test binary stand in for space-bench as the process of a load
// stream (runApart starts the running binary again with loadEnv set).
func TestMain(m *testing.M) {
	if served, err := ServeLoad(context.Background(), os.Stdout); served {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
