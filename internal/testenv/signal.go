package testenv

import (
	"testing"
	"time"
)

// Await waits for n values on c, failing the test once timeout has passed: a test's
// wait for the signals of goroutines it started, bounded, never a sleep.
func Await[T any](t testing.TB, c <-chan T, n int, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.After(timeout)
	for i := range n {
		select {
		case <-c:
		case <-deadline:
			t.Fatalf("%d of %d %s after %v", i, n, what, timeout)
		}
	}
}
