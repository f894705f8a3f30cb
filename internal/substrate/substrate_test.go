package substrate_test

import (
	"testing"

	"github.com/space-sandbox/space/internal/substrate"
)

func TestFindingReady(t *testing.T) {
	t.Parallel()
	starting := substrate.Resource{Ref: "sim-a"}
	first := substrate.Resource{Ref: "slot-b", Ready: true}
	second := substrate.Resource{Ref: "sim-c", Ready: true}
	for _, c := range []struct {
		name  string
		found substrate.Finding
		want  substrate.Resource
		ok    bool
	}{
		{"nothing found has nothing ready", substrate.Finding{Snapshot: "snap-1"}, substrate.Resource{}, false},
		{"only half-made resources have nothing ready", substrate.Finding{Resources: []substrate.Resource{starting}}, substrate.Resource{}, false},
		{"the first ready resource is the one that serves", substrate.Finding{Resources: []substrate.Resource{starting, first, second}}, first, true},
	} {
		got, ok := c.found.Ready()
		if ok != c.ok || got != c.want {
			t.Errorf("%s: Ready = %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}
