package coalesce

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/testenv"
)

// bound is how long a test waits for a signal before it fails.
const bound = 10 * time.Second

// store is a versioned value per key whose reads a test can hold on their way.
type store struct {
	mu       sync.Mutex
	version  map[string]int
	reads    map[string]int
	holds    map[string]chan struct{} // a read of the key, once it has read, waits here
	readDone chan string              // each held read's key, once it has read
}

func newStore() *store {
	return &store{version: map[string]int{}, reads: map[string]int{}, holds: map[string]chan struct{}{}, readDone: make(chan string, 100)}
}

func (s *store) write(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.version[key]++
	return s.version[key]
}

// read returns key's version, first waiting on key's hold when one is set.
func (s *store) read(key string) func(context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		s.mu.Lock()
		v := s.version[key]
		s.reads[key]++
		hold := s.holds[key]
		s.mu.Unlock()
		if hold != nil {
			s.readDone <- key
			select {
			case <-hold:
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		return v, nil
	}
}

func (s *store) hold(key string) (release func()) {
	c := make(chan struct{})
	s.mu.Lock()
	s.holds[key] = c
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		if s.holds[key] == c {
			delete(s.holds, key)
		}
		s.mu.Unlock()
		close(c)
	}
}

func (s *store) readsOf(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads[key]
}

type bundle struct {
	reads  *Reads[string, int]
	store  *store
	waited chan struct{} // a value each time a caller starts waiting
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{reads: &Reads[string, int]{}, store: newStore(), waited: make(chan struct{}, 1000)}
	b.reads.OnWait = func() { b.waited <- struct{}{} }
	return b
}

type answer struct {
	v   int
	err error
}

// ask starts a read of key on a goroutine of its own and returns where its answer goes.
func (b *bundle) ask(ctx context.Context, key string) <-chan answer {
	c := make(chan answer, 1)
	go func() {
		v, err := b.reads.Do(ctx, key, b.store.read(key))
		c <- answer{v, err}
	}()
	return c
}

func receive(t *testing.T, c <-chan answer) answer {
	t.Helper()
	select {
	case a := <-c:
		return a
	case <-time.After(bound):
		t.Fatalf("no answer after %v", bound)
		return answer{}
	}
}

func TestReads(t *testing.T) {
	t.Parallel()

	t.Run("a lone read runs at once under its caller's context", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		type ctxKey struct{}
		ctx := context.WithValue(context.Background(), ctxKey{}, "caller")
		var saw any
		v, err := b.reads.Do(ctx, "k", func(ctx context.Context) (int, error) {
			saw = ctx.Value(ctxKey{})
			return 7, nil
		})
		if err != nil || v != 7 {
			t.Fatalf("Do = %d, %v; want 7", v, err)
		}
		if saw != "caller" {
			t.Fatalf("the read ran under a context holding %v, want the caller's", saw)
		}
		if n := b.reads.Len(); n != 0 {
			t.Fatalf("%d keys still on their way after the read came back", n)
		}
	})

	t.Run("reads asked while one is on its way wait together for one read that began after them", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.store.write("k")
		release := b.store.hold("k")
		first := b.ask(context.Background(), "k")
		testenv.Await(t, b.store.readDone, 1, bound, "reads held")
		// Written after the first read read: only a read that began after the
		// callers below asked can see it.
		written := b.store.write("k")
		const n = 20
		answers := make([]<-chan answer, n)
		for i := range answers {
			answers[i] = b.ask(context.Background(), "k")
		}
		testenv.Await(t, b.waited, n, bound, "callers waiting")
		release()
		if a := receive(t, first); a.err != nil || a.v != written-1 {
			t.Fatalf("the first caller got %d, %v; want %d, read before the write", a.v, a.err, written-1)
		}
		for i, c := range answers {
			if a := receive(t, c); a.err != nil || a.v != written {
				t.Fatalf("waiting caller %d got %d, %v; want %d, the write before it asked", i, a.v, a.err, written)
			}
		}
		if got := b.store.readsOf("k"); got != 2 {
			t.Fatalf("%d reads for %d callers, want 2: the one on its way and the one they waited for", got, n+1)
		}
		testenv.Eventually(t, bound, "the key to leave once no read is on its way", func() bool { return b.reads.Len() == 0 })
	})

	t.Run("another key's read does not wait for one on its way", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		release := b.store.hold("slow")
		defer release()
		slow := b.ask(context.Background(), "slow")
		testenv.Await(t, b.store.readDone, 1, bound, "reads held")
		if a := receive(t, b.ask(context.Background(), "other")); a.err != nil {
			t.Fatal(a.err)
		}
		select {
		case a := <-slow:
			t.Fatalf("the held read answered %v before it was released", a)
		default:
		}
	})

	t.Run("a waiting caller whose context ends returns at once, and the read still answers the others", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		release := b.store.hold("k")
		first := b.ask(context.Background(), "k")
		testenv.Await(t, b.store.readDone, 1, bound, "reads held")
		ctx, cancel := context.WithCancel(context.Background())
		gone := b.ask(ctx, "k")
		stays := b.ask(context.Background(), "k")
		testenv.Await(t, b.waited, 2, bound, "callers waiting")
		cancel()
		if a := receive(t, gone); !errors.Is(a.err, context.Canceled) {
			t.Fatalf("the caller that gave up got %d, %v; want context.Canceled", a.v, a.err)
		}
		release()
		if a := receive(t, first); a.err != nil {
			t.Fatal(a.err)
		}
		if a := receive(t, stays); a.err != nil {
			t.Fatalf("the caller that stayed got %v", a.err)
		}
	})

	t.Run("a read sent for waiting callers ends at the timeout, not with a caller", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.reads.Timeout = 50 * time.Millisecond
		release := b.store.hold("k")
		first := b.ask(context.Background(), "k")
		testenv.Await(t, b.store.readDone, 1, bound, "reads held")
		waiting := b.ask(context.Background(), "k")
		testenv.Await(t, b.waited, 1, bound, "callers waiting")
		// The first read is held until its caller's context ends, which it never does;
		// let it go, then hold the next: only its timeout ends it.
		second := b.store.hold("k")
		release()
		if a := receive(t, first); a.err != nil {
			t.Fatal(a.err)
		}
		testenv.Await(t, b.store.readDone, 1, bound, "reads held")
		if a := receive(t, waiting); !errors.Is(a.err, context.DeadlineExceeded) {
			t.Fatalf("the waiting caller got %d, %v; want the read's deadline", a.v, a.err)
		}
		second()
	})

	t.Run("under many callers every answer was read after its caller asked", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.reads.OnWait = nil
		keys := []string{"a", "b", "c"}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var writers sync.WaitGroup
		for _, k := range keys {
			writers.Go(func() {
				for ctx.Err() == nil {
					b.store.write(k)
				}
			})
		}
		var calls, failures atomic.Int64
		var callers sync.WaitGroup
		for g := range 16 {
			callers.Go(func() {
				for i := range 300 {
					k := keys[(g+i)%len(keys)]
					b.store.mu.Lock()
					before := b.store.version[k]
					b.store.mu.Unlock()
					v, err := b.reads.Do(context.Background(), k, b.store.read(k))
					calls.Add(1)
					if err != nil || v < before {
						failures.Add(1)
						t.Errorf("key %s: got %d, %v; a write of version %d was done before the call", k, v, err, before)
						return
					}
				}
			})
		}
		callers.Wait()
		cancel()
		writers.Wait()
		reads := 0
		for _, k := range keys {
			reads += b.store.readsOf(k)
		}
		t.Logf("%d calls, %d reads", calls.Load(), reads)
		if failures.Load() == 0 && reads > int(calls.Load()) {
			t.Fatalf("%d reads for %d calls: never more reads than calls", reads, calls.Load())
		}
		testenv.Eventually(t, bound, "every key to leave once no read is on its way", func() bool { return b.reads.Len() == 0 })
	})
}

func Example() {
	var r Reads[string, string]
	v, err := r.Do(context.Background(), "key", func(context.Context) (string, error) { return "read now", nil })
	fmt.Println(v, err)
	// Output: read now <nil>
}
