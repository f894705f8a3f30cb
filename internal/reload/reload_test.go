package reload_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/reload"
)

// waitTimeout bounds every wait on a signal; it is a failure bound, not a sleep.
const waitTimeout = 10 * time.Second

func TestOpen(t *testing.T) {
	t.Parallel()

	t.Run("a file that cannot be read is an error naming it", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t)
		_, err := reload.Open(b.options())
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), what) || !strings.Contains(err.Error(), b.path) {
			t.Fatalf("Open of a missing file: err = %v, want ErrNotExist naming %q and %s", err, what, b.path)
		}
	})

	t.Run("a file that does not parse is an error naming it and why", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t)
		b.writeAtomic(`{"gen": -1}`)
		_, err := reload.Open(b.options())
		if err == nil || !strings.Contains(err.Error(), what) || !strings.Contains(err.Error(), b.path) || !strings.Contains(err.Error(), "gen must be >= 0") {
			t.Fatalf("Open of a bad file: err = %v, want the parse error naming %q and %s", err, what, b.path)
		}
	})

	t.Run("the first content is in service under its SHA-256, marked good", func(t *testing.T) {
		t.Parallel()
		b := setup(t, render(1))
		c, h := b.file.Current()
		if c.Gen != 1 || h != hashOf(render(1)) {
			t.Fatalf("Current = gen %d, hash %s; want gen 1, %s", c.Gen, h, hashOf(render(1)))
		}
		if got := b.metric(stem + "_last_reload_successful"); got != 1 {
			t.Errorf("last_reload_successful = %v, want 1", got)
		}
		if at := b.metric(stem + "_last_reload_success_timestamp_seconds"); time.Since(time.Unix(int64(at), 0)) > time.Hour {
			t.Errorf("last_reload_success_timestamp_seconds = %v, want about now", at)
		}
		if s, f := b.counts(); s != 0 || f != 0 {
			t.Errorf("reloads_total = %v success, %v error; the first read is not a reload", s, f)
		}
	})

	t.Run("two files on one registry under one stem share their series", func(t *testing.T) {
		t.Parallel()
		a := setup(t, render(1))
		other := newBundle(t)
		other.reg = a.reg
		other.writeAtomic(render(1))
		other.open()
		if err := os.Remove(other.path); err != nil {
			t.Fatal(err)
		}
		other.check("of the removed file", func(r reload.Result) bool { return r.Err != nil })
		if _, f := a.counts(); f != 1 {
			t.Fatalf("reloads_total{result=\"error\"} = %v after the other file failed, want 1", f)
		}
	})
}

func TestCheck(t *testing.T) {
	t.Parallel()

	t.Run("an unchanged file is nothing: no swap, no count, no log", func(t *testing.T) {
		t.Parallel()
		b := setup(t, render(1))
		b.check("of the same file", func(r reload.Result) bool {
			return r.Unchanged && !r.Swapped && r.Err == nil && r.Hash == hashOf(render(1))
		})
		if s, f := b.counts(); s != 0 || f != 0 {
			t.Errorf("reloads_total = %v success, %v error, want none", s, f)
		}
		if l := b.logs.lines(); len(l) != 0 {
			t.Errorf("logged %q", l)
		}
	})

	t.Run("the same content renamed over the file is unchanged: the content counts, not the inode", func(t *testing.T) {
		t.Parallel()
		b := setup(t, render(1))
		b.writeAtomic(render(1))
		b.check("of the rewritten file", func(r reload.Result) bool { return r.Unchanged })
		if s, _ := b.counts(); s != 0 {
			t.Errorf("reloads_total{result=\"success\"} = %v, want 0", s)
		}
	})

	t.Run("a new content renamed over the file is swapped in", func(t *testing.T) {
		t.Parallel()
		b := setup(t, render(1))
		b.writeAtomic(render(2))
		_, prev, next := b.check("after the rename", func(r reload.Result) bool {
			return r.Swapped && r.Err == nil && r.Hash == hashOf(render(2))
		})
		if prev.Gen != 1 || next.Gen != 2 {
			t.Errorf("prev, next = gen %d, gen %d; want 1, 2", prev.Gen, next.Gen)
		}
		if g := b.gen(); g != 2 {
			t.Errorf("gen %d in service, want 2", g)
		}
		if s, f := b.counts(); s != 1 || f != 0 {
			t.Errorf("reloads_total = %v success, %v error; want 1, 0", s, f)
		}
		b.check("once more", func(r reload.Result) bool { return r.Unchanged && r.Hash == hashOf(render(2)) })
	})

	t.Run("a ConfigMap's ..data symlink swap is seen through the file's symlink", func(t *testing.T) {
		t.Parallel()
		b := setupConfigMap(t, render(1))
		if g := b.gen(); g != 1 {
			t.Fatalf("gen %d in service, want 1", g)
		}
		b.writeConfigMap(render(2))
		b.check("after the swap", func(r reload.Result) bool { return r.Swapped && r.Hash == hashOf(render(2)) })
		b.writeConfigMap(render(3))
		b.check("after a second swap", func(r reload.Result) bool { return r.Swapped && r.Hash == hashOf(render(3)) })
		if g := b.gen(); g != 3 {
			t.Fatalf("gen %d in service, want 3", g)
		}
	})

	t.Run("a bad content keeps the last good one, counted once, until a good one comes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, render(1))
		okAt := b.metric(stem + "_last_reload_success_timestamp_seconds")

		b.writeAtomic(`{"gen": 2, "items": [2`)
		res, prev, next := b.check("of a truncated file", func(r reload.Result) bool {
			return r.Err != nil && !r.Swapped && !r.Unchanged && r.Hash == hashOf(render(1))
		})
		if msg := res.Err.Error(); !strings.Contains(msg, what) || !strings.Contains(msg, b.path) {
			t.Errorf("error %q does not name %q and %s", msg, what, b.path)
		}
		if prev.Items != nil || next.Items != nil {
			t.Errorf("a failed check returned prev %+v, next %+v; want zero values", prev, next)
		}
		if g := b.gen(); g != 1 {
			t.Fatalf("gen %d in service after a bad file, want the last good 1", g)
		}
		if s, f := b.counts(); s != 0 || f != 1 {
			t.Errorf("reloads_total = %v success, %v error; want 0, 1", s, f)
		}
		if got := b.metric(stem + "_last_reload_successful"); got != 0 {
			t.Errorf("last_reload_successful = %v after a bad file, want 0", got)
		}
		if got := b.metric(stem + "_last_reload_success_timestamp_seconds"); got != okAt {
			t.Errorf("last_reload_success_timestamp_seconds moved from %v to %v on a failure", okAt, got)
		}
		if l := b.logs.lines(); len(l) != 1 || !strings.HasPrefix(l[0], "ERROR "+what+" reload failed; keeping the last good one") ||
			!strings.Contains(l[0], "hash_in_service="+hashOf(render(1))[:12]) {
			t.Errorf("logged %q, want one error naming the hash in service", l)
		}

		// The same bad content again is not a new failure.
		b.check("of the same bad file", func(r reload.Result) bool { return r.Unchanged })
		if _, f := b.counts(); f != 1 {
			t.Errorf("reloads_total{result=\"error\"} = %v after the same bad file twice, want 1", f)
		}

		// Another bad content is: one that decodes and fails validation.
		b.writeAtomic(`{"gen": -2}`)
		b.check("of an invalid file", func(r reload.Result) bool {
			return r.Err != nil && strings.Contains(r.Err.Error(), "gen must be >= 0")
		})
		if _, f := b.counts(); f != 2 {
			t.Errorf("reloads_total{result=\"error\"} = %v, want 2", f)
		}

		b.writeAtomic(render(2))
		_, prev, next = b.check("of a good file", func(r reload.Result) bool { return r.Swapped && r.Err == nil })
		if prev.Gen != 1 || next.Gen != 2 {
			t.Errorf("prev, next = gen %d, gen %d; want 1, 2", prev.Gen, next.Gen)
		}
		if got := b.metric(stem + "_last_reload_successful"); got != 1 {
			t.Errorf("last_reload_successful = %v after a good file, want 1 again", got)
		}
		if got := b.metric(stem + "_last_reload_success_timestamp_seconds"); got < okAt {
			t.Errorf("last_reload_success_timestamp_seconds went back from %v to %v", okAt, got)
		}
		if s, _ := b.counts(); s != 1 {
			t.Errorf("reloads_total{result=\"success\"} = %v, want 1", s)
		}
	})

	t.Run("the good content back after a bad one is a success with nothing swapped", func(t *testing.T) {
		t.Parallel()
		b := setup(t, render(1))
		b.writeAtomic("garbage")
		b.check("of garbage", func(r reload.Result) bool { return r.Err != nil })
		b.writeAtomic(render(1))
		b.check("of the good file again", func(r reload.Result) bool {
			return !r.Swapped && !r.Unchanged && r.Err == nil && r.Hash == hashOf(render(1))
		})
		if s, f := b.counts(); s != 1 || f != 1 {
			t.Errorf("reloads_total = %v success, %v error; want 1, 1", s, f)
		}
		if got := b.metric(stem + "_last_reload_successful"); got != 1 {
			t.Errorf("last_reload_successful = %v, want 1", got)
		}
		if l := b.logs.lines(); len(l) != 2 || !strings.HasPrefix(l[1], "INFO "+what+" readable again; unchanged") {
			t.Errorf("logged %q, want the failure then the recovery", l)
		}
	})

	t.Run("a missing file keeps the last good one and is reported once", func(t *testing.T) {
		t.Parallel()
		b := setup(t, render(1))
		if err := os.Remove(b.path); err != nil {
			t.Fatal(err)
		}
		b.check("of the missing file", func(r reload.Result) bool {
			return errors.Is(r.Err, fs.ErrNotExist) && !r.Unchanged && r.Hash == hashOf(render(1))
		})
		// Still missing: unchanged, though still an error for whoever asks.
		b.check("of the file still missing", func(r reload.Result) bool {
			return r.Unchanged && errors.Is(r.Err, fs.ErrNotExist) && r.Hash == hashOf(render(1))
		})
		if g := b.gen(); g != 1 {
			t.Fatalf("gen %d in service while the file is missing, want 1", g)
		}
		if s, f := b.counts(); s != 0 || f != 1 {
			t.Errorf("reloads_total = %v success, %v error; want 0, 1", s, f)
		}
		if got := b.metric(stem + "_last_reload_successful"); got != 0 {
			t.Errorf("last_reload_successful = %v, want 0", got)
		}
		if l := b.logs.lines(); len(l) != 1 {
			t.Errorf("logged %q, want one line for the missing file", l)
		}

		b.writeAtomic(render(2))
		b.check("of the file back", func(r reload.Result) bool { return r.Swapped })
		if got := b.metric(stem + "_last_reload_successful"); got != 1 {
			t.Errorf("last_reload_successful = %v, want 1", got)
		}
	})

	t.Run("a ConfigMap whose data directory went missing keeps the last good one", func(t *testing.T) {
		t.Parallel()
		b := setupConfigMap(t, render(1))
		if err := os.Remove(filepath.Join(b.dir, "..data")); err != nil {
			t.Fatal(err)
		}
		b.check("through a dangling symlink", func(r reload.Result) bool { return errors.Is(r.Err, fs.ErrNotExist) })
		if g := b.gen(); g != 1 {
			t.Fatalf("gen %d in service, want 1", g)
		}
	})

	t.Run("concurrent checks of one change swap it in once, parsing one at a time", func(t *testing.T) {
		t.Parallel()
		b := setup(t, render(0))
		// Each parse yields for a while, so that checks that were not serialised would
		// be seen parsing together.
		var inflight, most atomic.Int32
		b.onParse = func() {
			n := inflight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			for range 100 {
				runtime.Gosched()
			}
			inflight.Add(-1)
		}
		const rounds, checkers = 10, 16
		for gen := 1; gen <= rounds; gen++ {
			b.writeAtomic(render(gen))
			results := make(chan reload.Result, checkers)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range checkers {
				wg.Go(func() {
					<-start
					res, _, _ := b.file.Check()
					results <- res
				})
			}
			close(start)
			wg.Wait()
			close(results)
			swapped := 0
			for r := range results {
				switch {
				case r.Swapped:
					swapped++
				case !r.Unchanged:
					t.Errorf("gen %d: a checker got %+v, want swapped or unchanged", gen, r)
				}
			}
			if swapped != 1 {
				t.Errorf("gen %d: %d checks swapped, want 1", gen, swapped)
			}
		}
		if s, _ := b.counts(); s != rounds {
			t.Errorf("reloads_total{result=\"success\"} = %v, want %d", s, rounds)
		}
		if m := most.Load(); m != 1 {
			t.Errorf("%d parses ran at once, want checks serialised", m)
		}
	})
}

// Readers never wait for a check and never see a value torn between two contents, nor
// one older than what they saw before.
func TestReadersDuringSwapsSeeOnlyWholeValues(t *testing.T) {
	t.Parallel()
	b := setup(t, render(0))
	const gens = 200
	stop := make(chan struct{})
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			last := 0
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, h := b.file.Current()
				if err := whole(c); err != nil {
					errs <- err
					return
				}
				if h != hashOf(render(c.Gen)) {
					errs <- errors.New("a value served with the hash of another content")
					return
				}
				if c.Gen < last {
					errs <- errors.New("a reader saw an older value after a newer one")
					return
				}
				last = c.Gen
			}
		})
	}
	for gen := 1; gen <= gens; gen++ {
		b.writeAtomic(render(gen))
		if res, _, _ := b.file.Check(); !res.Swapped {
			t.Fatalf("gen %d: check %+v, want swapped", gen, res)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if g := b.gen(); g != gens {
		t.Fatalf("gen %d in service, want %d", g, gens)
	}
}

func TestPoll(t *testing.T) {
	t.Parallel()

	t.Run("polling picks up a change", func(t *testing.T) {
		t.Parallel()
		b := setup(t, render(1))
		results := make(chan reload.Result, 16)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			reload.Poll(ctx, 5*time.Millisecond, func() {
				if res, _, _ := b.file.Check(); !res.Unchanged {
					results <- res
				}
			})
		}()
		b.writeAtomic(render(2))
		select {
		case res := <-results:
			if !res.Swapped || res.Hash != hashOf(render(2)) {
				t.Fatalf("the poll found %+v, want gen 2 swapped in", res)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("no reload within %v", waitTimeout)
		}
		cancel()
		select {
		case <-done:
		case <-time.After(waitTimeout):
			t.Fatal("Poll did not return when its context ended")
		}
	})

	t.Run("polling with an ended context returns without checking", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		checked := false
		reload.Poll(ctx, time.Hour, func() { checked = true })
		if checked {
			t.Fatal("Poll checked after its context ended")
		}
	})

	t.Run("polling ends while it is ticking", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		ticks := make(chan struct{}, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			reload.Poll(ctx, time.Millisecond, func() {
				select {
				case ticks <- struct{}{}:
				default:
				}
			})
		}()
		for range 3 {
			select {
			case <-ticks:
			case <-time.After(waitTimeout):
				t.Fatal("Poll does not check every interval")
			}
		}
		cancel()
		select {
		case <-done:
		case <-time.After(waitTimeout):
			t.Fatal("Poll did not return when its context ended")
		}
	})
}

// A nil Registerer leaves the series unregistered: a File works without a registry.
func TestAFileWorksWithoutARegistry(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	b.writeAtomic(render(1))
	opts := b.options()
	opts.Registerer = nil
	f, err := reload.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	b.writeAtomic(render(2))
	if res, _, _ := f.Check(); !res.Swapped {
		t.Fatalf("check %+v, want swapped", res)
	}
	if fams, _ := b.reg.Gather(); len(fams) != 0 {
		t.Fatalf("a nil Registerer registered %d families on another registry", len(fams))
	}
}
