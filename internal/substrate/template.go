package substrate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/space-sandbox/space"
)

// Template is one entry of SPACE_TEMPLATES_FILE: what a substrate needs to run a
// sandbox of this template, and the caps its shapes must stay within (on top of the
// SPACE_MAX_* caps).
type Template struct {
	Name string `json:"-"`
	// Image is the container or VM image.
	Image string `json:"image"`
	// MaxCPUMillis, MaxMemoryMiB and MaxDiskGiB cap shapes of this template; 0 means
	// only the global SPACE_MAX_* cap applies.
	MaxCPUMillis int `json:"max_cpu_millis,omitempty"`
	MaxMemoryMiB int `json:"max_memory_mib,omitempty"`
	MaxDiskGiB   int `json:"max_disk_gib,omitempty"`
	// Pod is a Kubernetes PodSpec (JSON) used by the kubernetes substrate; Image and the
	// shape's resources are filled into its first container.
	Pod json.RawMessage `json:"pod,omitempty"`
}

// Templates are the known templates by name.
type Templates map[string]Template

// Names returns the template names, sorted.
func (ts Templates) Names() []string {
	names := make([]string, 0, len(ts))
	for n := range ts {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LoadTemplates reads SPACE_TEMPLATES_FILE: {"templates": {"<name>": {...}}}. Unknown
// fields are refused so that a typo in a cap is not silently ignored.
func LoadTemplates(path string) (Templates, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("SPACE_TEMPLATES_FILE: %w", err)
	}
	ts, err := ParseTemplates(b)
	if err != nil {
		return nil, fmt.Errorf("SPACE_TEMPLATES_FILE %s: %w", path, err)
	}
	return ts, nil
}

// ParseTemplates parses the body of a templates file.
func ParseTemplates(b []byte) (Templates, error) {
	var doc struct {
		Templates map[string]Template `json:"templates"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if len(doc.Templates) == 0 {
		return nil, fmt.Errorf(`no templates: want {"templates": {"<name>": {"image": ...}}}`)
	}
	ts := make(Templates, len(doc.Templates))
	for name, t := range doc.Templates {
		if name == "" {
			return nil, fmt.Errorf("a template has an empty name")
		}
		if t.Image == "" && len(t.Pod) == 0 {
			return nil, fmt.Errorf("template %q: needs an image or a pod spec", name)
		}
		if t.MaxCPUMillis < 0 || t.MaxMemoryMiB < 0 || t.MaxDiskGiB < 0 {
			return nil, fmt.Errorf("template %q: caps must be >= 0", name)
		}
		t.Name = name
		ts[name] = t
	}
	return ts, nil
}

// Fits reports whether shape is within the template's own caps, naming the first field
// over its cap.
func (t Template) Fits(shape space.Shape) (field string, limit int, ok bool) {
	switch {
	case t.MaxCPUMillis > 0 && shape.CPUMillis > t.MaxCPUMillis:
		return "cpu_millis", t.MaxCPUMillis, false
	case t.MaxMemoryMiB > 0 && shape.MemoryMiB > t.MaxMemoryMiB:
		return "memory_mib", t.MaxMemoryMiB, false
	case t.MaxDiskGiB > 0 && shape.DiskGiB > t.MaxDiskGiB:
		return "disk_gib", t.MaxDiskGiB, false
	}
	return "", 0, true
}
