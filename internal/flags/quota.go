package flags

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"unicode/utf8"
	"unsafe"

	"github.com/space-sandbox/space"
)

// QuotaFlag is the object flag that holds the client allowlist, the concurrency and
// live-sandbox caps and the per-client activation rates (docs/contract.md, "Flags").
const QuotaFlag = "space-api-client-concurrency-quotas"

// MaxClientKeyLen bounds an allowlisted client key: an allowlist key is a client id.
const MaxClientKeyLen = space.MaxClientIDLen

// maxCap bounds a concurrency or live-sandbox cap, so that a typo (an extra few zeros)
// is refused instead of silently meaning "no cap" through an overflow.
const maxCap = math.MaxInt32

// ClientQuota is one client's entry in "clients", or the flag's "default": the tier it
// names, and the fields it sets over its tier (any of Fields for a client entry; only
// the caps for "default"). A nil field says nothing, so the layer below applies: a
// client entry overrides its tier field by field, which overrides the flag's "default",
// which overrides the env and the built-in Defaults. A zero cap is no cap.
type ClientQuota struct {
	Tier string
	Fields
}

// RateEntry is one entry of the flag's "rate" object. Exactly one of its three fields
// is set: Rate (a valid rate that replaces the env client rate for the key), Exempt
// (the entry is null: the key has no client bucket) or Malformed (why the entry cannot
// be used: the key stays on the env client rate).
type RateEntry struct {
	Rate      *space.Rate
	Exempt    bool
	Malformed error
}

// Quotas is the parsed quota flag. Its maps are never nil. A Quotas handed out by
// ParseQuotas belongs to the caller; the Resolver shares the ones it caches between
// requests and never modifies them.
type Quotas struct {
	// Clients is the allowlist: only these keys are honoured as client ids. A "unknown"
	// entry is allowed and sets the caps shared by every caller that is not allowlisted.
	Clients map[space.ClientKey]*ClientQuota
	// Default holds the caps of a client that its entry does not set.
	Default ClientQuota
	// Rates holds the "rate" entries by key. An entry does not allowlist its key.
	Rates map[space.ClientKey]RateEntry
	// Tiers is the tier table, by name; empty when the flag has none, and tiers are
	// then off.
	Tiers map[string]Tier
}

// ParseQuotas parses the value of QuotaFlag as a provider hands it out (decoded JSON:
// map[string]any, numbers as float64, json.Number or Go integers).
//
// The error (wrapping ErrMalformed) is only for a flag that cannot be used as a whole:
// not an object, an unknown top-level field, "clients", "default" or "rate" of the
// wrong type, or a client entry or "default" that is not an object of non-negative
// integer caps. A flag that fails here is refused at reload by DefaultValidators, and
// the Resolver keeps its last good value. A bad "rate" entry is not an error of the
// flag: it is reported in RateEntry.Malformed so that only its key falls back.
//
// Unknown fields are refused rather than ignored: a typo ("clinets", "concurency")
// would otherwise silently empty the allowlist or lift a cap.
//
// The Quotas returned are shared, and must not be modified: the last value parsed is
// remembered by identity (see identity), so that the parse of a reload's validation is
// the Resolver's too, not a second one of 10,000 entries.
func ParseQuotas(v any) (Quotas, error) {
	p := parseQuotasOnce(v)
	return p.q, p.err
}

// parseQuotasOnce is ParseQuotas with what it remembers of the value.
func parseQuotasOnce(v any) *quotaParse {
	id := identity(v)
	if last := lastParse.Load(); id != nil && last != nil && last.id == id {
		return last
	}
	p := &quotaParse{src: v, id: id}
	p.q, p.err = parseQuotas(v)
	if id != nil {
		lastParse.Store(p)
	}
	return p
}

// parseInForce is ParseQuotas and then inForce under env, the second remembered with
// the first: a reload's validation (DefaultValidators) and the Resolver's parse of the
// value it put in service check the table once, not twice.
func parseInForce(v any, env Env) (Quotas, *space.Reservations, []string, error) {
	p := parseQuotasOnce(v)
	if p.err != nil {
		return p.q, nil, nil, p.err
	}
	// inForce reads no more of env than its floor tier and its cluster rate.
	under := forced{fallback: env.FallbackTier, cluster: env.Cluster}
	if f := p.forced.Load(); f != nil && f.fallback == under.fallback && f.cluster == under.cluster {
		return p.q, f.res, f.warnings, f.err
	}
	under.res, under.warnings, under.err = inForce(p.q, env)
	p.forced.Store(&under)
	return p.q, under.res, under.warnings, under.err
}

// lastParse is the last value ParseQuotas parsed. It keeps the value (src) alive, so
// that its address names it and no other while remembered.
var lastParse atomic.Pointer[quotaParse]

type quotaParse struct {
	src any
	id  unsafe.Pointer
	q   Quotas
	err error
	// forced is the last inForce of q, and what of the Env it was under.
	forced atomic.Pointer[forced]
}

type forced struct {
	fallback string
	cluster  space.Rate
	res      *space.Reservations
	warnings []string
	err      error
}

func parseQuotas(v any) (Quotas, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return Quotas{}, malformedf("the quota flag must be an object, got %s", typeName(v))
	}
	q := Quotas{
		Clients: map[space.ClientKey]*ClientQuota{},
		Rates:   map[space.ClientKey]RateEntry{},
		Tiers:   map[string]Tier{},
	}
	for _, field := range sortedKeys(obj) {
		switch field {
		case "clients", "default", "rate", "tiers":
		default:
			return Quotas{}, malformedf("unknown field %q in the quota flag (want tiers, clients, default, rate)", truncate(field))
		}
	}

	if raw := obj["tiers"]; raw != nil {
		tiers, ok := raw.(map[string]any)
		if !ok {
			return Quotas{}, malformedf("tiers must be an object of tier name to limits, got %s", typeName(raw))
		}
		for _, name := range sortedKeys(tiers) {
			t, err := parseTier(name, tiers[name])
			if err != nil {
				return Quotas{}, fmt.Errorf("tiers.%s: %w", truncate(name), err)
			}
			q.Tiers[name] = t
		}
	}

	if raw := obj["clients"]; raw != nil {
		clients, ok := raw.(map[string]any)
		if !ok {
			return Quotas{}, malformedf("clients must be an object of client id to caps, got %s", typeName(raw))
		}
		// In map order, not sorted: a table of 10,000 clients sorted at every parse
		// was a fifth of a reload. The error reported is still always the same one,
		// the first failing id in order.
		q.Clients = make(map[space.ClientKey]*ClientQuota, len(clients))
		var failed string
		var failure error
		// The entries decodeObject shared (the same text: one map) are parsed once,
		// and share their ClientQuota.
		type entryParse struct {
			cq  *ClientQuota
			err error
		}
		parsed := map[unsafe.Pointer]entryParse{}
		for id, entry := range clients {
			if failure != nil && id > failed {
				continue
			}
			if err := checkClientKey(id); err != nil {
				failed, failure = id, fmt.Errorf("clients: %w", err)
				continue
			}
			p := identity(entry)
			e, ok := parsed[p]
			if !ok || p == nil {
				cq, err := parseClientQuota(entry, scopeClient)
				e = entryParse{&cq, err}
				if p != nil {
					parsed[p] = e
				}
			}
			cq, err := e.cq, e.err
			if err != nil {
				failed, failure = id, fmt.Errorf("clients.%s: %w", id, err)
				continue
			}
			q.Clients[space.ClientKey(id)] = cq
		}
		if failure != nil {
			return Quotas{}, failure
		}
	}

	if raw := obj["default"]; raw != nil {
		cq, err := parseClientQuota(raw, scopeDefault)
		if err != nil {
			return Quotas{}, fmt.Errorf("default: %w", err)
		}
		q.Default = cq
	}

	if raw := obj["rate"]; raw != nil {
		rates, ok := raw.(map[string]any)
		if !ok {
			return Quotas{}, malformedf("rate must be an object of client id to rate, got %s", typeName(raw))
		}
		q.Rates = make(map[space.ClientKey]RateEntry, len(rates))
		for id, entry := range rates {
			q.Rates[space.ClientKey(id)] = parseRateEntry(entry)
		}
	}
	return q, nil
}

// checkClientKey refuses an allowlist key that no caller could authenticate as: one
// that is not a client id (space.CheckClientID), other than "unknown", whose entry sets
// the caps shared by everyone off the allowlist.
func checkClientKey(id string) error {
	if id == string(space.Unknown) {
		return nil
	}
	if err := space.CheckClientID(id); err != nil {
		return malformedf("client id %q: %v", truncate(id), err)
	}
	return nil
}

func parseClientQuota(v any, s scope) (ClientQuota, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return ClientQuota{}, malformedf("must be an object such as {\"concurrency\": 10, \"live_sandboxes\": 50} (fields: %s), got %s", fieldNames(s), typeName(v))
	}
	var cq ClientQuota
	if err := parseFields(obj, s, &cq.Fields, nil, &cq.Tier); err != nil {
		return ClientQuota{}, err
	}
	return cq, nil
}

// parseRateEntry never fails: a bad entry is reported in Malformed.
func parseRateEntry(v any) RateEntry {
	if v == nil {
		return RateEntry{Exempt: true}
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return RateEntry{Malformed: malformedf("must be null (exempt) or {\"refill_rps\": <number>, \"burst\": <integer>}, got %s", typeName(v))}
	}
	for _, field := range sortedKeys(obj) {
		if field != "refill_rps" && field != "burst" {
			return RateEntry{Malformed: malformedf("unknown field %q (want refill_rps, burst)", truncate(field))}
		}
	}
	rawRPS, hasRPS := obj["refill_rps"]
	rawBurst, hasBurst := obj["burst"]
	if !hasRPS || !hasBurst {
		return RateEntry{Malformed: malformedf("refill_rps and burst are both required")}
	}
	rps, err := asFloat(rawRPS)
	if err != nil || math.IsInf(rps, 0) {
		return RateEntry{Malformed: malformedf("refill_rps must be a finite number >= 0, got %s", describe(rawRPS))}
	}
	burst, err := asInt(rawBurst)
	if err != nil {
		return RateEntry{Malformed: malformedf("burst must be an integer >= 1, got %s", describe(rawBurst))}
	}
	rate := space.Rate{RefillRPS: rps, Burst: burst}
	if err := rate.Validate(); err != nil {
		return RateEntry{Malformed: fmt.Errorf("%w: %w", ErrMalformed, err)}
	}
	return RateEntry{Rate: &rate}
}

// maxExactFloat is 2^53: every integer up to it is exact in a float64.
const maxExactFloat = 1 << 53

// asInt reads an integral JSON number, whichever way the provider decoded it.
func asInt(v any) (int64, error) {
	switch n := v.(type) {
	case float64:
		if n != math.Trunc(n) || math.IsInf(n, 0) || n > maxExactFloat || n < -maxExactFloat {
			return 0, fmt.Errorf("not an integer")
		}
		return int64(n), nil
	case float32:
		return asInt(float64(n))
	case int:
		return int64(n), nil
	case int8:
		return int64(n), nil
	case int16:
		return int64(n), nil
	case int32:
		return int64(n), nil
	case int64:
		return n, nil
	case uint8:
		return int64(n), nil
	case uint16:
		return int64(n), nil
	case uint32:
		return int64(n), nil
	case uint:
		if uint64(n) > math.MaxInt64 {
			return 0, fmt.Errorf("out of range")
		}
		return int64(n), nil
	case uint64:
		if n > math.MaxInt64 {
			return 0, fmt.Errorf("out of range")
		}
		return int64(n), nil
	case json.Number:
		if i, err := n.Int64(); err == nil {
			return i, nil
		}
		f, err := n.Float64()
		if err != nil {
			return 0, err
		}
		return asInt(f)
	}
	return 0, fmt.Errorf("not a number")
}

// asFloat reads a JSON number, whichever way the provider decoded it. NaN is refused
// here; infinities are left to the caller.
func asFloat(v any) (float64, error) {
	var f float64
	switch n := v.(type) {
	case float64:
		f = n
	case float32:
		f = float64(n)
	case json.Number:
		var err error
		if f, err = n.Float64(); err != nil {
			return 0, err
		}
	default:
		i, err := asInt(v)
		if err != nil {
			return 0, err
		}
		f = float64(i)
	}
	if math.IsNaN(f) {
		return 0, fmt.Errorf("NaN")
	}
	return f, nil
}

// typeName names the JSON type of a decoded value, for error messages.
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case float64, float32, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, json.Number:
		return "a number"
	}
	return fmt.Sprintf("a %T", v)
}

// describe renders a scalar value for an error message, and the type of anything else.
func describe(v any) string {
	switch v.(type) {
	case string:
		return fmt.Sprintf("%q", truncate(v.(string)))
	case bool, float64, float32, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, json.Number:
		return fmt.Sprint(v)
	}
	return typeName(v)
}

// truncate keeps error messages (and the log lines they end up in) short whatever the
// flag holds.
func truncate(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// sortedKeys returns the keys of m in order, for stable messages and events.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
