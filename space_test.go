package space_test

import (
	"errors"
	"fmt"
	"math"
	"strconv"
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

func TestAppendQuote(t *testing.T) {
	t.Parallel()
	t.Run("every string is quoted exactly as strconv quotes it", func(t *testing.T) {
		t.Parallel()
		for _, s := range []string{
			"", "acme", "client_activation", "bench-reject.1_A", " ~!#$%&'()*+,/:;<=>?@[]^`{|}",
			`a"b`, `a\b`, "tab\there", "nl\n", "\x00", "\x7f", "é", "日本", "\xff\xfe", "ok\u2028",
		} {
			want := strconv.AppendQuote([]byte("prefix:"), s)
			if got := space.AppendQuote([]byte("prefix:"), s); string(got) != string(want) {
				t.Errorf("AppendQuote(%q) = %s, want %s", s, got, want)
			}
		}
	})
	t.Run("a refusal's message names its client quoted", func(t *testing.T) {
		t.Parallel()
		le := &space.LimitError{Bucket: space.BucketClientActivation, Client: `a"b`}
		if got, want := le.Message(), `client "a\"b" is over its sandbox activation rate; slow down and retry after the Retry-After delay`; got != want {
			t.Errorf("Message = %q, want %q", got, want)
		}
		le.Client = space.Unknown
		if got := le.MessageFor(space.IdentityTrustedHeader); !strings.HasPrefix(got, `client "unknown" is over`) || !strings.HasSuffix(got, "; activations without an allowlisted X-Client-ID share this rate") {
			t.Errorf("MessageFor(trusted_header) = %q", got)
		}
	})
}

// BenchmarkAppendQuote is the quoting of a refusal's client key and bucket name, against
// strconv's.
//
//	go test -run '^$' -bench AppendQuote -benchmem .
func BenchmarkAppendQuote(b *testing.B) {
	for _, c := range []struct {
		name  string
		quote func([]byte, string) []byte
	}{{"space", space.AppendQuote}, {"strconv", strconv.AppendQuote}} {
		b.Run(c.name, func(b *testing.B) {
			var buf [64]byte
			for b.Loop() {
				_ = c.quote(buf[:0], "bench-reject-bare")
				_ = c.quote(buf[:0], "client_activation")
			}
		})
	}
}
