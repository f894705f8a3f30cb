package flags

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/space-sandbox/space"
)

const poolExample = `{"shapes": [
  {"template": "python-3.12", "cpu_millis": 1000, "memory_mib": 2048, "disk_gib": 10, "target": 5},
  {"template": "node-22", "cpu_millis": 500, "memory_mib": 1024, "disk_gib": 5, "target": 0},
  {"template": "go-1.24", "cpu_millis": 500, "memory_mib": 1024, "disk_gib": 5, "min": 2, "max": 40},
  {"template": "ruby-3", "cpu_millis": 500, "memory_mib": 1024, "disk_gib": 5, "max": 8}
]}`

func TestParsePoolTargets(t *testing.T) {
	t.Parallel()

	t.Run("a target is a fixed pool and min and max bound one that follows demand", func(t *testing.T) {
		t.Parallel()
		got, err := ParsePoolTargets(decode(t, poolExample))
		if err != nil {
			t.Fatal(err)
		}
		want := []PoolTarget{
			{Shape: space.Shape{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10}, Min: 5, Max: 5},
			{Shape: space.Shape{Template: "node-22", CPUMillis: 500, MemoryMiB: 1024, DiskGiB: 5}, Min: 0, Max: 0},
			{Shape: space.Shape{Template: "go-1.24", CPUMillis: 500, MemoryMiB: 1024, DiskGiB: 5}, Min: 2, Max: 40},
			{Shape: space.Shape{Template: "ruby-3", CPUMillis: 500, MemoryMiB: 1024, DiskGiB: 5}, Min: 0, Max: 8},
		}
		if !slices.Equal(got, want) {
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
			"a min without a max":    `{"shapes": [{"template": "t", "cpu_millis": 1, "memory_mib": 1, "disk_gib": 1, "min": 1}]}`,
			"a min above the max":    `{"shapes": [{"template": "t", "cpu_millis": 1, "memory_mib": 1, "disk_gib": 1, "min": 3, "max": 2}]}`,
			"a target and a max":     `{"shapes": [{"template": "t", "cpu_millis": 1, "memory_mib": 1, "disk_gib": 1, "target": 1, "max": 2}]}`,
			"a negative min":         `{"shapes": [{"template": "t", "cpu_millis": 1, "memory_mib": 1, "disk_gib": 1, "min": -1, "max": 2}]}`,
			"a huge max":             `{"shapes": [{"template": "t", "cpu_millis": 1, "memory_mib": 1, "disk_gib": 1, "max": 1e9}]}`,
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
			if s.Template == "" || s.CPUMillis < 1 || s.MemoryMiB < 1 || s.DiskGiB < 1 || pt.Min < 0 || pt.Min > pt.Max || seen[s] {
				t.Fatalf("unusable target %+v", pt)
			}
			seen[s] = true
		}
	})
}
