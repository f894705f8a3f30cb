package bench

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestServerLatencies(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) (path string, mark logMark) {
		t.Helper()
		path = filepath.Join(t.TempDir(), "space-api.log")
		before := `{"time":"2026-12-03T15:00:00.010Z","level":"INFO","msg":"request","method":"POST","route":"/v1/sandboxes","status":201,"duration":2000000,"client":"bench-quiet"}` + "\n"
		if err := os.WriteFile(path, []byte(before), 0o600); err != nil {
			t.Fatal(err)
		}
		mark = markLog(path)
		after := `{"time":"2026-12-03T15:00:01.004Z","level":"INFO","msg":"request","method":"POST","route":"/v1/sandboxes","status":201,"duration":3000000,"client":"bench-quiet"}
{"time":"2026-12-03T15:00:01.009Z","level":"INFO","msg":"request","method":"POST","route":"/v1/sandboxes","status":201,"duration":4000000,"client":"bench-quiet"}
{"time":"2026-12-03T15:00:01.010Z","level":"INFO","msg":"request","method":"POST","route":"/v1/sandboxes","status":429,"duration":500000,"client":"bench-flood"}
{"time":"2026-12-03T15:00:01.011Z","level":"INFO","msg":"request","method":"GET","route":"/v1/sandboxes/{id}","status":200,"duration":100000,"client":"bench-quiet"}
{"time":"2026-12-03T15:00:01.012Z","level":"WARN","msg":"something else","client":"bench-quiet","duration":9000000}
not json, "client":"bench-quiet"
{"time":"2026-12-03T15:00:01.020Z","level":"INFO","msg":"request","method":"POST","route":"/v1/sandboxes","status":201,"duration":5000000,"client":"bench-quiet"}
`
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(after); err != nil {
			t.Fatal(err)
		}
		return path, mark
	}
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			panic(err)
		}
		return v
	}

	t.Run("only the client's creates logged after the mark and started after from are read", func(t *testing.T) {
		t.Parallel()
		_, mark := setup(t)
		// Started at 1.001, 1.005 and 1.015: the first began before from.
		got, err := mark.serverLatencies("bench-quiet", at("2026-12-03T15:00:01.003Z"))
		if err != nil {
			t.Fatal(err)
		}
		if want := []time.Duration{4 * time.Millisecond, 5 * time.Millisecond}; !slices.Equal(got, want) {
			t.Errorf("latencies %v, want %v", got, want)
		}
	})
	t.Run("a server that logs nothing, or no log at all, gives no latencies", func(t *testing.T) {
		t.Parallel()
		path, _ := setup(t)
		end := markLog(path)
		for _, m := range []logMark{end, markLog(filepath.Join(t.TempDir(), "missing.log"))} {
			got, err := m.serverLatencies("bench-quiet", time.Time{})
			if err != nil || len(got) != 0 {
				t.Errorf("%+v: %v, %v; want none", m, got, err)
			}
		}
	})
}
