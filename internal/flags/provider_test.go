package flags

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-feature/go-sdk/openfeature"
)

// goodQuota and otherQuota are two valid quota flag values told apart by acme's rate.
const (
	goodQuota  = `{"clients": {"acme": {}}, "rate": {"acme": {"refill_rps": 10, "burst": 40}}}`
	otherQuota = `{"clients": {"acme": {}}, "rate": {"acme": {"refill_rps": 20, "burst": 80}}}`
)

// acmeBurst returns acme's burst as the resolver sees it now.
func (f *fixture) acmeBurst() int64 {
	f.t.Helper()
	l := f.resolver.Resolve(context.Background(), "acme")
	if l.ClientRate == nil {
		f.t.Fatalf("acme has no client rate: %+v", l)
	}
	return l.ClientRate.Burst
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "flags.json")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFileProviderLoad(t *testing.T) {
	t.Parallel()

	refused := map[string]struct {
		file    string
		flag    string
		wantErr error
	}{
		"a flag with targeting rules is refused, naming the flag": {
			file: `{"flags": {"space-api-warm-pool": {"state": "ENABLED", "variants": {"a": {}, "b": {}}, "defaultVariant": "a",
			        "targeting": {"if": [{"==": [{"var": "client"}, "acme"]}, "b", "a"]}}}}`,
			flag: WarmPoolFlag, wantErr: ErrTargeting,
		},
		"a malformed quota flag is refused, naming the flag": {
			file: quotaFile(`"not an object"`), flag: QuotaFlag, wantErr: ErrMalformed,
		},
		"a malformed quota flag in a variant not served is refused too": {
			file: `{"flags": {"space-api-client-concurrency-quotas": {"state": "ENABLED", "variants": {"on": {}, "off": 5}, "defaultVariant": "on"}}}`,
			flag: QuotaFlag, wantErr: ErrMalformed,
		},
		"a malformed pool flag is refused, naming the flag": {
			file: flagsFile(map[string]string{WarmPoolFlag: `{"shapes": [{"template": "t"}]}`}), flag: WarmPoolFlag, wantErr: ErrMalformed,
		},
		"a defaultVariant that is not a variant is refused": {
			file: `{"flags": {"f": {"state": "ENABLED", "variants": {"on": true}, "defaultVariant": "of"}}}`, flag: "f",
		},
		"an unknown state is refused": {
			file: `{"flags": {"f": {"state": "enabled", "variants": {"on": true}, "defaultVariant": "on"}}}`, flag: "f",
		},
		"a known flag field in another case (a typo flagd would ignore) is refused": {
			file: `{"flags": {"f": {"state": "ENABLED", "variants": {"on": true}, "defaultVariant": "on", "defaultvariant": "on"}}}`, flag: "f",
		},
		"no variants is refused": {
			file: `{"flags": {"f": {"state": "ENABLED", "variants": {}, "defaultVariant": "on"}}}`, flag: "f",
		},
	}
	for name, tc := range refused {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, tc.file)
			_, err := NewFileProvider(FileProviderOptions{PollInterval: testPoll, Path: path, Logger: discardLogger()})
			var fe *FlagError
			if !errors.As(err, &fe) || fe.Flag != tc.flag {
				t.Fatalf("err = %v, want a *FlagError naming %q", err, tc.flag)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.flag) {
				t.Errorf("err = %q, want it to name the file and the flag", err)
			}
		})
	}

	for name, file := range map[string]string{
		"a file without flags is refused":                    `{"$schema": "https://example.invalid/flags.json"}`,
		"a known top-level field in another case is refused": `{"flags": {}, "Flags": {}}`,
		"invalid JSON is refused":                            `{"flags": {`,
		"an empty file is refused":                           ``,
		"data after the JSON value is refused":               `{"flags": {}} {}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := NewFileProvider(FileProviderOptions{PollInterval: testPoll, Path: writeFile(t, file), Logger: discardLogger()}); err == nil {
				t.Fatal("loaded")
			}
		})
	}

	t.Run("a missing file is an error naming the path", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "absent.json")
		_, err := NewFileProvider(FileProviderOptions{PollInterval: testPoll, Path: path, Logger: discardLogger()})
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("an empty or null targeting is not a rule", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, `{"$schema": "x", "metadata": {"version": "1"}, "flags": {
			"a": {"state": "ENABLED", "variants": {"on": true}, "defaultVariant": "on", "targeting": {}},
			"b": {"state": "ENABLED", "variants": {"on": true}, "defaultVariant": "on", "targeting": null}}}`)
		if _, err := NewFileProvider(FileProviderOptions{PollInterval: testPoll, Path: path, Logger: discardLogger()}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("flags are served by type, and a disabled or absent flag gives the default", func(t *testing.T) {
		t.Parallel()
		f := setup(t, `{"flags": {
			"bool":   {"state": "ENABLED", "variants": {"on": true, "off": false}, "defaultVariant": "on", "metadata": {"owner": "sre"}},
			"string": {"state": "ENABLED", "variants": {"v": "blue"}, "defaultVariant": "v"},
			"int":    {"state": "ENABLED", "variants": {"v": 42}, "defaultVariant": "v"},
			"float":  {"state": "ENABLED", "variants": {"v": 0.25}, "defaultVariant": "v"},
			"object": {"state": "ENABLED", "variants": {"v": {"k": 1}}, "defaultVariant": "v"},
			"off":    {"state": "DISABLED", "variants": {"v": true}, "defaultVariant": "v"}}}`)
		ctx := context.Background()
		c, ec := f.client, openfeature.EvaluationContext{}
		if d, err := c.BooleanValueDetails(ctx, "bool", false, ec); err != nil || !d.Value || d.Variant != "on" || d.Reason != openfeature.StaticReason || d.FlagMetadata["owner"] != "sre" {
			t.Errorf("bool: %+v, %v", d, err)
		}
		if v, err := c.StringValue(ctx, "string", "", ec); err != nil || v != "blue" {
			t.Errorf("string: %q, %v", v, err)
		}
		if v, err := c.IntValue(ctx, "int", 0, ec); err != nil || v != 42 {
			t.Errorf("int: %d, %v", v, err)
		}
		if v, err := c.FloatValue(ctx, "float", 0, ec); err != nil || v != 0.25 {
			t.Errorf("float: %g, %v", v, err)
		}
		if v, err := c.ObjectValue(ctx, "object", nil, ec); err != nil || v.(map[string]any)["k"] != 1.0 {
			t.Errorf("object: %v, %v", v, err)
		}
		if d, err := c.BooleanValueDetails(ctx, "off", false, ec); err == nil || d.Value || d.ErrorCode != openfeature.FlagNotFoundCode {
			t.Errorf("disabled: %+v, %v", d, err)
		}
		if d, err := c.BooleanValueDetails(ctx, "absent", true, ec); err == nil || !d.Value || d.ErrorCode != openfeature.FlagNotFoundCode {
			t.Errorf("absent: %+v, %v", d, err)
		}
		if d, err := c.IntValueDetails(ctx, "float", 7, ec); err == nil || d.Value != 7 || d.ErrorCode != openfeature.TypeMismatchCode {
			t.Errorf("a fractional number as an int: %+v, %v", d, err)
		}
		if d, err := c.ObjectValueDetails(ctx, "bool", "def", ec); err == nil || d.Value != "def" || d.ErrorCode != openfeature.TypeMismatchCode {
			t.Errorf("a boolean as an object: %+v, %v", d, err)
		}
	})
}

func TestFileProviderReload(t *testing.T) {
	t.Parallel()

	t.Run("an atomic rename is picked up", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota))
		if got := f.acmeBurst(); got != 40 {
			t.Fatalf("burst = %d before the change, want 40", got)
		}
		content := quotaFile(otherQuota)
		f.writeAtomic(content)
		if r := f.waitLoaded(content); !slices.Equal(r.Changed, []string{QuotaFlag}) {
			t.Errorf("changed = %v, want [%s]", r.Changed, QuotaFlag)
		}
		if got := f.acmeBurst(); got != 80 {
			t.Errorf("burst = %d after the change, want 80", got)
		}
	})

	t.Run("a ConfigMap symlink swap is picked up", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota), asConfigMap())
		if target, err := os.Readlink(f.path); err != nil || target != filepath.Join("..data", "flags.json") {
			t.Fatalf("flags.json is not the ConfigMap symlink: %q, %v", target, err)
		}
		for i, quota := range []string{otherQuota, goodQuota, otherQuota} {
			content := quotaFile(quota)
			f.writeConfigMap(content)
			f.waitLoaded(content)
			want := map[string]int64{goodQuota: 40, otherQuota: 80}[quota]
			if got := f.acmeBurst(); got != want {
				t.Errorf("update %d: burst = %d, want %d", i+1, got, want)
			}
		}
		if entries, _ := filepath.Glob(filepath.Join(f.dir, "..2026_*")); len(entries) != 1 {
			t.Errorf("data directories = %v, want only the current one", entries)
		}
	})

	t.Run("invalid JSON keeps the last good flags", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota))
		f.writeAtomic(`{"flags": {"space-api-client-con`)
		r := f.waitFailed()
		if r.Hash != hashOf(quotaFile(goodQuota)) {
			t.Errorf("hash in service = %s, want the last good file's", r.Hash)
		}
		if got := f.acmeBurst(); got != 40 {
			t.Errorf("burst = %d, want the last good 40", got)
		}
		if n := f.logs.count(slog.LevelError, "flags file reload failed; keeping the last good one", nil); n != 1 {
			t.Errorf("%d error logs, want 1 (not one per poll)", n)
		}
		content := quotaFile(otherQuota)
		f.writeAtomic(content)
		f.waitLoaded(content)
		if got := f.acmeBurst(); got != 80 {
			t.Errorf("burst = %d after a good file, want 80", got)
		}
	})

	t.Run("a deleted file keeps the last good flags and recovers when it returns", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota))
		if err := os.Remove(f.path); err != nil {
			t.Fatal(err)
		}
		if r := f.waitFailed(); !errors.Is(r.Err, fs.ErrNotExist) {
			t.Errorf("err = %v, want not exist", r.Err)
		}
		if got := f.acmeBurst(); got != 40 {
			t.Errorf("burst = %d while the file is gone, want the last good 40", got)
		}
		// The same good content back is a recovery without a change.
		f.writeAtomic(quotaFile(goodQuota))
		if r := f.waitLoaded(quotaFile(goodQuota)); len(r.Changed) != 0 {
			t.Errorf("changed = %v, want none", r.Changed)
		}
		if err := os.Remove(f.path); err != nil {
			t.Fatal(err)
		}
		f.waitFailed()
		content := quotaFile(otherQuota)
		f.writeAtomic(content)
		f.waitLoaded(content)
		if got := f.acmeBurst(); got != 80 {
			t.Errorf("burst = %d after the file returned, want 80", got)
		}
	})

	t.Run("targeting rules in a new file are refused and the last good flags stay", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota))
		f.writeAtomic(`{"flags": {"space-api-client-concurrency-quotas": {"state": "ENABLED",
			"variants": {"a": {}, "b": {}}, "defaultVariant": "a", "targeting": {"fractional": [["a", 50], ["b", 50]]}}}}`)
		r := f.waitFailed()
		var fe *FlagError
		if !errors.Is(r.Err, ErrTargeting) || !errors.As(r.Err, &fe) || fe.Flag != QuotaFlag {
			t.Errorf("err = %v, want ErrTargeting naming %s", r.Err, QuotaFlag)
		}
		if got := f.acmeBurst(); got != 40 {
			t.Errorf("burst = %d, want the last good 40", got)
		}
	})

	t.Run("a quota flag malformed as a whole fails the reload and the last good flags stay", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota))
		f.writeAtomic(quotaFile(`{"clients": ["acme"]}`))
		if r := f.waitFailed(); !errors.Is(r.Err, ErrMalformed) {
			t.Errorf("err = %v, want ErrMalformed", r.Err)
		}
		if got := f.acmeBurst(); got != 40 {
			t.Errorf("burst = %d, want the last good 40", got)
		}
	})

	t.Run("a new file's served values are prepared before the file is in service, a refused file's never", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota), unprepared())
		type prepared struct {
			key     string
			value   any
			version uint64 // the provider's version as the value was prepared
		}
		var mu sync.Mutex
		var got []prepared
		f.provider.Prepare(func(key string, value any) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, prepared{key, value, f.provider.Version()})
		})
		before := f.provider.Version()
		content := `{"flags": {
			"` + QuotaFlag + `": {"state": "ENABLED", "variants": {"on": ` + otherQuota + `}, "defaultVariant": "on"},
			"off": {"state": "DISABLED", "variants": {"on": true}, "defaultVariant": "on"},
			"bare": {"state": "ENABLED", "variants": {"on": true}}}}`
		f.writeAtomic(content)
		f.waitLoaded(content)
		mu.Lock()
		if len(got) != 1 || got[0].key != QuotaFlag || got[0].version != before {
			t.Fatalf("prepared %+v, want the quota flag alone (not the disabled flag, nor one serving no value), at version %d", got, before)
		}
		served, err := f.client.ObjectValue(context.Background(), QuotaFlag, nil, openfeature.EvaluationContext{})
		if err != nil || identity(served) != identity(got[0].value) {
			t.Errorf("prepared a value other than the one served (%v)", err)
		}
		mu.Unlock()
		if after := f.provider.Version(); after != before+1 {
			t.Errorf("version %d after the reload, want %d", after, before+1)
		}

		f.writeAtomic(quotaFile(`{"clients": ["acme"]}`))
		f.waitFailed()
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 1 {
			t.Errorf("a refused file was prepared: %+v", got[1:])
		}
	})

	t.Run("a malformed rate entry does not fail the reload", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota))
		content := quotaFile(`{"clients": {"acme": {}}, "rate": {"acme": {"refill_rps": -1, "burst": 1}}}`)
		f.writeAtomic(content)
		f.waitLoaded(content)
	})

	t.Run("a changed flag emits the configuration-changed event naming it", func(t *testing.T) {
		t.Parallel()
		f := setup(t, flagsFile(map[string]string{QuotaFlag: goodQuota, WarmPoolFlag: `{}`}))
		events := make(chan openfeature.EventDetails, 16)
		handler := func(d openfeature.EventDetails) { events <- d }
		f.api.AddHandler(openfeature.ProviderConfigChange, &handler)
		f.writeAtomic(flagsFile(map[string]string{QuotaFlag: otherQuota, WarmPoolFlag: `{}`}))
		select {
		case d := <-events:
			if d.ProviderName != ProviderName || !slices.Equal(d.FlagChanges, []string{QuotaFlag}) {
				t.Errorf("event = %+v, want %s changed by %s", d, QuotaFlag, ProviderName)
			}
		case <-time.After(waitTimeout):
			t.Fatal("no configuration-changed event")
		}
	})

	t.Run("a reformatted file reloads without an event", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota))
		content := quotaFile(goodQuota) + "\n\n"
		f.writeAtomic(content)
		// An event is emitted exactly when Changed is not empty.
		if r := f.waitLoaded(content); len(r.Changed) != 0 {
			t.Errorf("changed = %v, want none", r.Changed)
		}
	})

	t.Run("reloads are counted by result", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota))
		f.writeAtomic(`not json`)
		f.waitFailed()
		if err := os.Remove(f.path); err != nil {
			t.Fatal(err)
		}
		f.waitFailed()
		if got := f.counter("space_flags_last_reload_successful", nil); got != 0 {
			t.Errorf("last_reload_successful = %g after a failure, want 0", got)
		}
		content := quotaFile(otherQuota)
		f.writeAtomic(content)
		f.waitLoaded(content)
		if got := f.counter("space_flags_reloads_total", map[string]string{"result": "error"}); got != 2 {
			t.Errorf(`reloads_total{result="error"} = %g, want 2`, got)
		}
		if got := f.counter("space_flags_reloads_total", map[string]string{"result": "success"}); got != 1 {
			t.Errorf(`reloads_total{result="success"} = %g, want 1`, got)
		}
		if got := f.counter("space_flags_last_reload_successful", nil); got != 1 {
			t.Errorf("last_reload_successful = %g, want 1", got)
		}
	})

	t.Run("an unchanged file is checked without being reported", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota), withPoll(time.Hour))
		if r := f.provider.Reload(); !r.Unchanged || r.Err != nil {
			t.Errorf("Reload() = %+v, want unchanged", r)
		}
		if err := os.Remove(f.path); err != nil {
			t.Fatal(err)
		}
		if r := f.provider.Reload(); r.Unchanged || r.Err == nil {
			t.Errorf("first Reload() of a missing file = %+v, want an error", r)
		}
		if r := f.provider.Reload(); !r.Unchanged {
			t.Errorf("second Reload() of a missing file = %+v, want unchanged (reported once)", r)
		}
		if got := f.counter("space_flags_reloads_total", map[string]string{"result": "error"}); got != 1 {
			t.Errorf(`reloads_total{result="error"} = %g, want 1`, got)
		}
	})

	t.Run("Shutdown stops polling, is idempotent, and Init starts it again", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota))
		f.provider.Shutdown()
		f.provider.Shutdown()
		content := quotaFile(otherQuota)
		f.writeAtomic(content)
		select {
		case r := <-f.reloads:
			t.Fatalf("reload %+v after Shutdown", r)
		case <-time.After(10 * testPoll):
		}
		if got := f.acmeBurst(); got != 40 {
			t.Errorf("burst = %d, want the flags of before Shutdown", got)
		}
		if err := f.provider.Init(openfeature.EvaluationContext{}); err != nil {
			t.Fatal(err)
		}
		f.waitLoaded(content)
	})
}

func TestNewFileProviderRefusesAMissingPollInterval(t *testing.T) {
	t.Parallel()
	path := filepath.Join("..", "..", "deploy", "demo", "flags.json")
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := NewFileProvider(FileProviderOptions{Path: path, PollInterval: d, Logger: discardLogger()}); err == nil || !strings.Contains(err.Error(), "PollInterval") {
			t.Errorf("PollInterval %s: %v, want an error naming it", d, err)
		}
	}
}
