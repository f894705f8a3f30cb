package flags

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Flag states of flagd's flag-definition format.
const (
	stateEnabled  = "ENABLED"
	stateDisabled = "DISABLED"
)

// flag is one flag definition, reduced to what a static evaluation needs.
type flag struct {
	enabled bool
	// variant is the defaultVariant; "" when the definition has none (absent or null,
	// valid since flagd schema 0.2.12): the flag then serves the caller's default.
	variant  string
	value    any // the defaultVariant's value, shared by every evaluation: never modified
	metadata map[string]any
}

// Fields of flagd's flag-definition format, at the top and in a flag.
var (
	topFields  = []string{"$schema", "metadata", "$evaluators", "flags"}
	flagFields = []string{"state", "variants", "defaultVariant", "targeting", "metadata"}
)

// parseFlagsFile parses a flags file in flagd's flag-definition format (the providers'
// form: "flags" an object of flag key to definition) and runs the validators over
// every variant of the flags they name. It accepts what flagd's schema accepts, static
// flags only, and refuses what it refuses, naming the flag:
//
//   - a flag needs a state (ENABLED or DISABLED) and at least one variant, all of one
//     type: boolean, string, number or object (an array, a null or a mix is refused);
//   - defaultVariant is a variant's name, or absent or null: the flag then serves the
//     caller's default (flagd's "code default");
//   - metadata, of the file or of a flag, holds strings, numbers and booleans only;
//   - $schema and $evaluators are accepted; targeting rules are refused (ErrTargeting):
//     this provider serves static values, and a rule it ignored would hand everyone
//     the default while the operator believes the rule in force.
//
// Beyond the schema it refuses a defaultVariant that names no variant, and a field
// whose name is a known field's in another case ("defaultvariant"): flagd would ignore
// both, serving what nobody meant. Other unknown fields are allowed by the schema and
// ignored, each reported through warn.
//
// Every variant is validated, not only the default one: a broken variant is a change
// of defaultVariant away from production.
func parseFlagsFile(data []byte, validators map[string]func(any) error, warn func(string)) (map[string]*flag, error) {
	if warn == nil {
		warn = func(string) {}
	}
	// The file is decoded once, into the values the flags then serve: a flag file
	// with a 10,000-client quota flag is a megabyte, and decoding each level again
	// from its raw bytes cost most of a reload (BenchmarkReloadAtSize).
	doc, err := decodeObject(data)
	if err != nil {
		return nil, fmt.Errorf("not a flag-definition file: %w", err)
	}
	if err := checkFields(doc, topFields, "the file", warn); err != nil {
		return nil, fmt.Errorf("not a flag-definition file: %w", err)
	}
	if v, ok := doc["metadata"]; ok {
		if _, err := checkMetadata(v, true); err != nil {
			return nil, fmt.Errorf("metadata: %w", err)
		}
	}
	rawFlags, ok := doc["flags"]
	if !ok || rawFlags == nil {
		return nil, errors.New(`not a flag-definition file: no "flags" object`)
	}
	defs, ok := rawFlags.(map[string]any)
	if !ok {
		return nil, fmt.Errorf(`not a flag-definition file: "flags" must be an object of flag key to definition, not %s (the array form is flagd's own, not a provider's)`, typeName(rawFlags))
	}
	flags := make(map[string]*flag, len(defs))
	for _, key := range sortedKeys(defs) {
		if key == "" {
			return nil, errors.New(`"flags": a flag key must not be empty`)
		}
		f, err := parseFlag(key, defs[key], validators[key], warn)
		if err != nil {
			return nil, err
		}
		flags[key] = f
	}
	return flags, nil
}

func parseFlag(key string, raw any, validate func(any) error, warn func(string)) (*flag, error) {
	fail := func(variant string, err error) (*flag, error) {
		return nil, &FlagError{Flag: key, Variant: variant, Err: err}
	}
	def, ok := raw.(map[string]any)
	if !ok {
		return fail("", fmt.Errorf("a flag definition must be an object, not %s", typeName(raw)))
	}
	if err := checkFields(def, flagFields, fmt.Sprintf("flag %q", key), warn); err != nil {
		return fail("", err)
	}
	if hasTargeting(def["targeting"]) {
		return fail("", ErrTargeting)
	}
	f := &flag{}
	switch state, _ := def["state"].(string); state {
	case stateEnabled:
		f.enabled = true
	case stateDisabled:
	default:
		if _, isString := def["state"].(string); !isString && def["state"] != nil {
			return fail("", fmt.Errorf("state must be a string, not %s", typeName(def["state"])))
		}
		return fail("", fmt.Errorf("state must be %q or %q, got %q", stateEnabled, stateDisabled, truncate(state)))
	}
	variants, ok := def["variants"].(map[string]any)
	if !ok && def["variants"] != nil {
		return fail("", fmt.Errorf("variants must be an object, not %s", typeName(def["variants"])))
	}
	if len(variants) == 0 {
		return fail("", errors.New("variants must hold at least one variant"))
	}
	switch dv := def["defaultVariant"].(type) {
	case nil: // absent or null: the caller's default
	case string:
		f.variant = dv
		if _, ok := variants[f.variant]; !ok {
			return fail("", fmt.Errorf("defaultVariant %q is not one of the variants %q", truncate(f.variant), sortedKeys(variants)))
		}
	default:
		return fail("", fmt.Errorf("defaultVariant must be a string or null, not %s", typeName(dv)))
	}
	kind, first := "", ""
	for _, name := range sortedKeys(variants) {
		if name == "" {
			return fail("", errors.New("a variant name must not be empty"))
		}
		value := variants[name]
		k := variantKind(value)
		switch {
		case k == "":
			return fail(name, fmt.Errorf("a variant is a boolean, a string, a number or an object, not %s", typeName(value)))
		case kind == "":
			kind, first = k, name
		case k != kind:
			return fail(name, fmt.Errorf("variants must all be of one type: %q is %s, %q is %s", first, kind, name, k))
		}
		if validate != nil {
			if err := validate(value); err != nil {
				return fail(name, err)
			}
		}
		if name == f.variant {
			f.value = value
		}
	}
	if v, ok := def["metadata"]; ok {
		metadata, err := checkMetadata(v, false)
		if err != nil {
			return fail("", fmt.Errorf("metadata: %w", err))
		}
		f.metadata = scalarMetadata(metadata)
	}
	return f, nil
}

// variantKind is the flag type a variant value makes: "" for one no flag type holds.
func variantKind(v any) string {
	switch v.(type) {
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case float64:
		return "a number"
	case map[string]any:
		return "an object"
	}
	return ""
}

// checkFields refuses a field whose name is a known one's in another case (a typo
// that flagd would ignore) and reports every other unknown field through warn.
func checkFields(obj map[string]any, known []string, where string, warn func(string)) error {
	for _, field := range sortedKeys(obj) {
		if slices.Contains(known, field) {
			continue
		}
		for _, k := range known {
			if strings.EqualFold(field, k) {
				return fmt.Errorf("unknown field %q: did you mean %q? (flagd would ignore it)", truncate(field), k)
			}
		}
		warn(fmt.Sprintf("%s: field %q is not part of the flag-definition format and is ignored", where, truncate(field)))
	}
	return nil
}

// checkMetadata refuses metadata that is not an object of strings, numbers and
// booleans; the file's flagSetId and version, when there, must be strings. It returns
// the metadata as an object.
func checkMetadata(v any, fileLevel bool) (map[string]any, error) {
	if v == nil {
		return nil, errors.New("must be an object, not null")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("must be an object, not %s", typeName(v))
	}
	for _, k := range sortedKeys(m) {
		switch v := m[k].(type) {
		case string:
		case bool, float64:
			if fileLevel && (k == "flagSetId" || k == "version") {
				return nil, fmt.Errorf("%q must be a string, not %s", k, typeName(v))
			}
		default:
			return nil, fmt.Errorf("%q must be a string, a number or a boolean, not %s", truncate(k), typeName(v))
		}
	}
	return m, nil
}

// hasTargeting reports whether a flag carries targeting rules. An absent, null or empty
// ({}) targeting is no rule: flagd serves the defaultVariant for those too, and tools
// that generate the format write them.
func hasTargeting(v any) bool {
	if v == nil {
		return false
	}
	if obj, ok := v.(map[string]any); ok && len(obj) == 0 {
		return false
	}
	return true
}

// scalarMetadata keeps the metadata values OpenFeature allows (bool, string, number),
// and returns nil when none is left, so that evaluations copy nothing.
func scalarMetadata(m map[string]any) map[string]any {
	var out map[string]any
	for k, v := range m {
		switch v.(type) {
		case bool, string, float64:
			if out == nil {
				out = make(map[string]any, len(m))
			}
			out[k] = v
		}
	}
	return out
}

// changedFlags lists, in order, the keys of flags added, removed, or whose state,
// variant or served value differ between two flag sets.
func changedFlags(old, cur map[string]*flag) []string {
	var changed []string
	for _, key := range sortedKeys(cur) {
		o, ok := old[key]
		c := cur[key]
		if !ok || o.enabled != c.enabled || o.variant != c.variant || !equalValues(o.value, c.value) {
			changed = append(changed, key)
		}
	}
	for _, key := range sortedKeys(old) {
		if _, ok := cur[key]; !ok {
			changed = append(changed, key)
		}
	}
	return changed
}

// equalValues reports whether two decoded JSON values are equal: what
// reflect.DeepEqual says of them, without reflection, which was a seventh of a
// 10,000-client flag's reload (BenchmarkReloadAtSize).
func equalValues(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) || (a == nil) != (b == nil) {
			return false
		}
		for k, v := range a {
			w, ok := b[k]
			if !ok || !equalValues(v, w) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) || (a == nil) != (b == nil) {
			return false
		}
		for i := range a {
			if !equalValues(a[i], b[i]) {
				return false
			}
		}
		return true
	}
	switch b.(type) {
	case map[string]any, []any:
		return false
	}
	return a == b
}
