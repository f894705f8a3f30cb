package bench

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestGeneratorCommand(t *testing.T) {
	t.Parallel()

	// niceness runs nice(1) with no argument under generatorCommand: it prints the
	// niceness it runs at.
	niceness := func(t *testing.T, yield bool) int {
		t.Helper()
		out, err := generatorCommand(context.Background(), yield, "nice").Output()
		if err != nil {
			t.Fatalf("nice: %v", err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatalf("nice printed %q: %v", out, err)
		}
		return n
	}

	t.Run("a flood's generator runs at the lowest CPU priority", func(t *testing.T) {
		t.Parallel()
		if got := niceness(t, true); got != yieldNice {
			t.Errorf("a yielding generator runs at niceness %d, want %d", got, yieldNice)
		}
	})
	t.Run("any other stream keeps the driver's own priority", func(t *testing.T) {
		t.Parallel()
		// /proc/self/stat's 19th field is the niceness; the command's name (field 2)
		// is in parentheses and may hold spaces, so count from its closing one.
		stat, err := os.ReadFile("/proc/self/stat")
		if err != nil {
			t.Fatal(err)
		}
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		own, err := strconv.Atoi(fields[16])
		if err != nil {
			t.Fatalf("/proc/self/stat niceness %q: %v", fields[16], err)
		}
		if got := niceness(t, false); got != own {
			t.Errorf("a stream that does not yield runs at niceness %d, want the driver's %d", got, own)
		}
	})
}
