package space_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/space-sandbox/space"
)

func TestRateValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate space.Rate
		ok   bool
	}{
		{space.Rate{RefillRPS: 0, Burst: 1}, true},
		{space.Rate{RefillRPS: 1e-20, Burst: 1}, true},
		{space.Rate{RefillRPS: 10, Burst: 40}, true},
		{space.Rate{RefillRPS: -1, Burst: 1}, false},
		{space.Rate{RefillRPS: math.NaN(), Burst: 1}, false},
		{space.Rate{RefillRPS: 1, Burst: 0}, false},
	} {
		if err := tc.rate.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: Validate = %v, want ok %v", tc.rate, err, tc.ok)
		}
	}
}

func TestLiveStates(t *testing.T) {
	t.Parallel()
	live := map[space.SandboxState]bool{}
	for _, s := range space.LiveStates {
		live[s] = true
	}
	for _, s := range []space.SandboxState{space.StateStarting, space.StateRunning, space.StatePausing, space.StatePaused,
		space.StateRestoring, space.StateFailed, space.StateTerminated} {
		if s.Live() != live[s] {
			t.Errorf("%s: Live() = %v but LiveStates says %v", s, s.Live(), live[s])
		}
	}
	if space.StatePaused.Live() || space.StateFailed.Live() || !space.StateRunning.Live() {
		t.Fatal("a paused or failed sandbox must not hold a live place; a running one must")
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()

	t.Run("the code of a wrapped error is found through the chain", func(t *testing.T) {
		t.Parallel()
		err := fmt.Errorf("create: %w", space.FieldError(space.EINVALID, "disk_gib", "must be positive"))
		if space.ErrorCode(err) != space.EINVALID || space.ErrorMessage(err) != "must be positive" {
			t.Fatalf("code %q message %q", space.ErrorCode(err), space.ErrorMessage(err))
		}
		limited := fmt.Errorf("admit: %w", &space.LimitError{Bucket: space.BucketClusterActivation})
		if space.ErrorCode(limited) != space.ELIMITED {
			t.Fatalf("a wrapped LimitError has code %q", space.ErrorCode(limited))
		}
	})

	t.Run("an unknown error is internal and its text is not shown", func(t *testing.T) {
		t.Parallel()
		err := errors.New("pq: password authentication failed for user admin")
		if space.ErrorCode(err) != space.EINTERNAL || space.ErrorMessage(err) != "internal error" {
			t.Fatalf("code %q message %q", space.ErrorCode(err), space.ErrorMessage(err))
		}
		if space.ErrorCode(nil) != "" {
			t.Fatal("nil has a code")
		}
	})

	t.Run("each bucket explains itself, and unknown callers learn they share a rate", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			err  space.LimitError
			want string
		}{
			{space.LimitError{Bucket: space.BucketClientActivation, Client: "acme"}, `client "acme" is over its sandbox activation rate`},
			{space.LimitError{Bucket: space.BucketClientActivation, Client: space.Unknown}, "every client off the allowlist shares this rate"},
			{space.LimitError{Bucket: space.BucketClusterActivation}, "cluster is at its sandbox activation capacity"},
			{space.LimitError{Bucket: space.BucketClientConcurrency, Client: "acme", Cap: 3}, "(cap 3)"},
			{space.LimitError{Bucket: space.BucketLiveSandboxCap, Client: "acme", Cap: 50}, "cap of 50 live sandboxes"},
		} {
			if msg := tc.err.Message(); !strings.Contains(msg, tc.want) {
				t.Errorf("%s: %q does not say %q", tc.err.Bucket, msg, tc.want)
			}
		}
		if msg := (&space.LimitError{Bucket: space.BucketClientActivation, Client: "acme"}).Message(); strings.Contains(msg, "X-Client-ID") {
			t.Errorf("an allowlisted client is told about X-Client-ID: %q", msg)
		}
	})

	t.Run("a caller off the allowlist is told how to get a rate of its own in the words of its identity mode", func(t *testing.T) {
		t.Parallel()
		le := &space.LimitError{Bucket: space.BucketClientActivation, Client: space.Unknown}
		apiKey, header := le.MessageFor(space.IdentityAPIKey), le.MessageFor(space.IdentityTrustedHeader)
		if !strings.Contains(apiKey, "API key's client is not on the allowlist") || strings.Contains(apiKey, "X-Client-ID") {
			t.Errorf("api_key mode: %q", apiKey)
		}
		if !strings.Contains(header, "without an allowlisted X-Client-ID share this rate") {
			t.Errorf("trusted_header mode: %q", header)
		}
		acme := &space.LimitError{Bucket: space.BucketClientActivation, Client: "acme"}
		if acme.MessageFor(space.IdentityAPIKey) != acme.Message() || acme.MessageFor(space.IdentityTrustedHeader) != acme.Message() {
			t.Error("an allowlisted client's message depends on the identity mode")
		}
	})
}
