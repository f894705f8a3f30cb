package flags

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-feature/go-sdk/openfeature"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/space-sandbox/space/internal/reload"
)

// ProviderName is the name the file provider reports in its OpenFeature metadata and
// events.
const ProviderName = "space-flags-file"

// FileProviderOptions configures NewFileProvider.
type FileProviderOptions struct {
	// Path is the flags file (SPACE_FLAGS_FILE). It may be a symlink, as a Kubernetes
	// ConfigMap mount makes it: the provider reads through the link on every poll.
	Path string
	// PollInterval is how often the file is read and hashed (required;
	// SPACE_FLAGS_POLL_INTERVAL, 2s by default).
	PollInterval time.Duration
	// Logger receives reload successes and failures; default slog.Default().
	Logger *slog.Logger
	// Registerer registers space_flags_reloads_total{result} and the last-reload
	// gauges; nil leaves them unregistered (they still count, for tests).
	Registerer prometheus.Registerer
	// Validators maps a flag key to a check of each of its variant values, run at every
	// load: a file whose value fails is refused as a whole and the last good flags stay.
	// Nil means DefaultValidators(Env); an empty map validates nothing.
	Validators map[string]func(value any) error
	// Env is the configuration the flags are served under, which the default
	// validators hold the quota flag to (its tier table's floor tier and reserves).
	Env Env
	// OnReload, when set, is called after every reload attempt that saw something new in
	// the file (new content, or a new read error), on the goroutine that reloaded, before
	// the next poll. It must not block. It lets tests wait for a reload instead of
	// sleeping.
	OnReload func(ReloadResult)
}

// ReloadResult is the outcome of one check of the flags file.
type ReloadResult struct {
	// Err is why the file was not loaded (unreadable, missing, invalid JSON, targeting
	// rules, a value refused by a validator); nil when it was. On an error the last good
	// flags stay in service.
	Err error
	// Unchanged is true when the file read exactly as at the previous check (or fails
	// exactly as it did): nothing was done and nothing was reported.
	Unchanged bool
	// Changed lists the flags added, removed or changed by a successful load; empty
	// when the new content serves the same flags (a reformatted file, or the last good
	// file back after an error). A configuration-changed event is emitted when it is
	// not empty.
	Changed []string
	// Hash is the hex SHA-256 of the content in service after the check.
	Hash string
}

// DefaultValidators returns the checks the flags file is held to under the
// configuration env: the quota flag must parse as a whole (ParseQuotas) and hold in
// force under env (a tier table with its floor tier, reserves within the cluster
// bucket), and the warm pool flag must give valid targets (ParsePoolTargets).
func DefaultValidators(env Env) map[string]func(any) error {
	return map[string]func(any) error{
		QuotaFlag: func(v any) error {
			_, _, _, err := parseInForce(v, env)
			return err
		},
		WarmPoolFlag: func(v any) error {
			_, err := ParsePoolTargets(v)
			return err
		},
	}
}

// FileProvider is an OpenFeature provider that serves the flags of a file in flagd's
// flag-definition format, static defaultVariant only:
//
//	{"flags": {"<key>": {"state": "ENABLED", "variants": {"on": ...}, "defaultVariant": "on"}}}
//
// A DISABLED flag is reported as not found, so the caller's default applies. Between
// Init and Shutdown (which the OpenFeature API calls when the provider is set and
// replaced) it polls the file: it reads it through any symlink and compares a content
// hash, which sees an atomic rename and a Kubernetes ConfigMap update (the ..data
// symlink swap) alike without inotify. A new good file replaces the flags atomically
// and emits PROVIDER_CONFIGURATION_CHANGED naming the changed flags; a bad or missing
// one is logged, counted, and the last good flags stay.
//
// Object values are shared by every evaluation (which is what lets the Resolver cache
// its parsed quotas by value identity): callers must not modify them.
type FileProvider struct {
	path       string
	interval   time.Duration
	log        *slog.Logger
	validators map[string]func(any) error
	onReload   func(ReloadResult)

	file   *reload.File[map[string]*flag]
	events chan openfeature.Event
	// version counts the flag sets served: it moves on after each new set is in service.
	version atomic.Uint64
	// prepare is Prepare's function; nil when none.
	prepare atomic.Pointer[func(key string, value any)]

	reloadMu sync.Mutex // serializes Reload's check and its report

	runMu sync.Mutex // guards stop and done
	stop  chan struct{}
	done  chan struct{}
}

var (
	_ openfeature.FeatureProvider = (*FileProvider)(nil)
	_ openfeature.StateHandler    = (*FileProvider)(nil)
	_ openfeature.EventHandler    = (*FileProvider)(nil)
)

// NewFileProvider loads the file once and returns the provider, not yet polling. An
// error here (the file is missing, invalid, has targeting rules, or fails a validator)
// is a configuration error: there are no last good flags to keep. Errors from the file
// name the flag (*FlagError) and wrap ErrTargeting or ErrMalformed where they apply.
func NewFileProvider(opts FileProviderOptions) (*FileProvider, error) {
	if opts.Path == "" {
		return nil, errors.New("flags file: no path given")
	}
	if opts.PollInterval <= 0 {
		return nil, fmt.Errorf("flags file: PollInterval must be positive, got %s", opts.PollInterval)
	}
	p := &FileProvider{
		path:       opts.Path,
		interval:   opts.PollInterval,
		log:        opts.Logger,
		validators: opts.Validators,
		onReload:   opts.OnReload,
		// Buffered so that a reload never waits on the API's listener; see emit.
		events: make(chan openfeature.Event, 16),
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.validators == nil {
		p.validators = DefaultValidators(opts.Env)
	}
	var err error
	p.file, err = reload.Open(reload.Options[map[string]*flag]{
		Path: p.path, What: "flags file", Metric: "space_flags", Registerer: opts.Registerer, Logger: p.log,
		Parse: func(data []byte) (map[string]*flag, error) {
			fs, err := parseFlagsFile(data, p.validators, func(msg string) { p.log.Warn("flags file: "+msg, "path", p.path) })
			if err == nil {
				p.prepareAll(fs)
			}
			return fs, err
		},
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (p *FileProvider) flags() map[string]*flag {
	f, _ := p.file.Current()
	return f
}

// Prepare has fn given the value each enabled flag of every new flags file will serve,
// on the reload's goroutine, once the file has passed every check and before it is
// put in service: Version, OnReload and the configuration-changed event all come after
// fn has returned. It is for Resolver.Prepare, so that a new quota flag is parsed
// before any request meets it and a reload's signal means its limits are in service.
// fn must not block for long (the next poll waits for it) nor call Reload. A later
// call replaces fn; nil removes it. A file loaded before Prepare is called (the first,
// by NewFileProvider) is not given to it.
func (p *FileProvider) Prepare(fn func(key string, value any)) {
	if fn == nil {
		p.prepare.Store(nil)
		return
	}
	p.prepare.Store(&fn)
}

// prepareAll gives Prepare's function the value of every enabled flag of fs, a set of
// flags about to be put in service.
func (p *FileProvider) prepareAll(fs map[string]*flag) {
	fn := p.prepare.Load()
	if fn == nil {
		return
	}
	for key, f := range fs {
		if f.enabled && f.variant != "" {
			(*fn)(key, f.value)
		}
	}
}

// Version is the version of the flags in service: it changes once a reload has put a
// new set of flags in service, never before, and the provider's answers depend on
// nothing else (no targeting rules). ResolverOptions.Version takes it.
func (p *FileProvider) Version() uint64 { return p.version.Load() }

// Path is the file the provider reads.
func (p *FileProvider) Path() string { return p.path }

// Hash is the hex SHA-256 of the file content in service.
func (p *FileProvider) Hash() string {
	_, h := p.file.Current()
	return h
}

// Reload checks the file now, as a poll does, and returns what it found. Polls and
// Reload calls are serialized. It is for a SIGHUP handler and for tests.
func (p *FileProvider) Reload() ReloadResult {
	p.reloadMu.Lock()
	res := p.check()
	p.reloadMu.Unlock()
	if !res.Unchanged && p.onReload != nil {
		p.onReload(res)
	}
	return res
}

// check reads the file and swaps in its flags when they are new and good, emitting a
// configuration-changed event naming the flags that changed. The caller holds
// reloadMu.
func (p *FileProvider) check() ReloadResult {
	res, prev, next := p.file.Check()
	out := ReloadResult{Unchanged: res.Unchanged, Err: res.Err, Hash: res.Hash}
	if !res.Swapped {
		return out
	}
	p.version.Add(1)
	out.Changed = changedFlags(prev, next)
	p.log.Info("flags file reloaded", "path", p.path, "hash", short(res.Hash), "changed", out.Changed)
	if len(out.Changed) > 0 {
		p.emit(openfeature.Event{
			ProviderName: ProviderName,
			EventType:    openfeature.ProviderConfigChange,
			ProviderEventDetails: openfeature.ProviderEventDetails{
				Message:     "flags file reloaded",
				FlagChanges: out.Changed,
			},
		})
	}
	return out
}

// emit hands an event to the OpenFeature API without ever blocking a reload: the API
// drains the channel as long as the provider is registered, and an event that finds the
// buffer full (nobody listening) is dropped with a warning. Flags are read per
// evaluation, so a dropped event delays nothing but a handler.
func (p *FileProvider) emit(ev openfeature.Event) {
	select {
	case p.events <- ev:
	default:
		p.log.Warn("flags file: event dropped, nobody is listening", "event", string(ev.EventType))
	}
}

func short(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}

// Init starts polling. The OpenFeature API calls it when the provider is set; calling
// it again while polling does nothing.
func (p *FileProvider) Init(openfeature.EvaluationContext) error {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	if p.stop != nil {
		return nil
	}
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	go p.poll(p.stop, p.done)
	return nil
}

// Shutdown stops polling and waits for a reload in progress. The flags stay readable.
// It is safe to call more than once; Init starts polling again.
func (p *FileProvider) Shutdown() {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	if p.stop == nil {
		return
	}
	close(p.stop)
	<-p.done
	p.stop, p.done = nil, nil
}

func (p *FileProvider) poll(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	ticker := time.NewTicker(p.interval)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
			p.Reload()
		}
	}
}

// EventChannel is where the provider emits PROVIDER_CONFIGURATION_CHANGED.
func (p *FileProvider) EventChannel() <-chan openfeature.Event { return p.events }

// Metadata names the provider.
func (p *FileProvider) Metadata() openfeature.Metadata {
	return openfeature.Metadata{Name: ProviderName}
}

// Hooks returns none.
func (p *FileProvider) Hooks() []openfeature.Hook { return nil }

// lookup returns the flag's served value, or the resolution detail of why there is none.
func (p *FileProvider) lookup(key string) (*flag, openfeature.ProviderResolutionDetail, bool) {
	f, ok := p.flags()[key]
	if !ok {
		return nil, openfeature.ProviderResolutionDetail{
			ResolutionError: openfeature.NewFlagNotFoundResolutionError("flag " + key + " is not in the flags file"),
			Reason:          openfeature.ErrorReason,
		}, false
	}
	if !f.enabled {
		return nil, openfeature.ProviderResolutionDetail{
			ResolutionError: openfeature.NewFlagNotFoundResolutionError("flag " + key + " is disabled"),
			Reason:          openfeature.DisabledReason,
		}, false
	}
	return f, openfeature.ProviderResolutionDetail{
		Reason:       openfeature.StaticReason,
		Variant:      f.variant,
		FlagMetadata: f.metadata,
	}, true
}

func typeMismatch(key, want string, got any) openfeature.ProviderResolutionDetail {
	return openfeature.ProviderResolutionDetail{
		ResolutionError: openfeature.NewTypeMismatchResolutionError(fmt.Sprintf("flag %s is %s, not %s", key, typeName(got), want)),
		Reason:          openfeature.ErrorReason,
	}
}

// evaluate serves flag key as a T: the caller's default with the lookup's detail when
// the flag is absent or disabled, a type mismatch when conv refuses its value.
func evaluate[T any](p *FileProvider, key string, def T, want string, conv func(any) (T, bool)) openfeature.GenericResolutionDetail[T] {
	f, detail, ok := p.lookup(key)
	if !ok {
		return openfeature.GenericResolutionDetail[T]{Value: def, ProviderResolutionDetail: detail}
	}
	if f.variant == "" {
		// No defaultVariant: flagd's "code default", the caller's own.
		detail.Reason = openfeature.DefaultReason
		return openfeature.GenericResolutionDetail[T]{Value: def, ProviderResolutionDetail: detail}
	}
	v, ok := conv(f.value)
	if !ok {
		return openfeature.GenericResolutionDetail[T]{Value: def, ProviderResolutionDetail: typeMismatch(key, want, f.value)}
	}
	return openfeature.GenericResolutionDetail[T]{Value: v, ProviderResolutionDetail: detail}
}

func as[T any](v any) (T, bool) {
	t, ok := v.(T)
	return t, ok
}

// BooleanEvaluation serves a boolean flag.
func (p *FileProvider) BooleanEvaluation(_ context.Context, key string, def bool, _ openfeature.FlattenedContext) openfeature.BoolResolutionDetail {
	return evaluate(p, key, def, "a boolean", as[bool])
}

// StringEvaluation serves a string flag.
func (p *FileProvider) StringEvaluation(_ context.Context, key string, def string, _ openfeature.FlattenedContext) openfeature.StringResolutionDetail {
	return evaluate(p, key, def, "a string", as[string])
}

// FloatEvaluation serves a number flag.
func (p *FileProvider) FloatEvaluation(_ context.Context, key string, def float64, _ openfeature.FlattenedContext) openfeature.FloatResolutionDetail {
	return evaluate(p, key, def, "a number", as[float64])
}

// IntEvaluation serves an integer flag: a JSON number without a fraction that an int64
// holds exactly.
func (p *FileProvider) IntEvaluation(_ context.Context, key string, def int64, _ openfeature.FlattenedContext) openfeature.IntResolutionDetail {
	return evaluate(p, key, def, "an integer", func(v any) (int64, bool) {
		f, ok := v.(float64)
		if !ok || f != math.Trunc(f) || f > maxExactFloat || f < -maxExactFloat {
			return 0, false
		}
		return int64(f), true
	})
}

// ObjectEvaluation serves an object (or array) flag. The value is shared: do not modify
// it.
func (p *FileProvider) ObjectEvaluation(_ context.Context, key string, def any, _ openfeature.FlattenedContext) openfeature.InterfaceResolutionDetail {
	return evaluate(p, key, def, "an object", func(v any) (any, bool) {
		switch v.(type) {
		case map[string]any, []any:
			return v, true
		}
		return nil, false
	})
}
