package flags

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/space-sandbox/space"
)

// TierFlag is the string flag that assigns a client its tier when its entry in the
// quota flag names none: evaluated with the client id as targetingKey, so that a
// provider with targeting rules (flagd) assigns tiers by rule.
const TierFlag = "space-api-client-tier"

// Fields are the limits a tier sets and a client entry may override, one by one. A nil
// field says nothing: the layer below applies (docs/tiers.md, "The tier table").
//
// Every field is declared once, in fieldTable, which parses it, names it in errors
// and layers it: a field added here but not there fails TestEveryFieldIsDeclared, and a
// flags file setting every field is parsed from disk in TestAFlagsFileWithEveryField.
type Fields struct {
	RefillRPS         *float64
	Burst             *int64
	Concurrency       *int
	LiveSandboxes     *int
	MaxActivationCost *int
	SoftRefillRPS     *float64
	SoftBurst         *int64
	QueueWeight       *int
	// The lifecycle (space.Lifecycle): how long a client's sandboxes live, idle and
	// stay paused, and how many it may keep paused.
	MaxLifetime     *time.Duration
	IdleTimeout     *time.Duration
	IdleAction      *space.IdleAction
	PausedRetention *time.Duration
	PausedSandboxes *int
}

// Reserve fields are a tier's alone: a client cannot move its tier's share of the
// cluster.
type reserveFields struct {
	ReservedRPS   *float64
	ReservedBurst *int64
	Lendable      *float64
}

// fieldKind says how a field's JSON value is read and checked.
type fieldKind int

const (
	kindCap        fieldKind = iota // an integer from 0 (no cap) to maxCap
	kindRPS                         // a finite number >= 0, tokens per second
	kindBurst                       // an integer >= 1
	kindCost                        // an integer from 0 (no cap) to maxCap
	kindFraction                    // a number from 0 to 1
	kindWeight                      // an integer from 1 to maxWeight
	kindSeconds                     // whole seconds from 0 (none) to maxSeconds
	kindIdleAction                  // "pause" or "terminate"
)

// maxSeconds bounds a lifecycle duration: ten years of 365 days. A longer one is most
// likely a typo (milliseconds for seconds, a few zeros too many), which must be refused
// rather than silently mean "forever".
const maxSeconds = 10 * 365 * 24 * 60 * 60

// maxWeight bounds a queue weight: a weight is lanes in the queue, and a typo must not
// hand one owner the whole of it.
const maxWeight = 64

// field is one declared field: its JSON name, how it is read, and where it lives.
type field struct {
	name string
	kind fieldKind
	// of returns the field's pointer in f (a **int, **int64, **float64,
	// **time.Duration or **space.IdleAction), for the fields of Fields; reserve, for
	// the fields of reserveFields.
	of      func(f *Fields) any
	reserve func(r *reserveFields) any
}

// fieldTable declares every field of a tier or a client entry.
var fieldTable = []field{
	{name: "refill_rps", kind: kindRPS, of: func(f *Fields) any { return &f.RefillRPS }},
	{name: "burst", kind: kindBurst, of: func(f *Fields) any { return &f.Burst }},
	{name: "concurrency", kind: kindCap, of: func(f *Fields) any { return &f.Concurrency }},
	{name: "live_sandboxes", kind: kindCap, of: func(f *Fields) any { return &f.LiveSandboxes }},
	{name: "max_activation_cost", kind: kindCost, of: func(f *Fields) any { return &f.MaxActivationCost }},
	{name: "soft_refill_rps", kind: kindRPS, of: func(f *Fields) any { return &f.SoftRefillRPS }},
	{name: "soft_burst", kind: kindBurst, of: func(f *Fields) any { return &f.SoftBurst }},
	{name: "queue_weight", kind: kindWeight, of: func(f *Fields) any { return &f.QueueWeight }},
	{name: "max_lifetime_seconds", kind: kindSeconds, of: func(f *Fields) any { return &f.MaxLifetime }},
	{name: "idle_timeout_seconds", kind: kindSeconds, of: func(f *Fields) any { return &f.IdleTimeout }},
	{name: "idle_action", kind: kindIdleAction, of: func(f *Fields) any { return &f.IdleAction }},
	{name: "paused_retention_seconds", kind: kindSeconds, of: func(f *Fields) any { return &f.PausedRetention }},
	{name: "paused_sandboxes", kind: kindCap, of: func(f *Fields) any { return &f.PausedSandboxes }},
	{name: "reserved_rps", kind: kindRPS, reserve: func(r *reserveFields) any { return &r.ReservedRPS }},
	{name: "reserved_burst", kind: kindBurst, reserve: func(r *reserveFields) any { return &r.ReservedBurst }},
	{name: "lendable", kind: kindFraction, reserve: func(r *reserveFields) any { return &r.Lendable }},
}

// scope is which fields an object of the flag may set.
type scope int

const (
	scopeDefault scope = iota // "default": the caps below every tier
	scopeClient               // a "clients" entry: its tier, and any field of Fields
	scopeTier                 // a "tiers" entry: Fields and its reserve
)

func (f field) allowed(s scope) bool {
	switch s {
	case scopeDefault:
		return f.name == "concurrency" || f.name == "live_sandboxes"
	case scopeClient:
		return f.of != nil
	}
	return true
}

// fieldNames lists the names an object of scope may hold, for errors.
func fieldNames(s scope) string {
	var names []string
	if s == scopeClient {
		names = append(names, "tier")
	}
	for _, f := range fieldTable {
		if f.allowed(s) {
			names = append(names, f.name)
		}
	}
	return strings.Join(names, ", ")
}

// parseFields reads obj's fields of scope into fields and reserve (reserve may be nil
// for a scope without one). A null field says nothing. tier, when not nil, receives a
// client entry's "tier".
//
// The fields are read in map order, not sorted: a 10,000-client quota flag sorted each
// entry's few names at every reload (BenchmarkReloadAtSize). The error reported is
// still always the same one, the first failing name in order.
func parseFields(obj map[string]any, s scope, fields *Fields, reserve *reserveFields, tier *string) error {
	var failed string
	var failure error
	for name, raw := range obj {
		if failure != nil && name > failed {
			continue
		}
		if err := parseField(name, raw, s, fields, reserve, tier); err != nil {
			failed, failure = name, err
		}
	}
	return failure
}

// parseField reads one field of parseFields.
func parseField(name string, raw any, s scope, fields *Fields, reserve *reserveFields, tier *string) error {
	if name == "tier" && s == scopeClient {
		if raw == nil {
			return nil
		}
		str, ok := raw.(string)
		if !ok || space.CheckTierName(str) != nil {
			return malformedf("tier must be a tier name (%s), got %s", space.TierNameRule, describe(raw))
		}
		*tier = str
		return nil
	}
	var f *field
	for i := range fieldTable {
		if fieldTable[i].name == name && fieldTable[i].allowed(s) {
			f = &fieldTable[i]
			break
		}
	}
	if f == nil {
		return malformedf("unknown field %q (want %s)", truncate(name), fieldNames(s))
	}
	if raw == nil {
		return nil
	}
	dst := any(nil)
	if f.of != nil {
		dst = f.of(fields)
	} else {
		dst = f.reserve(reserve)
	}
	return f.read(raw, dst)
}

// read checks raw as f's kind and stores it through dst.
func (f field) read(raw any, dst any) error {
	switch f.kind {
	case kindCap, kindCost:
		n, err := asInt(raw)
		if err != nil || n < 0 || n > maxCap {
			return malformedf("%s must be an integer from 0 (no cap) to %d, got %s", f.name, maxCap, describe(raw))
		}
		v := int(n)
		*dst.(**int) = &v
	case kindBurst:
		n, err := asInt(raw)
		if err != nil || n < 1 {
			return malformedf("%s must be an integer >= 1, got %s", f.name, describe(raw))
		}
		*dst.(**int64) = &n
	case kindRPS:
		v, err := asFloat(raw)
		if err != nil || v < 0 || math.IsInf(v, 0) {
			return malformedf("%s must be a finite number >= 0, got %s", f.name, describe(raw))
		}
		*dst.(**float64) = &v
	case kindWeight:
		n, err := asInt(raw)
		if err != nil || n < 1 || n > maxWeight {
			return malformedf("%s must be an integer from 1 to %d, got %s", f.name, maxWeight, describe(raw))
		}
		v := int(n)
		*dst.(**int) = &v
	case kindFraction:
		v, err := asFloat(raw)
		if err != nil || v < 0 || v > 1 {
			return malformedf("%s must be a number from 0 to 1, got %s", f.name, describe(raw))
		}
		*dst.(**float64) = &v
	case kindSeconds:
		n, err := asInt(raw)
		if err != nil || n < 0 || n > maxSeconds {
			return malformedf("%s must be whole seconds from 0 (none) to %d (10 years), got %s", f.name, maxSeconds, describe(raw))
		}
		d := time.Duration(n) * time.Second
		*dst.(**time.Duration) = &d
	case kindIdleAction:
		str, _ := raw.(string)
		a := space.IdleAction(str)
		if a != space.IdlePause && a != space.IdleTerminate {
			return malformedf("%s must be %q or %q, got %s", f.name, space.IdlePause, space.IdleTerminate, describe(raw))
		}
		*dst.(**space.IdleAction) = &a
	}
	return nil
}

// Tier is one entry of the quota flag's tier table.
type Tier struct {
	Name string
	Fields
	// Reserve is the tier's reserved share of the cluster bucket; nil when it reserves
	// nothing.
	Reserve *space.Reserve
}

// parseTier reads one entry of "tiers". A tier's rates are whole: refill_rps and
// burst come together or not at all, and so do the soft and the reserved pairs, since
// a half-set pair would take its other half from whatever lies below, which differs by
// deployment. A soft limit lies within the hard one.
func parseTier(name string, v any) (Tier, error) {
	t := Tier{Name: name}
	if err := space.CheckTierName(name); err != nil {
		return t, malformedf("%v", err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return t, malformedf("must be an object of limits (%s), got %s", fieldNames(scopeTier), typeName(v))
	}
	var r reserveFields
	if err := parseFields(obj, scopeTier, &t.Fields, &r, nil); err != nil {
		return t, err
	}
	for _, pair := range [][2]string{{"refill_rps", "burst"}, {"soft_refill_rps", "soft_burst"}, {"reserved_rps", "reserved_burst"}} {
		if (obj[pair[0]] == nil) != (obj[pair[1]] == nil) {
			return t, malformedf("%s and %s are set together or not at all", pair[0], pair[1])
		}
	}
	if t.SoftRefillRPS != nil {
		if t.RefillRPS == nil {
			return t, malformedf("a soft limit (soft_refill_rps, soft_burst) needs the hard one it lies within (refill_rps, burst)")
		}
		if *t.SoftRefillRPS > *t.RefillRPS || *t.SoftBurst > *t.Burst {
			return t, malformedf("the soft limit (%g/s, burst %d) must lie within the hard one (%g/s, burst %d)",
				*t.SoftRefillRPS, *t.SoftBurst, *t.RefillRPS, *t.Burst)
		}
	}
	switch {
	case r.ReservedRPS != nil && *r.ReservedRPS <= 0:
		// A reserve that never refills would be spent once and then only block
		// lending: its idle interval (burst over refill) never ends.
		return t, malformedf("reserved_rps must be a number > 0, got %g", *r.ReservedRPS)
	case r.ReservedRPS != nil:
		lendable := 1.0
		if r.Lendable != nil {
			lendable = *r.Lendable
		}
		t.Reserve = &space.Reserve{Rate: space.Rate{RefillRPS: *r.ReservedRPS, Burst: *r.ReservedBurst}, Lendable: lendable}
	case r.Lendable != nil:
		return t, malformedf("lendable says how much of a reserve others may borrow: it needs reserved_rps and reserved_burst")
	}
	return t, nil
}

// reservations shares the cluster rate out between the tiers that reserve part of it:
// the sum of the reserves must stay below the cluster's rate and burst, so that the
// shared remainder keeps a rate and at least one token. An error names the tiers.
func reservations(tiers map[string]Tier, cluster space.Rate) (*space.Reservations, error) {
	var names []string
	var rps float64
	var burst int64
	for name, t := range tiers {
		if t.Reserve != nil {
			names = append(names, name)
			rps += t.Reserve.Rate.RefillRPS
			burst += t.Reserve.Rate.Burst
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	sort.Strings(names)
	if rps >= cluster.RefillRPS || burst >= cluster.Burst {
		return nil, malformedf("tiers %s reserve %g/s with a burst of %d, which must stay below the cluster bucket's %g/s and burst of %d (SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS, _BURST)",
			strings.Join(names, ", "), rps, burst, cluster.RefillRPS, cluster.Burst)
	}
	r := &space.Reservations{Shared: space.Rate{RefillRPS: cluster.RefillRPS - rps, Burst: cluster.Burst - burst}}
	for _, name := range names {
		r.Reserves = append(r.Reserves, space.TierReserve{Tier: name, Reserve: *tiers[name].Reserve})
	}
	return r, nil
}

// inForce checks a parsed quota flag against the configuration it is served under, and
// returns how its tiers share the cluster bucket out, and what it holds that works but
// is likely a mistake. A tier table must contain the floor tier (Env.FallbackTier), and
// its reserves must leave the cluster a shared remainder; either failing makes the
// value unusable as a whole (an ErrMalformed error), so that the last good one stays.
func inForce(q Quotas, env Env) (*space.Reservations, []string, error) {
	if len(q.Tiers) == 0 {
		return nil, lifecycleTableWarnings(q), nil
	}
	names := sortedKeys(q.Tiers)
	if _, ok := q.Tiers[env.FallbackTier]; !ok {
		if env.FallbackTier == "" {
			return nil, nil, malformedf("the tier table (%s) needs a floor tier for the clients whose tier cannot be resolved: set SPACE_FALLBACK_TIER to one of them", strings.Join(names, ", "))
		}
		return nil, nil, malformedf("the floor tier SPACE_FALLBACK_TIER=%q is not in the tier table (%s)", env.FallbackTier, strings.Join(names, ", "))
	}
	res, err := reservations(q.Tiers, env.Cluster)
	if err != nil {
		return nil, nil, err
	}
	named := map[string]bool{env.FallbackTier: true}
	var warnings []string
	for id, entry := range q.Clients {
		t := entry.Tier
		if t == "" {
			continue
		}
		named[t] = true
		if _, ok := q.Tiers[t]; !ok {
			warnings = append(warnings, fmt.Sprintf("clients.%s names tier %q, which is not in the tier table: it gets the floor tier %q", id, t, env.FallbackTier))
		}
	}
	slices.Sort(warnings) // the warnings in order, not the 10,000 ids they came from
	for _, name := range names {
		if !named[name] {
			warnings = append(warnings, fmt.Sprintf("tier %q is named by no client entry: only the flag %s can put a client on it", name, TierFlag))
		}
	}
	return res, append(warnings, lifecycleTableWarnings(q)...), nil
}

// lifecycleTableWarnings checks the lifecycle of every tier, and of every client entry
// that sets a field of it over what lies below the entry, as far as the flag alone
// says: its tier when it names one in the table, nothing when there is no table. An
// entry whose tier only a resolution knows (the tier flag, the floor) is checked when
// it is resolved, in Caller.Warnings, like every caller.
func lifecycleTableWarnings(q Quotas) []string {
	var out []string
	for _, name := range sortedKeys(q.Tiers) {
		for _, w := range lifecycleWarnings(lifecycleOf(q.Tiers[name].Fields)) {
			out = append(out, fmt.Sprintf("tiers.%s: %s", name, w))
		}
	}
	var clients []string
	for id, entry := range q.Clients {
		if !setsLifecycle(entry.Fields) {
			continue
		}
		var below []Fields
		if t, ok := q.Tiers[entry.Tier]; ok {
			below = append(below, t.Fields)
		} else if len(q.Tiers) > 0 {
			continue
		}
		tierSays := map[string]bool{}
		for _, w := range lifecycleWarnings(lifecycleOf(below...)) {
			tierSays[w] = true
		}
		for _, w := range lifecycleWarnings(lifecycleOf(append(below, entry.Fields)...)) {
			if !tierSays[w] { // said once, of the tier
				clients = append(clients, fmt.Sprintf("clients.%s: %s", id, w))
			}
		}
	}
	slices.Sort(clients)
	return append(out, clients...)
}

// setsLifecycle reports whether f sets a field of the lifecycle.
func setsLifecycle(f Fields) bool {
	return f.MaxLifetime != nil || f.IdleTimeout != nil || f.IdleAction != nil || f.PausedRetention != nil || f.PausedSandboxes != nil
}

// lifecycleOf is the lifecycle that layers give, the least specific first, layered as
// a resolution layers them (Resolver.limits).
func lifecycleOf(layers ...Fields) space.Lifecycle {
	var c space.Caller
	l := layered{caller: &c}
	for _, f := range layers {
		l.apply(f, space.SourceTier)
	}
	l.finish(nil)
	return c.Lifecycle
}

// TierTable is the tier table in force, as GET /v1/tiers reports it: for each tier, in
// name order, the Caller that a client on it with no entry of its own gets, built by
// the same layering as every request (Resolver.limits), so that no number is computed
// apart from what admission uses.
type TierTable struct {
	Fallback string
	Tiers    []space.Caller
	// Reservations is how the tiers share the cluster bucket out; nil when none
	// reserves anything.
	Reservations *space.Reservations
}
