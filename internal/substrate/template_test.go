package substrate_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/reload"
	"github.com/space-sandbox/space/internal/substrate"
)

// templatesFile has two templates: one with caps, a cost and a pod spec, one with an
// image only.
const templatesFile = `{"templates": {
	"python-3.12": {
		"image": "python:3.12-slim",
		"max_cpu_millis": 4000, "max_memory_mib": 8192, "max_disk_gib": 50,
		"activation_cost": 3,
		"pod": {"containers": [{"name": "runner"}], "nodeSelector": {"pool": "sandboxes"}}
	},
	"node-22": {"image": "node:22-slim"}
}}`

func parseTemplates(t *testing.T, body string) substrate.Templates {
	t.Helper()
	ts, err := substrate.ParseTemplates([]byte(body))
	if err != nil {
		t.Fatalf("ParseTemplates: %v", err)
	}
	return ts
}

func TestParseTemplates(t *testing.T) {
	t.Parallel()

	t.Run("each template gets its name, caps, cost and a version", func(t *testing.T) {
		t.Parallel()
		ts := parseTemplates(t, templatesFile)
		if got := ts.Names(); !slices.Equal(got, []string{"node-22", "python-3.12"}) {
			t.Fatalf("Names = %v, want both, sorted", got)
		}
		py := ts["python-3.12"]
		if py.Name != "python-3.12" || py.Image != "python:3.12-slim" || py.MaxCPUMillis != 4000 || py.MaxMemoryMiB != 8192 ||
			py.MaxDiskGiB != 50 || py.Cost != 3 || !strings.Contains(string(py.Pod), `"nodeSelector"`) {
			t.Fatalf("python-3.12 = %+v", py)
		}
		node := ts["node-22"]
		if node.Name != "node-22" || node.MaxCPUMillis != 0 || node.Cost != 0 || node.Pod != nil {
			t.Fatalf("node-22 = %+v", node)
		}
		hex := regexp.MustCompile(`^[0-9a-f]{12}$`)
		if !hex.MatchString(py.Version) || !hex.MatchString(node.Version) || py.Version == node.Version {
			t.Fatalf("versions %q and %q, want two distinct content hashes", py.Version, node.Version)
		}
		if got := ts.Current(); len(got) != len(ts) || got["node-22"].Version != ts["node-22"].Version {
			t.Fatal("a Templates is not its own TemplateSource")
		}
	})

	t.Run("a pod spec without an image is enough", func(t *testing.T) {
		t.Parallel()
		ts := parseTemplates(t, `{"templates": {"custom": {"pod": {"containers": [{"name": "c", "image": "busybox"}]}}}}`)
		if ts["custom"].Image != "" || len(ts["custom"].Pod) == 0 {
			t.Fatalf("custom = %+v", ts["custom"])
		}
	})

	t.Run("a file that cannot be served is refused, saying why and, for an entry, naming its template", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			name, body string
			want       []string
		}{
			{"not JSON", `{"templates": `, []string{"parse:"}},
			{"an unknown field", `{"templates": {"python": {"image": "p", "max_cpu_milis": 10}}}`, []string{`unknown field "max_cpu_milis"`}},
			{"an unknown top-level field", `{"templates": {"python": {"image": "p"}}, "extra": 1}`, []string{`unknown field "extra"`}},
			{"no templates key", `{}`, []string{"no templates"}},
			{"no templates", `{"templates": {}}`, []string{"no templates"}},
			{"an empty name", `{"templates": {"": {"image": "p"}}}`, []string{"empty name"}},
			{"neither image nor pod", `{"templates": {"python": {"max_cpu_millis": 10}}}`, []string{`template "python"`, "needs an image or a pod spec"}},
			{"a negative cpu cap", `{"templates": {"python": {"image": "p", "max_cpu_millis": -1}}}`, []string{`template "python"`, "caps must be >= 0"}},
			{"a negative memory cap", `{"templates": {"python": {"image": "p", "max_memory_mib": -1}}}`, []string{`template "python"`, "caps must be >= 0"}},
			{"a negative disk cap", `{"templates": {"python": {"image": "p", "max_disk_gib": -1}}}`, []string{`template "python"`, "caps must be >= 0"}},
			{"a negative activation cost", `{"templates": {"python": {"image": "p", "activation_cost": -2}}}`, []string{`template "python"`, "activation_cost", "got -2"}},
			{"a fractional activation cost", `{"templates": {"python": {"image": "p", "activation_cost": 1.5}}}`, []string{"activation_cost"}},
		} {
			_, err := substrate.ParseTemplates([]byte(c.body))
			if err == nil {
				t.Errorf("%s: parsed, want an error", c.name)
				continue
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error %q does not say %q", c.name, err, w)
				}
			}
		}
	})
}

func TestTemplateVersion(t *testing.T) {
	t.Parallel()

	t.Run("reformatting the file keeps every version", func(t *testing.T) {
		t.Parallel()
		compact := `{"templates":{"node-22":{"image":"node:22-slim"},"python-3.12":{"activation_cost":3,"image":"python:3.12-slim","max_cpu_millis":4000,"max_memory_mib":8192,"max_disk_gib":50,"pod":{"containers":[{"name":"runner"}],"nodeSelector":{"pool":"sandboxes"}}}}}`
		a, b := parseTemplates(t, templatesFile), parseTemplates(t, compact)
		for name := range a {
			if a[name].Version != b[name].Version {
				t.Errorf("%s: version %s reformatted is %s", name, a[name].Version, b[name].Version)
			}
		}
	})

	t.Run("a change to any field of a template is a new version of that template only", func(t *testing.T) {
		t.Parallel()
		base := parseTemplates(t, templatesFile)
		for _, change := range [][2]string{
			{`"python:3.12-slim"`, `"python:3.12.7-slim"`},
			{`"max_cpu_millis": 4000`, `"max_cpu_millis": 4001`},
			{`"max_memory_mib": 8192`, `"max_memory_mib": 8193`},
			{`"max_disk_gib": 50`, `"max_disk_gib": 51`},
			{`"activation_cost": 3`, `"activation_cost": 4`},
			{`"pool": "sandboxes"`, `"pool": "gpu"`},
		} {
			changed := parseTemplates(t, strings.Replace(templatesFile, change[0], change[1], 1))
			if changed["python-3.12"].Version == base["python-3.12"].Version {
				t.Errorf("%s -> %s kept the version of python-3.12", change[0], change[1])
			}
			if changed["node-22"].Version != base["node-22"].Version {
				t.Errorf("%s -> %s in python-3.12 changed the version of node-22", change[0], change[1])
			}
		}
	})

	t.Run("the same entry under another name is another version", func(t *testing.T) {
		t.Parallel()
		ts := parseTemplates(t, `{"templates": {"a": {"image": "p"}, "b": {"image": "p"}}}`)
		if ts["a"].Version == ts["b"].Version {
			t.Fatalf("a and b share the version %s", ts["a"].Version)
		}
	})
}

func TestTemplateFits(t *testing.T) {
	t.Parallel()
	capped := substrate.Template{MaxCPUMillis: 2000, MaxMemoryMiB: 4096, MaxDiskGiB: 20}
	for _, c := range []struct {
		name  string
		tmpl  substrate.Template
		shape space.Shape
		field string
		limit int
		fits  bool
	}{
		{name: "a shape within every cap", tmpl: capped, shape: space.Shape{CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10}, fits: true},
		{name: "a shape at every cap", tmpl: capped, shape: space.Shape{CPUMillis: 2000, MemoryMiB: 4096, DiskGiB: 20}, fits: true},
		{name: "cpu over", tmpl: capped, shape: space.Shape{CPUMillis: 2001, MemoryMiB: 1, DiskGiB: 1}, field: "cpu_millis", limit: 2000},
		{name: "memory over", tmpl: capped, shape: space.Shape{CPUMillis: 1, MemoryMiB: 4097, DiskGiB: 1}, field: "memory_mib", limit: 4096},
		{name: "disk over", tmpl: capped, shape: space.Shape{CPUMillis: 1, MemoryMiB: 1, DiskGiB: 21}, field: "disk_gib", limit: 20},
		{name: "all over names cpu first", tmpl: capped, shape: space.Shape{CPUMillis: 9999, MemoryMiB: 99999, DiskGiB: 999}, field: "cpu_millis", limit: 2000},
		{name: "no caps: only the global caps apply", tmpl: substrate.Template{}, shape: space.Shape{CPUMillis: 1 << 20, MemoryMiB: 1 << 20, DiskGiB: 1 << 20}, fits: true},
	} {
		field, limit, ok := c.tmpl.Fits(c.shape)
		if ok != c.fits || field != c.field || limit != c.limit {
			t.Errorf("%s: Fits = %q, %d, %v; want %q, %d, %v", c.name, field, limit, ok, c.field, c.limit, c.fits)
		}
	}
}

func TestActivationCostIsOneUnlessSet(t *testing.T) {
	t.Parallel()
	for cost, want := range map[int]int{-1: 1, 0: 1, 1: 1, 3: 3} {
		if got := (substrate.Template{Cost: cost}).ActivationCost(); got != want {
			t.Errorf("ActivationCost of cost %d = %d, want %d", cost, got, want)
		}
	}
	if got := parseTemplates(t, templatesFile)["node-22"].ActivationCost(); got != 1 {
		t.Errorf("a template with no activation_cost costs %d, want 1", got)
	}
}

func TestLoadTemplates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()

	missing := filepath.Join(dir, "missing.json")
	if _, err := substrate.LoadTemplates(missing); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "SPACE_TEMPLATES_FILE") {
		t.Errorf("a missing file: err = %v, want ErrNotExist naming SPACE_TEMPLATES_FILE", err)
	}

	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"templates": {}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := substrate.LoadTemplates(bad); err == nil || !strings.Contains(err.Error(), "SPACE_TEMPLATES_FILE "+bad) {
		t.Errorf("a bad file: err = %v, want it named", err)
	}

	good := filepath.Join(dir, "good.json")
	if err := os.WriteFile(good, []byte(templatesFile), 0o644); err != nil {
		t.Fatal(err)
	}
	ts, err := substrate.LoadTemplates(good)
	if err != nil || len(ts) != 2 {
		t.Fatalf("LoadTemplates = %v, %v", ts, err)
	}
}

// store is one test's templates file and the TemplateStore serving it.
type store struct {
	t       *testing.T
	path    string
	reg     *prometheus.Registry
	ts      *substrate.TemplateStore
	reloads chan reload.Result
}

func openStore(t *testing.T, body string, opts substrate.TemplateStoreOptions) (*store, error) {
	t.Helper()
	s := &store{t: t, path: filepath.Join(t.TempDir(), "templates.json"), reg: prometheus.NewRegistry(), reloads: make(chan reload.Result, 16)}
	s.write(body)
	opts.Path, opts.Registerer = s.path, s.reg
	if opts.PollInterval == 0 {
		opts.PollInterval = time.Hour // the tests check by hand
	}
	opts.OnReload = func(r reload.Result) { s.reloads <- r }
	var err error
	s.ts, err = substrate.OpenTemplates(opts)
	return s, err
}

func setupStore(t *testing.T, body string, opts substrate.TemplateStoreOptions) *store {
	t.Helper()
	s, err := openStore(t, body, opts)
	if err != nil {
		t.Fatalf("OpenTemplates: %v", err)
	}
	return s
}

// write replaces the file by a rename, as a deploy does.
func (s *store) write(body string) {
	s.t.Helper()
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		s.t.Fatal(err)
	}
}

// reloadsCounted is space_templates_reloads_total{result} of the store's registry.
func (s *store) reloadsCounted(result string) float64 {
	s.t.Helper()
	families, err := s.reg.Gather()
	if err != nil {
		s.t.Fatal(err)
	}
	for _, fam := range families {
		if fam.GetName() != "space_templates_reloads_total" {
			continue
		}
		for _, m := range fam.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "result" && lp.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	s.t.Fatalf("no space_templates_reloads_total{result=%q}", result)
	return 0
}

func TestTemplateStore(t *testing.T) {
	t.Parallel()
	imageChanged := strings.Replace(templatesFile, "python:3.12-slim", "python:3.12.7-slim", 1)

	t.Run("a bad file at start is a configuration error naming SPACE_TEMPLATES_FILE", func(t *testing.T) {
		t.Parallel()
		if _, err := openStore(t, `{"templates": {}}`, substrate.TemplateStoreOptions{}); err == nil || !strings.Contains(err.Error(), "SPACE_TEMPLATES_FILE") {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("templates the wiring refuses at start are a configuration error", func(t *testing.T) {
		t.Parallel()
		refuse := func(substrate.Templates) error { return errors.New("a cost above the burst") }
		if _, err := openStore(t, templatesFile, substrate.TemplateStoreOptions{Check: refuse}); err == nil || !strings.Contains(err.Error(), "a cost above the burst") {
			t.Fatalf("err = %v, want the check's refusal", err)
		}
	})

	t.Run("a changed file is served with a new version and told to OnReload", func(t *testing.T) {
		t.Parallel()
		s := setupStore(t, templatesFile, substrate.TemplateStoreOptions{})
		before := s.ts.Current()
		if res := s.ts.Reload(); !res.Unchanged {
			t.Fatalf("Reload of the same file = %+v, want unchanged", res)
		}
		select {
		case r := <-s.reloads:
			t.Fatalf("OnReload told of an unchanged file: %+v", r)
		default:
		}
		s.write(imageChanged)
		if res := s.ts.Reload(); !res.Swapped {
			t.Fatalf("Reload = %+v, want swapped", res)
		}
		if r := wait(t, s.reloads, "OnReload"); !r.Swapped {
			t.Fatalf("OnReload got %+v", r)
		}
		after := s.ts.Current()
		if after["python-3.12"].Image != "python:3.12.7-slim" || after["python-3.12"].Version == before["python-3.12"].Version {
			t.Fatalf("after the reload python-3.12 = %+v, was %+v", after["python-3.12"], before["python-3.12"])
		}
		if after["node-22"].Version != before["node-22"].Version {
			t.Fatal("an unchanged template got a new version")
		}
		if before["python-3.12"].Image != "python:3.12-slim" {
			t.Fatal("the reload changed the Templates handed out before it")
		}
	})

	t.Run("a file the wiring refuses keeps the last good templates and counts an error", func(t *testing.T) {
		t.Parallel()
		var refuse atomic.Bool
		s := setupStore(t, templatesFile, substrate.TemplateStoreOptions{Check: func(substrate.Templates) error {
			if refuse.Load() {
				return errors.New("refused by the wiring")
			}
			return nil
		}})
		refuse.Store(true)
		s.write(imageChanged)
		res := s.ts.Reload()
		if res.Err == nil || !strings.Contains(res.Err.Error(), "refused by the wiring") {
			t.Fatalf("Reload = %+v, want the refusal", res)
		}
		if r := wait(t, s.reloads, "OnReload"); r.Err == nil {
			t.Fatalf("OnReload got %+v, want the refusal", r)
		}
		if img := s.ts.Current()["python-3.12"].Image; img != "python:3.12-slim" {
			t.Fatalf("image %q in service, want the last good one", img)
		}
		if n := s.reloadsCounted("error"); n != 1 {
			t.Fatalf(`space_templates_reloads_total{result="error"} = %v, want 1`, n)
		}
	})

	t.Run("Run polls the file until its context ends", func(t *testing.T) {
		t.Parallel()
		s := setupStore(t, templatesFile, substrate.TemplateStoreOptions{PollInterval: 5 * time.Millisecond})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.ts.Run(ctx)
		}()
		s.write(imageChanged)
		if r := wait(t, s.reloads, "a polled reload"); !r.Swapped {
			t.Fatalf("the poll found %+v, want the new file swapped in", r)
		}
		cancel()
		wait(t, done, "Run's return")
	})
}
