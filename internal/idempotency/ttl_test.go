package idempotency_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/idempotency"
)

func TestClaimWithoutATimeToLiveIsRefusedBeforeAnyQuery(t *testing.T) {
	t.Parallel()
	// A nil querier: a refused claim must not get as far as Postgres.
	rec := &idempotency.Record{Client: "acme", Key: "k", RequestHash: "h"}
	for _, ttl := range []time.Duration{0, -time.Second} {
		if _, err := idempotency.Claim(context.Background(), nil, rec, ttl); err == nil || !strings.Contains(err.Error(), "TTL") {
			t.Errorf("Claim with a TTL of %s = %v, want an error naming the TTL", ttl, err)
		}
	}
}
