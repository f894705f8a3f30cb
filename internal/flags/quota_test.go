package flags

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/space-sandbox/space"
)

// designExample is a quota flag without tiers: an allowlist, caps and rate entries
// (docs/contract.md, "Flags").
const designExample = `{
  "clients": {"acme": {"concurrency": 20, "live_sandboxes": 200}, "globex": {}},
  "default": {"concurrency": 10, "live_sandboxes": 50},
  "rate":    {"acme": {"refill_rps": 10, "burst": 40}, "globex": null, "unknown": null}
}`

func TestParseQuotas(t *testing.T) {
	t.Parallel()

	t.Run("the design example parses into clients, default and rate", func(t *testing.T) {
		t.Parallel()
		q, err := ParseQuotas(decode(t, designExample))
		if err != nil {
			t.Fatal(err)
		}
		if len(q.Clients) != 2 || *q.Clients["acme"].Concurrency != 20 || *q.Clients["acme"].LiveSandboxes != 200 {
			t.Errorf("clients = %+v", q.Clients)
		}
		if g := q.Clients["globex"]; g.Concurrency != nil || g.LiveSandboxes != nil {
			t.Errorf("globex = %+v, want no caps of its own", g)
		}
		if *q.Default.Concurrency != 10 || *q.Default.LiveSandboxes != 50 {
			t.Errorf("default = %+v", q.Default)
		}
		if r := q.Rates["acme"]; r.Rate == nil || *r.Rate != (space.Rate{RefillRPS: 10, Burst: 40}) {
			t.Errorf("rate.acme = %+v", r)
		}
		for _, k := range []space.ClientKey{"globex", space.Unknown} {
			if r := q.Rates[k]; !r.Exempt || r.Rate != nil || r.Malformed != nil {
				t.Errorf("rate.%s = %+v, want exempt", k, r)
			}
		}
	})

	t.Run("an empty object is no allowlist, no default and no rate", func(t *testing.T) {
		t.Parallel()
		q, err := ParseQuotas(map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		if q.Clients == nil || q.Rates == nil || len(q.Clients)+len(q.Rates) != 0 || q.Default != (ClientQuota{}) {
			t.Errorf("got %+v", q)
		}
	})

	t.Run("null sections and null caps say nothing", func(t *testing.T) {
		t.Parallel()
		q, err := ParseQuotas(decode(t, `{"clients": {"acme": {"concurrency": null}}, "default": null, "rate": null}`))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := q.Clients["acme"]; !ok || q.Clients["acme"].Concurrency != nil {
			t.Errorf("got %+v", q)
		}
	})

	t.Run("numbers are read however the provider decoded them", func(t *testing.T) {
		t.Parallel()
		q, err := ParseQuotas(map[string]any{
			"clients": map[string]any{"acme": map[string]any{"concurrency": json.Number("7"), "live_sandboxes": int64(8)}},
			"rate":    map[string]any{"acme": map[string]any{"refill_rps": json.Number("0.5"), "burst": 3}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if *q.Clients["acme"].Concurrency != 7 || *q.Clients["acme"].LiveSandboxes != 8 {
			t.Errorf("clients = %+v", q.Clients)
		}
		if r := q.Rates["acme"]; r.Rate == nil || *r.Rate != (space.Rate{RefillRPS: 0.5, Burst: 3}) {
			t.Errorf("rate = %+v", r)
		}
	})

	t.Run("a flag malformed as a whole is an error", func(t *testing.T) {
		t.Parallel()
		cases := map[string]string{
			"not an object (a string)":     `"acme"`,
			"not an object (an array)":     `[]`,
			"not an object (null)":         `null`,
			"not an object (a number)":     `42`,
			"clients of the wrong type":    `{"clients": ["acme"]}`,
			"default of the wrong type":    `{"default": 10}`,
			"rate of the wrong type":       `{"rate": "fast"}`,
			"an unknown top-level field":   `{"clinets": {"acme": {}}}`,
			"a client entry not an object": `{"clients": {"acme": 20}}`,
			"a null client entry":          `{"clients": {"acme": null}}`,
			"a negative cap":               `{"clients": {"acme": {"concurrency": -1}}}`,
			"a fractional cap":             `{"default": {"live_sandboxes": 1.5}}`,
			"a cap of the wrong type":      `{"default": {"concurrency": "10"}}`,
			"a cap beyond int32":           `{"default": {"concurrency": 1e12}}`,
			"an unknown client field":      `{"clients": {"acme": {"concurency": 5}}}`,
			"an empty client id":           `{"clients": {"": {}}}`,
			"a client id with a space":     `{"clients": {"acme corp": {}}}`,
			"a client id with a newline":   `{"clients": {"acme\n": {}}}`,
			"a client id over 128 bytes":   `{"clients": {"` + strings.Repeat("a", MaxClientKeyLen+1) + `": {}}}`,
		}
		for name, raw := range cases {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				_, err := ParseQuotas(decode(t, raw))
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("ParseQuotas(%s) = %v, want ErrMalformed", raw, err)
				}
			})
		}
	})

	t.Run("a client id of exactly 128 bytes is allowed", func(t *testing.T) {
		t.Parallel()
		if _, err := ParseQuotas(decode(t, `{"clients": {"`+strings.Repeat("a", MaxClientKeyLen)+`": {}}}`)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a malformed rate entry is reported on its key only", func(t *testing.T) {
		t.Parallel()
		cases := map[string]any{
			"a string":               "fast",
			"a number":               10.0,
			"an array":               []any{10.0, 40.0},
			"a negative refill_rps":  map[string]any{"refill_rps": -1.0, "burst": 1.0},
			"a NaN refill_rps":       map[string]any{"refill_rps": math.NaN(), "burst": 1.0},
			"an infinite refill_rps": map[string]any{"refill_rps": math.Inf(1), "burst": 1.0},
			"a refill_rps string":    map[string]any{"refill_rps": "10", "burst": 1.0},
			"a burst of zero":        map[string]any{"refill_rps": 1.0, "burst": 0.0},
			"a negative burst":       map[string]any{"refill_rps": 1.0, "burst": -3.0},
			"a fractional burst":     map[string]any{"refill_rps": 1.0, "burst": 1.5},
			"a burst beyond 2^53":    map[string]any{"refill_rps": 1.0, "burst": 1e300},
			"an unknown field":       map[string]any{"refill_rps": 1.0, "burst": 1.0, "brust": 2.0},
			"a missing burst":        map[string]any{"refill_rps": 1.0},
			"a missing refill_rps":   map[string]any{"burst": 1.0},
			"an empty object":        map[string]any{},
			"a null refill_rps":      map[string]any{"refill_rps": nil, "burst": 1.0},
		}
		for name, entry := range cases {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				q, err := ParseQuotas(map[string]any{"rate": map[string]any{
					"acme":   entry,
					"globex": map[string]any{"refill_rps": 1.0, "burst": 2.0},
				}})
				if err != nil {
					t.Fatalf("a bad rate entry failed the whole flag: %v", err)
				}
				if r := q.Rates["acme"]; !errors.Is(r.Malformed, ErrMalformed) || r.Rate != nil || r.Exempt {
					t.Errorf("rate.acme = %+v, want malformed", r)
				}
				if r := q.Rates["globex"]; r.Rate == nil || r.Malformed != nil {
					t.Errorf("rate.globex = %+v, want its rate", r)
				}
			})
		}
	})

	t.Run("a zero refill rate is a valid rate", func(t *testing.T) {
		t.Parallel()
		q, err := ParseQuotas(decode(t, `{"rate": {"acme": {"refill_rps": 0, "burst": 1}}}`))
		if err != nil {
			t.Fatal(err)
		}
		if r := q.Rates["acme"]; r.Rate == nil || *r.Rate != (space.Rate{Burst: 1}) {
			t.Errorf("rate.acme = %+v", r)
		}
	})
}

// FuzzParseQuotas feeds arbitrary JSON to the quota flag parser and to the limits built
// from it: no panic, every input parses or is an ErrMalformed error, every rate entry
// is exactly one of valid, exempt or malformed, and every limit is usable.
func FuzzParseQuotas(f *testing.F) {
	for _, seed := range []string{
		designExample,
		`{}`,
		`null`,
		`"x"`,
		`[1,2]`,
		`{"clients": null, "default": null, "rate": null}`,
		`{"clients": {"acme": {"concurrency": 0, "live_sandboxes": 0}}}`,
		`{"clients": {"acme": {"concurrency": -1}}}`,
		`{"clients": {"": {}}}`,
		`{"clients": {"unknown": {"concurrency": 1}}, "rate": {"unknown": {"refill_rps": 0.001, "burst": 1}}}`,
		`{"rate": {"acme": {"refill_rps": 1e308, "burst": 9007199254740992}}}`,
		`{"rate": {"acme": {"refill_rps": -0, "burst": 1.0}}}`,
		`{"rate": {"acme": {"refill_rps": 1, "burst": 1.5}, "b": [], "c": "x", "d": {"x": 1}}}`,
		`{"default": {"concurrency": 2147483647, "live_sandboxes": 2147483648}}`,
		`{"clients": {"a": {}}, "extra": 1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var v any
		if err := json.Unmarshal(data, &v); err != nil {
			return
		}
		q, err := ParseQuotas(v)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		for key, e := range q.Rates {
			kinds := 0
			if e.Rate != nil {
				kinds++
				if err := e.Rate.Validate(); err != nil || math.IsInf(e.Rate.RefillRPS, 0) {
					t.Fatalf("rate.%s = %+v is invalid: %v", key, *e.Rate, err)
				}
			}
			if e.Exempt {
				kinds++
			}
			if e.Malformed != nil {
				kinds++
			}
			if kinds != 1 {
				t.Fatalf("rate.%s = %+v: want exactly one of rate, exempt, malformed", key, e)
			}
		}
		for key, c := range q.Clients {
			if key == "" || len(key) > MaxClientKeyLen {
				t.Fatalf("client key %q allowlisted", key)
			}
			if (c.Concurrency != nil && *c.Concurrency < 0) || (c.LiveSandboxes != nil && *c.LiveSandboxes < 0) {
				t.Fatalf("clients.%s = %+v has a negative cap", key, c)
			}
		}
		r := NewResolver(ResolverOptions{Env: defaultEnv(), Logger: discardLogger()})
		keys := []space.ClientKey{space.Unknown}
		for key := range q.Rates {
			keys = append(keys, key)
		}
		for _, key := range keys {
			l := r.limits(&parsedQuotas{q: q}, key, tierChoice{})
			if l.ClientRate != nil && l.ClientRate.Validate() != nil {
				t.Fatalf("limits of %s carry an invalid rate %+v", key, *l.ClientRate)
			}
			if l.Concurrency < 0 || l.LiveSandboxes < 0 {
				t.Fatalf("limits of %s carry a negative cap: %+v", key, l)
			}
		}
	})
}
