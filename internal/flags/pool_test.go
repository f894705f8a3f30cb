package flags

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/space-sandbox/space"
)

const poolExample = `{"shapes": [
  {"template": "python-3.12", "cpu_millis": 1000, "memory_mib": 2048, "disk_gib": 10, "target": 5},
  {"template": "node-22", "cpu_millis": 500, "memory_mib": 1024, "disk_gib": 5, "target": 0}
]}`

func TestParsePoolTargets(t *testing.T) {
	t.Parallel()

	t.Run("the design example gives one target per shape", func(t *testing.T) {
		t.Parallel()
		got, err := ParsePoolTargets(decode(t, poolExample))
		if err != nil {
			t.Fatal(err)
		}
		want := []PoolTarget{
			{Shape: space.Shape{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10}, Target: 5},
			{Shape: space.Shape{Template: "node-22", CPUMillis: 500, MemoryMiB: 1024, DiskGiB: 5}, Target: 0},
		}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("got %+v, want %+v", got, want)
		}
	})

	t.Run("no shapes is no targets", func(t *testing.T) {
		t.Parallel()
		for _, raw := range []string{`{}`, `{"shapes": null}`, `{"shapes": []}`} {
			got, err := ParsePoolTargets(decode(t, raw))
			if err != nil || got == nil || len(got) != 0 {
				t.Errorf("ParsePoolTargets(%s) = %v, %v; want empty", raw, got, err)
			}
		}
	})

	t.Run("a malformed pool flag is an error", func(t *testing.T) {
		t.Parallel()
		cases := map[string]string{
			"not an object":          `[]`,
			"shapes not an array":    `{"shapes": {}}`,
			"an unknown field":       `{"shape": []}`,
			"a shape not an object":  `{"shapes": [5]}`,
			"a missing template":     `{"shapes": [{"cpu_millis": 1, "memory_mib": 1, "disk_gib": 1, "target": 1}]}`,
			"an empty template":      `{"shapes": [{"template": "", "cpu_millis": 1, "memory_mib": 1, "disk_gib": 1, "target": 1}]}`,
			"a missing target":       `{"shapes": [{"template": "t", "cpu_millis": 1, "memory_mib": 1, "disk_gib": 1}]}`,
			"a zero size":            `{"shapes": [{"template": "t", "cpu_millis": 0, "memory_mib": 1, "disk_gib": 1, "target": 1}]}`,
			"a negative target":      `{"shapes": [{"template": "t", "cpu_millis": 1, "memory_mib": 1, "disk_gib": 1, "target": -1}]}`,
			"a fractional size":      `{"shapes": [{"template": "t", "cpu_millis": 1.5, "memory_mib": 1, "disk_gib": 1, "target": 1}]}`,
			"a huge target":          `{"shapes": [{"template": "t", "cpu_millis": 1, "memory_mib": 1, "disk_gib": 1, "target": 1e9}]}`,
			"an unknown shape field": `{"shapes": [{"template": "t", "cpu_millis": 1, "memory_mib": 1, "disk_gib": 1, "target": 1, "gpu": 1}]}`,
			"a shape listed twice": `{"shapes": [{"template": "t", "cpu_millis": 1, "memory_mib": 1, "disk_gib": 1, "target": 1},
			                                       {"template": "t", "cpu_millis": 1, "memory_mib": 1, "disk_gib": 1, "target": 2}]}`,
		}
		for name, raw := range cases {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				if _, err := ParsePoolTargets(decode(t, raw)); !errors.Is(err, ErrMalformed) {
					t.Fatalf("ParsePoolTargets(%s) = %v, want ErrMalformed", raw, err)
				}
			})
		}
	})
}

// FuzzParsePoolTargets: no panic, and every target parsed is usable.
func FuzzParsePoolTargets(f *testing.F) {
	for _, seed := range []string{poolExample, `{}`, `{"shapes": [{}]}`, `{"shapes": [1, "x", null]}`, `null`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var v any
		if err := json.Unmarshal(data, &v); err != nil {
			return
		}
		targets, err := ParsePoolTargets(v)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		seen := map[space.Shape]bool{}
		for _, pt := range targets {
			s := pt.Shape
			if s.Template == "" || s.CPUMillis < 1 || s.MemoryMiB < 1 || s.DiskGiB < 1 || pt.Target < 0 || seen[s] {
				t.Fatalf("unusable target %+v", pt)
			}
			seen[s] = true
		}
	})
}
