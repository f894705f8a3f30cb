package flags

import (
	"fmt"

	"github.com/space-sandbox/space"
)

// WarmPoolFlag is the object flag that sets the warm pool's bounds per shape
// (docs/contract.md, "Flags"), so that an operator resizes pools without a deploy.
const WarmPoolFlag = "space-api-warm-pool"

// maxPoolTarget bounds one shape's target: a pool of more ready sandboxes than this is
// a typo, and replenishing it would spend the whole cluster budget.
const maxPoolTarget = 100_000

// PoolTarget bounds the slots the warm pool keeps for one shape: the replenisher
// follows the shape's demand between Min and Max. Min == Max is a fixed target.
type PoolTarget struct {
	Shape    space.Shape
	Min, Max int
}

// ParsePoolTargets parses the value of WarmPoolFlag:
//
//	{"shapes": [
//	  {"template": "python-3.12", "cpu_millis": 1000, "memory_mib": 2048, "disk_gib": 10, "min": 2, "max": 40},
//	  {"template": "node-22", "cpu_millis": 500, "memory_mib": 1024, "disk_gib": 5, "target": 5}
//	]}
//
// Every size of a shape is required, an integer >= 1. A shape gives either "target" (a
// fixed pool: min = max = target) or "max" with an optional "min" (default 0): a pool
// that follows the shape's demand between them. The bounds are integers from 0 (0
// drains the pool of that shape) with min <= max, and a shape may appear only once. A
// missing or null "shapes" is no targets. Any problem is an error wrapping
// ErrMalformed: a pool half-read is worse than the last good one.
func ParsePoolTargets(v any) ([]PoolTarget, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, malformedf("the warm pool flag must be an object such as {\"shapes\": [...]}, got %s", typeName(v))
	}
	for _, field := range sortedKeys(obj) {
		if field != "shapes" {
			return nil, malformedf("unknown field %q in the warm pool flag (want shapes)", truncate(field))
		}
	}
	raw := obj["shapes"]
	if raw == nil {
		return []PoolTarget{}, nil
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, malformedf("shapes must be an array, got %s", typeName(raw))
	}
	targets := make([]PoolTarget, 0, len(list))
	seen := make(map[space.Shape]int, len(list))
	for i, item := range list {
		t, err := parsePoolTarget(item)
		if err != nil {
			return nil, fmt.Errorf("shapes[%d]: %w", i, err)
		}
		if j, dup := seen[t.Shape]; dup {
			return nil, malformedf("shapes[%d]: shape %s is already listed at shapes[%d]", i, t.Shape, j)
		}
		seen[t.Shape] = i
		targets = append(targets, t)
	}
	return targets, nil
}

func parsePoolTarget(v any) (PoolTarget, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return PoolTarget{}, malformedf("must be an object, got %s", typeName(v))
	}
	var t PoolTarget
	for _, field := range sortedKeys(obj) {
		switch field {
		case "template", "cpu_millis", "memory_mib", "disk_gib", "target", "min", "max":
		default:
			return PoolTarget{}, malformedf("unknown field %q (want template, cpu_millis, memory_mib, disk_gib, and target or min and max)", truncate(field))
		}
	}
	tmpl, ok := obj["template"].(string)
	if !ok || tmpl == "" {
		return PoolTarget{}, malformedf("template must be a non-empty string, got %s", describe(obj["template"]))
	}
	t.Shape.Template = tmpl
	field := func(name string, dst *int, lo, hi int64) error {
		raw, present := obj[name]
		if !present {
			return malformedf("%s is required", name)
		}
		n, err := asInt(raw)
		if err != nil || n < lo || n > hi {
			return malformedf("%s must be an integer from %d to %d, got %s", name, lo, hi, describe(raw))
		}
		*dst = int(n)
		return nil
	}
	for _, s := range []struct {
		name string
		dst  *int
	}{{"cpu_millis", &t.Shape.CPUMillis}, {"memory_mib", &t.Shape.MemoryMiB}, {"disk_gib", &t.Shape.DiskGiB}} {
		if err := field(s.name, s.dst, 1, maxCap); err != nil {
			return PoolTarget{}, err
		}
	}
	_, hasTarget := obj["target"]
	_, hasMin := obj["min"]
	_, hasMax := obj["max"]
	switch {
	case hasTarget && (hasMin || hasMax):
		return PoolTarget{}, malformedf("give target (a fixed pool) or min and max (a pool that follows demand), not both")
	case hasTarget:
		if err := field("target", &t.Min, 0, maxPoolTarget); err != nil {
			return PoolTarget{}, err
		}
		t.Max = t.Min
	case hasMax:
		if err := field("max", &t.Max, 0, maxPoolTarget); err != nil {
			return PoolTarget{}, err
		}
		if hasMin {
			if err := field("min", &t.Min, 0, maxPoolTarget); err != nil {
				return PoolTarget{}, err
			}
		}
		if t.Min > t.Max {
			return PoolTarget{}, malformedf("min %d is above max %d", t.Min, t.Max)
		}
	default:
		// A demand-following pool needs its ceiling: demand alone would spend the
		// cluster budget on slots nobody may claim.
		return PoolTarget{}, malformedf("target, or max (with an optional min), is required")
	}
	return t, nil
}
