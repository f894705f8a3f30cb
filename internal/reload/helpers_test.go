package reload_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space/internal/reload"
)

// config is what the files of the tests hold: a generation and items that all repeat
// it, so that a reader can tell a whole value from a torn one.
type config struct {
	Gen   int   `json:"gen"`
	Items []int `json:"items"`
}

// items is how many times a config repeats its generation.
const items = 64

// render is the content of generation gen.
func render(gen int) string {
	c := config{Gen: gen, Items: make([]int, items)}
	for i := range c.Items {
		c.Items[i] = gen
	}
	b, err := json.Marshal(c)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// parse refuses what is not one config, and a negative generation, as a validator
// would.
func parse(data []byte) (config, error) {
	var c config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return config{}, err
	}
	if c.Gen < 0 {
		return config{}, fmt.Errorf("gen must be >= 0, got %d", c.Gen)
	}
	return c, nil
}

// whole reports whether c is a value some content parsed to, rather than parts of two.
func whole(c config) error {
	if len(c.Items) != items {
		return fmt.Errorf("gen %d has %d items, want %d", c.Gen, len(c.Items), items)
	}
	for _, it := range c.Items {
		if it != c.Gen {
			return fmt.Errorf("gen %d holds an item of gen %d", c.Gen, it)
		}
	}
	return nil
}

func hashOf(content string) string {
	sum := sha256.Sum256([]byte(content))
	return hex.EncodeToString(sum[:])
}

const (
	what = "test file"
	stem = "test_config"
)

// bundle is one test's file, registry, logs and the reload.File serving it.
type bundle struct {
	t     *testing.T
	dir   string
	path  string // what the File reads
	reg   *prometheus.Registry
	logs  *logRecorder
	file  *reload.File[config]
	cmGen int // ConfigMap data generation
	// onParse, when set, runs at the start of every parse.
	onParse func()
}

// setup writes first as the file, by an atomic rename, and opens it.
func setup(t *testing.T, first string) *bundle {
	t.Helper()
	b := newBundle(t)
	b.writeAtomic(first)
	b.open()
	return b
}

// setupConfigMap lays first out as a mounted ConfigMap and opens it.
func setupConfigMap(t *testing.T, first string) *bundle {
	t.Helper()
	b := newBundle(t)
	b.writeConfigMap(first)
	b.open()
	return b
}

func newBundle(t *testing.T) *bundle {
	dir := t.TempDir()
	return &bundle{t: t, dir: dir, path: filepath.Join(dir, "config.json"), reg: prometheus.NewRegistry(), logs: &logRecorder{}}
}

func (b *bundle) options() reload.Options[config] {
	return reload.Options[config]{
		Path: b.path, What: what, Metric: stem,
		Parse: func(data []byte) (config, error) {
			if b.onParse != nil {
				b.onParse()
			}
			return parse(data)
		},
		Registerer: b.reg, Logger: slog.New(b.logs),
	}
}

func (b *bundle) open() {
	b.t.Helper()
	f, err := reload.Open(b.options())
	if err != nil {
		b.t.Fatalf("Open: %v", err)
	}
	b.file = f
}

// writeAtomic replaces the file as an editor or a deploy tool does: a temporary file
// beside it, renamed over it.
func (b *bundle) writeAtomic(content string) {
	b.t.Helper()
	tmp := filepath.Join(b.dir, ".config.json.tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		b.t.Fatal(err)
	}
	if err := os.Rename(tmp, b.path); err != nil {
		b.t.Fatal(err)
	}
}

// writeConfigMap updates the file as the kubelet updates a mounted ConfigMap: the data
// in a new directory per version, a ..data symlink to it swapped by a rename, and the
// file itself a symlink through ..data that never changes.
func (b *bundle) writeConfigMap(content string) {
	b.t.Helper()
	b.cmGen++
	version := fmt.Sprintf("..2026_01_01_00_00_00.%09d", b.cmGen)
	if err := os.Mkdir(filepath.Join(b.dir, version), 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.dir, version, "config.json"), []byte(content), 0o644); err != nil {
		b.t.Fatal(err)
	}
	data, tmp := filepath.Join(b.dir, "..data"), filepath.Join(b.dir, "..data_tmp")
	old, _ := os.Readlink(data)
	if err := os.Symlink(version, tmp); err != nil {
		b.t.Fatal(err)
	}
	if err := os.Rename(tmp, data); err != nil {
		b.t.Fatal(err)
	}
	if _, err := os.Lstat(b.path); errors.Is(err, os.ErrNotExist) {
		if err := os.Symlink(filepath.Join("..data", "config.json"), b.path); err != nil {
			b.t.Fatal(err)
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(b.dir, old)); err != nil {
			b.t.Fatal(err)
		}
	}
}

// check runs a check and fails the test unless want accepts its result.
func (b *bundle) check(what string, want func(reload.Result) bool) (reload.Result, config, config) {
	b.t.Helper()
	res, prev, next := b.file.Check()
	if !want(res) {
		b.t.Fatalf("check %s: result %+v", what, res)
	}
	return res, prev, next
}

// gen is the generation in service, checked whole and consistent with its hash.
func (b *bundle) gen() int {
	b.t.Helper()
	c, h := b.file.Current()
	if err := whole(c); err != nil {
		b.t.Fatal(err)
	}
	if h != hashOf(render(c.Gen)) {
		b.t.Fatalf("gen %d is in service with the hash %s of another content", c.Gen, h)
	}
	return c.Gen
}

// metric is the value of a counter or gauge of the bundle's registry whose labels
// include labels (name, value pairs); it fails the test when there is none.
func (b *bundle) metric(name string, labels ...string) float64 {
	b.t.Helper()
	families, err := b.reg.Gather()
	if err != nil {
		b.t.Fatal(err)
	}
	for _, fam := range families {
		if fam.GetName() != name {
			continue
		}
	metrics:
		for _, m := range fam.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metrics
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	b.t.Fatalf("no series %s%v", name, labels)
	return 0
}

// counts are the reloads counted so far, by result.
func (b *bundle) counts() (success, failure float64) {
	b.t.Helper()
	return b.metric(stem+"_reloads_total", "result", "success"), b.metric(stem+"_reloads_total", "result", "error")
}

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}

// lines returns the records so far as "LEVEL message key=value ...".
func (h *logRecorder) lines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.records {
		var sb strings.Builder
		sb.WriteString(r.Level.String() + " " + r.Message)
		r.Attrs(func(a slog.Attr) bool {
			sb.WriteString(" " + a.Key + "=" + a.Value.String())
			return true
		})
		out = append(out, sb.String())
	}
	return out
}
