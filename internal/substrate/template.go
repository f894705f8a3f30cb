package substrate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/reload"
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
	// Cost is how many tokens one activation of this template takes from the cluster
	// bucket and the client's (activation_cost, a whole number, default 1): a big
	// sandbox costs the cluster more than a small one. One cost per template rather
	// than a formula of the shape: it is explicit and predictable, and an operator who
	// wants size classes defines a template per class (python-small, python-gpu).
	Cost int `json:"activation_cost,omitempty"`
	// Version is a content hash of the template's entry, set when the file is parsed:
	// a warm slot records the version it was warmed from, and one of an older version
	// is never handed out.
	Version string `json:"-"`
}

// ActivationCost is the tokens one activation of the template takes: Cost, or 1.
func (t Template) ActivationCost() int {
	if t.Cost <= 0 {
		return 1
	}
	return t.Cost
}

// Templates are the known templates by name.
type Templates map[string]Template

// Current returns ts itself: a fixed set of templates is a TemplateSource.
func (ts Templates) Current() Templates { return ts }

// TemplateSource hands out the templates in force: a fixed Templates, or a
// TemplateStore that reloads its file.
type TemplateSource interface {
	Current() Templates
}

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
		if t.Cost < 0 {
			return nil, fmt.Errorf("template %q: activation_cost must be a whole number >= 1, got %d", name, t.Cost)
		}
		t.Name = name
		v, err := version(name, t)
		if err != nil {
			return nil, err
		}
		t.Version = v
		ts[name] = t
	}
	return ts, nil
}

// version is the content hash of one template entry: its name and its fields, with the
// pod spec compacted so that reformatting the file is not a new version.
func version(name string, t Template) (string, error) {
	if len(t.Pod) > 0 {
		var compact bytes.Buffer
		if err := json.Compact(&compact, t.Pod); err != nil {
			return "", fmt.Errorf("template %q: pod: %w", name, err)
		}
		t.Pod = compact.Bytes()
	}
	b, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("template %q: %w", name, err)
	}
	sum := sha256.Sum256(append([]byte(name+"\x00"), b...))
	return hex.EncodeToString(sum[:6]), nil
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

// TemplateStoreOptions configure OpenTemplates.
type TemplateStoreOptions struct {
	// Path is SPACE_TEMPLATES_FILE.
	Path string
	// PollInterval is how often the file is checked for a change (required;
	// SPACE_TEMPLATES_POLL_INTERVAL, 2s by default).
	PollInterval time.Duration
	// Check refuses templates the wiring cannot serve (a pod spec that does not
	// decode, a cost above a bucket's burst), at start and at every reload.
	Check      func(Templates) error
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// OnReload, when set, is told of every check that saw something new in the file:
	// tests wait on it instead of sleeping.
	OnReload func(reload.Result)
}

// TemplateStore serves SPACE_TEMPLATES_FILE and reloads it live, as the flags file is:
// polled by content hash, a new good file swapped in atomically, a bad one logged and
// counted (space_templates_reloads_total{result="error"}) while the last good
// templates stay. A changed template gets a new Version, so the warm pool retires the
// slots of the old one.
type TemplateStore struct {
	file     *reload.File[Templates]
	interval time.Duration
	onReload func(reload.Result)
}

// OpenTemplates loads the templates file once: an error is a configuration error
// naming SPACE_TEMPLATES_FILE.
func OpenTemplates(opts TemplateStoreOptions) (*TemplateStore, error) {
	if opts.PollInterval <= 0 {
		return nil, fmt.Errorf("templates file: PollInterval must be positive, got %s", opts.PollInterval)
	}
	f, err := reload.Open(reload.Options[Templates]{
		Path: opts.Path, What: "templates file", Metric: "space_templates", Registerer: opts.Registerer, Logger: opts.Logger,
		Parse: func(b []byte) (Templates, error) {
			ts, err := ParseTemplates(b)
			if err == nil && opts.Check != nil {
				err = opts.Check(ts)
			}
			return ts, err
		},
	})
	if err != nil {
		return nil, fmt.Errorf("SPACE_TEMPLATES_FILE: %w", err)
	}
	return &TemplateStore{file: f, interval: opts.PollInterval, onReload: opts.OnReload}, nil
}

// Current implements TemplateSource: the templates in service.
func (s *TemplateStore) Current() Templates {
	ts, _ := s.file.Current()
	return ts
}

// Reload checks the file now, as a poll does.
func (s *TemplateStore) Reload() reload.Result {
	res, _, _ := s.file.Check()
	if !res.Unchanged && s.onReload != nil {
		s.onReload(res)
	}
	return res
}

// Run polls the file until ctx ends.
func (s *TemplateStore) Run(ctx context.Context) {
	reload.Poll(ctx, s.interval, func() { s.Reload() })
}
