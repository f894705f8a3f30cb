package flags

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
)

// Flag states of flagd's flag-definition format.
const (
	stateEnabled  = "ENABLED"
	stateDisabled = "DISABLED"
)

// flag is one flag definition, reduced to what a static evaluation needs.
type flag struct {
	enabled  bool
	variant  string // the defaultVariant
	value    any    // the defaultVariant's value, shared by every evaluation: never modified
	metadata map[string]any
}

// parseFlagsFile parses a flags file and runs the validators over every variant of the
// flags they name. It refuses rather than guesses: unknown fields (a typo such as
// "defaultvariant" would otherwise serve nothing), a defaultVariant that is not one of
// the variants, targeting rules, trailing garbage. Every error names the flag.
//
// Every variant is validated, not only the default one: a broken variant is a change
// of defaultVariant away from production.
func parseFlagsFile(data []byte, validators map[string]func(any) error) (map[string]*flag, error) {
	doc, err := decodeObject(data, "$schema", "metadata", "$evaluators", "flags")
	if err != nil {
		return nil, fmt.Errorf("not a flag-definition file: %w", err)
	}
	if raw, ok := doc["$evaluators"]; ok && !isJSONNull(raw) {
		return nil, fmt.Errorf("$evaluators: %w", ErrTargeting)
	}
	rawFlags, ok := doc["flags"]
	if !ok || isJSONNull(rawFlags) {
		return nil, errors.New(`not a flag-definition file: no "flags" object`)
	}
	var defs map[string]json.RawMessage
	if err := json.Unmarshal(rawFlags, &defs); err != nil {
		return nil, fmt.Errorf(`not a flag-definition file: "flags" must be an object of flag key to definition: %w`, err)
	}
	flags := make(map[string]*flag, len(defs))
	for _, key := range sortedKeys(defs) {
		f, err := parseFlag(key, defs[key], validators[key])
		if err != nil {
			return nil, err
		}
		flags[key] = f
	}
	return flags, nil
}

func parseFlag(key string, raw json.RawMessage, validate func(any) error) (*flag, error) {
	fail := func(variant string, err error) (*flag, error) {
		return nil, &FlagError{Flag: key, Variant: variant, Err: err}
	}
	def, err := decodeObject(raw, "state", "variants", "defaultVariant", "targeting", "metadata")
	if err != nil {
		return fail("", err)
	}
	if hasTargeting(def["targeting"]) {
		return fail("", ErrTargeting)
	}
	var (
		state          string
		variants       map[string]json.RawMessage
		defaultVariant *string
		metadata       map[string]any
	)
	for field, dst := range map[string]any{"state": &state, "variants": &variants, "defaultVariant": &defaultVariant, "metadata": &metadata} {
		if raw, ok := def[field]; ok {
			if err := json.Unmarshal(raw, dst); err != nil {
				return fail("", fmt.Errorf("%s: %w", field, err))
			}
		}
	}
	f := &flag{}
	switch state {
	case stateEnabled:
		f.enabled = true
	case stateDisabled:
	default:
		return fail("", fmt.Errorf("state must be %q or %q, got %q", stateEnabled, stateDisabled, truncate(state)))
	}
	if len(variants) == 0 {
		return fail("", errors.New("variants must hold at least one variant"))
	}
	if defaultVariant == nil {
		return fail("", errors.New("defaultVariant is required (the static value served)"))
	}
	f.variant = *defaultVariant
	if _, ok := variants[f.variant]; !ok {
		return fail("", fmt.Errorf("defaultVariant %q is not one of the variants %q", truncate(f.variant), sortedKeys(variants)))
	}
	for _, name := range sortedKeys(variants) {
		var value any
		if err := json.Unmarshal(variants[name], &value); err != nil {
			return fail(name, err)
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
	f.metadata = scalarMetadata(metadata)
	return f, nil
}

// hasTargeting reports whether a flag carries targeting rules. An absent, null or empty
// ({}) targeting is no rule: flagd serves the defaultVariant for those too, and tools
// that generate the format write them.
func hasTargeting(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || isJSONNull(raw) {
		return false
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err == nil && len(obj) == 0 {
		return false
	}
	return true
}

func isJSONNull(raw json.RawMessage) bool {
	return string(bytes.TrimSpace(raw)) == "null"
}

// decodeObject decodes exactly one JSON object into its raw fields, refusing a field
// not in allowed (compared exactly: encoding/json would match struct fields without
// regard to case, so "defaultvariant" would pass) and anything after the object.
func decodeObject(data []byte, allowed ...string) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var obj map[string]json.RawMessage
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, errors.New("want a JSON object, got null")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the JSON object")
	}
	for _, field := range sortedKeys(obj) {
		if !slices.Contains(allowed, field) {
			return nil, fmt.Errorf("unknown field %q (want one of %q)", truncate(field), allowed)
		}
	}
	return obj, nil
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
		if !ok || o.enabled != c.enabled || o.variant != c.variant || !reflect.DeepEqual(o.value, c.value) {
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
