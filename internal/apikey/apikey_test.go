package apikey

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/testenv"
)

type bundle struct {
	store *Store
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
