package flags

import (
	"fmt"

	"github.com/space-sandbox/space"
)

// WarmPoolFlag is the object flag that sets the warm pool's target per shape
// (docs/contract.md, "Flags"), so that an operator resizes pools without a deploy.
const WarmPoolFlag = "space-api-warm-pool"

// maxPoolTarget bounds one shape's target: a pool of more ready sandboxes than this is
// a typo, and replenishing it would spend the whole cluster budget.
const maxPoolTarget = 100_000

// PoolTarget is how many ready slots the warm pool keeps for one shape.
type PoolTarget struct {
	Shape  space.Shape
	Target int
}

// ParsePoolTargets parses the value of WarmPoolFlag:
//
//	{"shapes": [{"template": "python-3.12", "cpu_millis": 1000, "memory_mib": 2048, "disk_gib": 10, "target": 5}]}
//
// Every field of a shape is required, the sizes are integers >= 1, the target an
// integer >= 0 (0 drains the pool of that shape), and a shape may appear only once. A
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
		case "template", "cpu_millis", "memory_mib", "disk_gib", "target":
		default:
			return PoolTarget{}, malformedf("unknown field %q (want template, cpu_millis, memory_mib, disk_gib, target)", truncate(field))
		}
	}
	tmpl, ok := obj["template"].(string)
	if !ok || tmpl == "" {
		return PoolTarget{}, malformedf("template must be a non-empty string, got %s", describe(obj["template"]))
	}
	t.Shape.Template = tmpl
	sizes := []struct {
		field string
		dst   *int
		min   int64
		max   int64
	}{
		{"cpu_millis", &t.Shape.CPUMillis, 1, maxCap},
		{"memory_mib", &t.Shape.MemoryMiB, 1, maxCap},
		{"disk_gib", &t.Shape.DiskGiB, 1, maxCap},
		{"target", &t.Target, 0, maxPoolTarget},
	}
	for _, s := range sizes {
		raw, present := obj[s.field]
		if !present {
			return PoolTarget{}, malformedf("%s is required", s.field)
		}
		n, err := asInt(raw)
		if err != nil || n < s.min || n > s.max {
			return PoolTarget{}, malformedf("%s must be an integer from %d to %d, got %s", s.field, s.min, s.max, describe(raw))
		}
		*s.dst = int(n)
	}
	return t, nil
}
