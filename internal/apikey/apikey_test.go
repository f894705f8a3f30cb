package apikey

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/testenv"
)

type bundle struct {
	store     *Store
	firstRead chan struct{} // see holdFirstQuery
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{store: NewStore(testenv.DB(t), nil)}
}

// issue creates n keys of n clients and returns their ids and secrets.
func (b *bundle) issue(t *testing.T, n int) (ids, secrets []string) {
	t.Helper()
	for i := range n {
		k, secret, err := b.store.Create(testenv.Context(t), fmt.Sprintf("tenant-%d", i), "test")
		if err != nil {
			t.Fatal(err)
		}
		ids, secrets = append(ids, k.ID), append(secrets, secret)
	}
	return ids, secrets
}

// unwritten is how many of ids have no last_used_at yet.
func (b *bundle) unwritten(t *testing.T, ids []string) int {
	t.Helper()
	keys, err := b.store.List(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	n := len(ids)
	for _, k := range keys {
		if want[k.ID] && k.LastUsedAt != nil {
			n--
		}
	}
	return n
}

func TestLastUse(t *testing.T) {
	t.Parallel()

	t.Run("keys used at once have their last use written together, in a statement or a few", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids, secrets := b.issue(t, 50)
		var wg sync.WaitGroup
		for _, secret := range secrets {
			wg.Go(func() {
				if _, err := b.store.Lookup(testenv.Context(t), secret); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		testenv.Eventually(t, 30*time.Second, "every key's last use to be written", func() bool {
			return b.unwritten(t, ids) == 0
		})
		// One statement a second of lookups (a statement a key was 50): a loaded
		// machine may spread 50 lookups over a few of those seconds, not over 25.
		if w := b.store.writes.Load(); w >= 25 {
			t.Fatalf("%d statements wrote 50 keys' last use, want them written together", w)
		}
	})

	t.Run("a key used again within the interval is not written again, and its writer ends", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids, secrets := b.issue(t, 1)
		for range 20 {
			if _, err := b.store.Lookup(testenv.Context(t), secrets[0]); err != nil {
				t.Fatal(err)
			}
		}
		testenv.Eventually(t, 30*time.Second, "the key's last use to be written and its writer to end", func() bool {
			b.store.mu.Lock()
			writing := b.store.writing
			b.store.mu.Unlock()
			return b.unwritten(t, ids) == 0 && !writing
		})
		if w := b.store.writes.Load(); w != 1 {
			t.Fatalf("%d statements for one key used 20 times within a minute, want 1", w)
		}
	})
}

// holdFirstQuery holds the store's first query on its way once it has read its row,
// signalling b.firstRead, until release is called; later queries go on.
func (b *bundle) holdFirstQuery(t *testing.T) (release func()) {
	t.Helper()
	b.firstRead = make(chan struct{}, 1)
	hold := make(chan struct{})
	var queried atomic.Int64
	b.store.queried = func() {
		if queried.Add(1) == 1 {
			b.firstRead <- struct{}{}
			<-hold
		}
	}
	return func() { close(hold) }
}

func TestLookupCoalesced(t *testing.T) {
	t.Parallel()

	t.Run("lookups of a key made while its query is on its way share the next, which sees a revoke made before them", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids, secrets := b.issue(t, 1)
		release := b.holdFirstQuery(t)
		waiting := make(chan struct{}, 100)
		b.store.reads.OnWait = func() { waiting <- struct{}{} }
		lookup := func() <-chan error {
			c := make(chan error, 1)
			go func() {
				_, err := b.store.Lookup(testenv.Context(t), secrets[0])
				c <- err
			}()
			return c
		}
		onItsWay := lookup()
		testenv.Await(t, b.firstRead, 1, 30*time.Second, "first queries having read the key")
		// The first query has read the key live; the revoke commits while it is on its
		// way, before the lookups below are made.
		if err := b.store.Revoke(testenv.Context(t), ids[0]); err != nil {
			t.Fatal(err)
		}
		const n = 10
		after := make([]<-chan error, n)
		for i := range after {
			after[i] = lookup()
		}
		testenv.Await(t, waiting, n, 30*time.Second, "lookups made after the revoke waiting")
		release()
		if err := <-onItsWay; err != nil {
			t.Fatalf("the lookup made before the revoke: %v, want its key live", err)
		}
		for i, c := range after {
			if err := <-c; !errors.Is(err, ErrInvalid) {
				t.Fatalf("lookup %d made after the revoke: %v, want ErrInvalid", i, err)
			}
		}
		if q := b.store.queries.Load(); q != 2 {
			t.Fatalf("%d queries for %d lookups, want 2: the one on its way and the one the others waited for", q, n+1)
		}
	})

	t.Run("lookups of other keys do not wait for a key's query on its way", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, secrets := b.issue(t, 2)
		release := b.holdFirstQuery(t)
		defer release()
		go func() { _, _ = b.store.Lookup(testenv.Context(t), secrets[0]) }()
		testenv.Await(t, b.firstRead, 1, 30*time.Second, "first queries having read the key")
		if _, err := b.store.Lookup(testenv.Context(t), secrets[1]); err != nil {
			t.Fatalf("another key's lookup: %v", err)
		}
	})
}
