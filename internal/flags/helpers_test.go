package flags

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-feature/go-sdk/openfeature"
	"github.com/open-feature/go-sdk/openfeature/isolated"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// waitTimeout bounds every wait for a reload or an event. It is a failure bound, not a
// sleep: the waits return as soon as the signal arrives (in milliseconds).
const waitTimeout = 5 * time.Second

// testPoll is the poll interval of the providers under test.
const testPoll = 10 * time.Millisecond

// config is what a test may change in setup.
type config struct {
	env        Env
	configMap  bool          // lay the file out like a mounted ConfigMap
	poll       time.Duration // 0: testPoll
	validators map[string]func(any) error
	provider   openfeature.FeatureProvider // replaces the file provider in the API
	unprepared bool                        // the file provider does not prepare values for the resolver
}

type option func(*config)

func withEnv(env Env) option                            { return func(c *config) { c.env = env } }
func asConfigMap() option                               { return func(c *config) { c.configMap = true } }
func withPoll(d time.Duration) option                   { return func(c *config) { c.poll = d } }
func withProvider(p openfeature.FeatureProvider) option { return func(c *config) { c.provider = p } }
func unprepared() option                                { return func(c *config) { c.unprepared = true } }

// fixture is one test's flags file, provider, OpenFeature API of its own (isolated:
// nothing global, so tests run in parallel), resolver, logs, clock and metrics.
type fixture struct {
	t        testing.TB
	dir      string
	path     string // what the provider reads
	cmGen    int    // ConfigMap data generation
	provider *FileProvider
	api      *openfeature.EvaluationAPI
	client   *openfeature.Client
	resolver *Resolver
	reg      *prometheus.Registry
	logs     *logRecorder
	clock    *testenv.Clock
	reloads  chan ReloadResult
}

// envRate is the env client rate of the tests' default Env.
var envRate = space.Rate{RefillRPS: 2, Burst: 5}

// defaultEnv is admission on, a cluster rate, and an env client rate.
func defaultEnv() Env {
	r := envRate
	return Env{AdmissionEnabled: true, Cluster: space.Rate{RefillRPS: 100, Burst: 200}, ClientRate: &r}
}

// setup writes file (a whole flags file) and builds everything on it.
func setup(t testing.TB, file string, opts ...option) *fixture {
	t.Helper()
	c := config{env: defaultEnv()}
	for _, o := range opts {
		o(&c)
	}
	if c.poll == 0 {
		c.poll = testPoll
	}
	f := &fixture{
		t:       t,
		dir:     t.TempDir(),
		reg:     prometheus.NewRegistry(),
		logs:    &logRecorder{},
		clock:   testenv.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		reloads: make(chan ReloadResult, 1024),
	}
	f.path = filepath.Join(f.dir, "flags.json")
	if c.configMap {
		f.writeConfigMap(file)
	} else {
		f.writeAtomic(file)
	}
	logger := slog.New(f.logs)
	p, err := NewFileProvider(FileProviderOptions{
		Path:         f.path,
		PollInterval: c.poll,
		Logger:       logger,
		Registerer:   f.reg,
		Validators:   c.validators,
		Env:          c.env,
		OnReload: func(r ReloadResult) {
			select {
			case f.reloads <- r:
			default: // a test that does not wait for reloads must not stall the poller
			}
		},
	})
	if err != nil {
		t.Fatalf("NewFileProvider: %v", err)
	}
	f.provider = p

	ctx := context.Background()
	f.api = isolated.NewAPI()
	t.Cleanup(func() { _ = f.api.Shutdown(context.Background()) })
	var provider openfeature.FeatureProvider = p
	if c.provider != nil {
		provider = c.provider
		t.Cleanup(p.Shutdown)
	}
	if err := f.api.SetProviderAndWait(ctx, provider); err != nil {
		t.Fatalf("SetProviderAndWait: %v", err)
	}
	f.client = f.api.NewClient()
	ropts := ResolverOptions{
		Client:     f.client,
		Env:        c.env,
		Logger:     logger,
		Now:        f.clock.Now,
		Registerer: f.reg,
	}
	if c.provider == nil {
		// As space-api builds it: every test of the file provider runs through the
		// callers kept per flags version.
		ropts.Version = p.Version
	}
	f.resolver = NewResolver(ropts)
	if c.provider == nil && !c.unprepared {
		p.Prepare(f.resolver.Prepare) // as space-api builds it
	}
	return f
}

// quotaFile is a flags file holding the quota flag with the given JSON value.
func quotaFile(quota string) string {
	return flagsFile(map[string]string{QuotaFlag: quota})
}

// flagsFile is a flags file holding each flag's JSON value as its one variant.
func flagsFile(values map[string]string) string {
	flags := map[string]any{}
	for key, v := range values {
		flags[key] = map[string]any{
			"state":          "ENABLED",
			"variants":       map[string]json.RawMessage{"on": json.RawMessage(v)},
			"defaultVariant": "on",
		}
	}
	b, err := json.MarshalIndent(map[string]any{"flags": flags}, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("flagsFile: %v", err)) // a broken test literal
	}
	return string(b)
}

func hashOf(content string) string {
	sum := sha256.Sum256([]byte(content))
	return hex.EncodeToString(sum[:])
}

// writeAtomic replaces the file the way an editor or a deploy tool does: write a
// temporary file beside it, then rename it over.
func (f *fixture) writeAtomic(content string) {
	f.t.Helper()
	tmp := filepath.Join(f.dir, ".flags.json.tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		f.t.Fatal(err)
	}
}

// writeConfigMap updates the file the way the kubelet updates a mounted ConfigMap:
//
//	dir/..2026_01_01_00_00_00.000000001/flags.json   the data, one directory per version
//	dir/..data -> ..2026_01_01_00_00_00.000000001    swapped atomically on an update
//	dir/flags.json -> ..data/flags.json              what the pod reads, never changes
//
// A new version is written to a new directory, a ..data_tmp symlink to it is renamed
// over ..data, and the old directory is removed.
func (f *fixture) writeConfigMap(content string) {
	f.t.Helper()
	f.cmGen++
	version := fmt.Sprintf("..2026_01_01_00_00_00.%09d", f.cmGen)
	if err := os.Mkdir(filepath.Join(f.dir, version), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.dir, version, "flags.json"), []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
	data, tmp := filepath.Join(f.dir, "..data"), filepath.Join(f.dir, "..data_tmp")
	old, _ := os.Readlink(data)
	if err := os.Symlink(version, tmp); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(tmp, data); err != nil {
		f.t.Fatal(err)
	}
	if _, err := os.Lstat(f.path); os.IsNotExist(err) {
		if err := os.Symlink(filepath.Join("..data", "flags.json"), f.path); err != nil {
			f.t.Fatal(err)
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(f.dir, old)); err != nil {
			f.t.Fatal(err)
		}
	}
}

// waitReload waits for the first reload result that match accepts, failing the test
// after waitTimeout.
func (f *fixture) waitReload(what string, match func(ReloadResult) bool) ReloadResult {
	f.t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case r := <-f.reloads:
			if match(r) {
				return r
			}
		case <-deadline:
			f.t.Fatalf("no reload %s within %s", what, waitTimeout)
			return ReloadResult{}
		}
	}
}

// waitLoaded waits until content is the file in service.
func (f *fixture) waitLoaded(content string) ReloadResult {
	f.t.Helper()
	want := hashOf(content)
	return f.waitReload("loading "+want[:12], func(r ReloadResult) bool { return r.Err == nil && r.Hash == want })
}

// waitFailed waits for a failed reload.
func (f *fixture) waitFailed() ReloadResult {
	f.t.Helper()
	return f.waitReload("failing", func(r ReloadResult) bool { return r.Err != nil })
}

// update writes a new quota flag value and waits until it is in service.
func (f *fixture) update(quota string) {
	f.t.Helper()
	content := quotaFile(quota)
	f.writeAtomic(content)
	f.waitLoaded(content)
}

// counter returns the value of a counter in the fixture's registry (0 when absent).
func (f *fixture) counter(name string, labels map[string]string) float64 {
	f.t.Helper()
	families, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, fam := range families {
		if fam.GetName() != name {
			continue
		}
	metrics:
		for _, m := range fam.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue metrics
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// logRecorder is a slog.Handler that keeps every record, for tests to count.
type logRecorder struct {
	mu      sync.Mutex
	records []logRecord
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	h.records = append(h.records, rec)
	h.mu.Unlock()
	return nil
}

// count returns how many records at level have msg and carry every given attribute.
func (h *logRecorder) count(level slog.Level, msg string, attrs map[string]string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
next:
	for _, r := range h.records {
		if r.level != level || r.msg != msg {
			continue
		}
		for k, v := range attrs {
			if r.attrs[k] != v {
				continue next
			}
		}
		n++
	}
	return n
}

// stubProvider is another OpenFeature provider: it serves whatever the test stores,
// as a remote provider might, including garbage and errors.
type stubProvider struct {
	openfeature.NoopProvider
	value atomic.Pointer[stubAnswer]
	calls atomic.Int64
	// perKey, when set, answers by targeting key, as a provider with targeting would.
	perKey map[string]any
}

type stubAnswer struct {
	value any
	err   *openfeature.ResolutionError
}

func (s *stubProvider) set(v any)                            { s.value.Store(&stubAnswer{value: v}) }
func (s *stubProvider) fail(err openfeature.ResolutionError) { s.value.Store(&stubAnswer{err: &err}) }

func (s *stubProvider) Metadata() openfeature.Metadata { return openfeature.Metadata{Name: "stub"} }

func (s *stubProvider) ObjectEvaluation(_ context.Context, _ string, def any, ec openfeature.FlattenedContext) openfeature.InterfaceResolutionDetail {
	s.calls.Add(1)
	if s.perKey != nil {
		key, _ := ec[openfeature.TargetingKey].(string)
		if v, ok := s.perKey[key]; ok {
			return openfeature.InterfaceResolutionDetail{Value: v, ProviderResolutionDetail: openfeature.ProviderResolutionDetail{Reason: openfeature.TargetingMatchReason}}
		}
	}
	a := s.value.Load()
	if a == nil {
		return openfeature.InterfaceResolutionDetail{Value: def, ProviderResolutionDetail: openfeature.ProviderResolutionDetail{
			ResolutionError: openfeature.NewFlagNotFoundResolutionError("no value"), Reason: openfeature.ErrorReason,
		}}
	}
	if a.err != nil {
		return openfeature.InterfaceResolutionDetail{Value: def, ProviderResolutionDetail: openfeature.ProviderResolutionDetail{
			ResolutionError: *a.err, Reason: openfeature.ErrorReason,
		}}
	}
	return openfeature.InterfaceResolutionDetail{Value: a.value, ProviderResolutionDetail: openfeature.ProviderResolutionDetail{Reason: openfeature.StaticReason}}
}

// decode parses a JSON literal of a test into the form providers hand out.
func decode(t testing.TB, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("bad test JSON %s: %v", s, err)
	}
	return v
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
