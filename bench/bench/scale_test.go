package bench

import (
	"strings"
	"testing"
)

// checkScaleSmoke checks what must hold of the scale scenario's quick run whatever the
// machine's speed: every tenant a budget key of its own (each create refused by its
// own emptied bucket), a heap sample at every point, the flags file reloaded in the
// reloading segments and in no other, the idle keys gone.
func checkScaleSmoke(t *testing.T, s *ScaleResult) {
	t.Helper()
	if s == nil {
		t.Fatal("the scale scenario reported nothing")
	}
	if len(s.Points) != 1+len(scaleMarks) || s.Points[0].Tenants != 0 || s.Points[len(s.Points)-1].Tenants != s.Beyond || s.point(s.Steady) == nil || s.point(s.Tenants) == nil {
		t.Fatalf("memory points %+v, want the start and one at each of %v × %d, %d and %d among them", s.Points, scaleMarks, s.Tenants, s.Tenants, s.Steady)
	}
	for _, p := range s.Points {
		if !(p.HeapInuse > 0) || !(p.HeapAlloc > 0) || !(p.RSS > 0) || p.Series == 0 || len(p.Sites) == 0 {
			t.Errorf("point at %d tenants: %+v", p.Tenants, p)
		}
	}
	if s.Outcomes["429 client_activation"] != s.Beyond || len(s.Outcomes) != 1 {
		t.Errorf("the %d tenants' creates were answered %v, want each refused by its own bucket", s.Beyond, s.Outcomes)
	}
	for _, row := range s.Flat.rows() {
		if len(row.RPS) != 1 || !(row.RPS[0] > 0) || len(row.Unexpected) > 0 || len(s.Flat.Touches[row.Name]) != 1 {
			t.Errorf("flat arm %s: refused creates/s %v, unexpected %v, last-use writes %v", row.Name, row.RPS, row.Unexpected, s.Flat.Touches[row.Name])
		}
	}
	l := s.Reload
	if len(l.Reloads) != 1 || l.Reloads[0] < 1 || l.QuietReloads[0] != 0 {
		t.Errorf("reloads counted: %v in the reloading segments, %v in the quiet ones", l.Reloads, l.QuietReloads)
	}
	if l.Requests == 0 || l.Outcomes["429 client_activation"] != l.Requests || len(l.QuietP99) != 1 || len(l.ReloadP99) != 1 {
		t.Errorf("reload phase: %d creates answered %v; p99 %v quiet, %v reloading", l.Requests, l.Outcomes, l.QuietP99, l.ReloadP99)
	}
	if l.Observed == 0 || len(l.InService50) != 1 || !(l.InService50[0] > 0) {
		t.Errorf("reload phase: %d renames timed to in service, medians %v", l.Observed, l.InService50)
	}
	if dec := s.Decisions; len(dec.Spread) != 1 || len(dec.One) != 1 || !(dec.Spread[0] > 0) || !(dec.One[0] > 0) {
		t.Errorf("decisions/s: %v over %d keys, %v over one", dec.Spread, dec.Keys, dec.One)
	}
	if dec := s.Decisions; len(dec.PeerSpread) != 1 || len(dec.PeerOne) != 1 || !(dec.PeerSpread[0] > 0) || !(dec.PeerOne[0] > 0) {
		t.Errorf("redis_rate's decisions/s: %v over %d keys, %v over one", dec.PeerSpread, dec.Keys, dec.PeerOne)
	}
	for i, cpu := range s.Decisions.RedisCPU {
		if len(cpu) != 1 || !(cpu[0] > 0) {
			t.Errorf("arm %d: Redis CPU a decision %v µs, want one figure above 0", i, cpu)
		}
	}
	d := s.Redis
	if d.Sampled == 0 || !(d.MemoryUsage > 16) {
		t.Errorf("idle keys: MEMORY USAGE %.0f over %d keys", d.MemoryUsage, d.Sampled)
	}
	if d.Peak <= d.Baseline || d.GoneAfter <= 0 || !(d.BytesPerKey > 16) {
		t.Errorf("idle keys: DBSIZE %d over a baseline of %d, gone after %s, %.0f bytes a key", d.Peak, d.Baseline, d.GoneAfter, d.BytesPerKey)
	}
}

func TestHeapSites(t *testing.T) {
	t.Parallel()
	prof := `heap profile: 3: 3072 [9: 9216] @ heap/1048576
2: 2048 [4: 4096] @ 0x1 0x2 0x3
#	0x1	sync.(*Map).LoadOrStore+0x1	/x/sync/map.go:1
#	0x2	github.com/space-sandbox/space/internal/keyed.(*Map[go.shape.struct { v sync/atomic.Int64 }]).LoadOrNew+0x2	/x/keyed.go:2
#	0x3	github.com/space-sandbox/space/internal/api.(*refusalPace).begin+0x3	/x/pace.go:3

1: 1024 [5: 5120] @ 0x4 0x5
#	0x4	runtime.malg+0x4	/x/proc.go:4
#	0x5	net/http.(*conn).serve+0x5	/x/server.go:5


# runtime.MemStats
# Alloc = 3072
`
	sites := heapSites([]byte(prof), 0)
	if len(sites) != 2 || sites[0].Site != "keyed.(*Map[...]).LoadOrNew ← api.(*refusalPace).begin" || sites[1].Site != "net/http.(*conn).serve" {
		t.Fatalf("sites %+v", sites)
	}
	// Sampled at 512 KiB: a 1 KiB allocation is one of about 512.
	if b := sites[0].Bytes; b < 2048*500 || b > 2048*520 {
		t.Errorf("scaled bytes %.0f, want about 2048 × 512", b)
	}
	if !strings.Contains(siteOf(nil), "no stack") {
		t.Errorf("siteOf(nil) = %q", siteOf(nil))
	}
}
