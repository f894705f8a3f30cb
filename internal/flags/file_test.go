package flags

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// FuzzParseFlagsFile feeds arbitrary bytes to the flags file parser with the default
// validators: no panic, and a file that loads serves only values its validators accept.
func FuzzParseFlagsFile(f *testing.F) {
	for _, seed := range []string{
		quotaFile(designExample),
		flagsFile(map[string]string{WarmPoolFlag: poolExample, "other": `true`}),
		`{"flags": {}}`,
		`{"flags": {"f": {"state": "DISABLED", "variants": {"a": 1}, "defaultVariant": "a"}}}`,
		`{"flags": {"f": {"state": "ENABLED", "variants": {"a": 1}, "defaultVariant": "a", "targeting": {"var": "x"}}}}`,
		`{"$evaluators": {}, "flags": null}`,
		`{"flags": {"space-api-client-concurrency-quotas": {"state": "ENABLED", "variants": {"a": "x"}, "defaultVariant": "a"}}}`,
		`[]`,
		``,
	} {
		f.Add([]byte(seed))
	}
	validators := DefaultValidators(defaultEnv())
	f.Fuzz(func(t *testing.T, data []byte) {
		flags, err := parseFlagsFile(data, validators, nil)
		if err != nil {
			return
		}
		for key, fl := range flags {
			if fl == nil {
				t.Fatalf("flag %q is nil", key)
			}
			if validate := validators[key]; validate != nil && fl.variant != "" {
				if err := validate(fl.value); err != nil {
					t.Fatalf("flag %q loaded with a value its validator refuses: %v", key, err)
				}
			}
		}
	})
}

func TestFlagError(t *testing.T) {
	t.Parallel()

	t.Run("a flag error names the flag and the variant and unwraps to its cause", func(t *testing.T) {
		t.Parallel()
		err := error(&FlagError{Flag: QuotaFlag, Variant: "on", Err: ErrMalformed})
		if got := err.Error(); got != `flag "space-api-client-concurrency-quotas", variant "on": malformed flag value` {
			t.Errorf("Error() = %q", got)
		}
		if !errors.Is(err, ErrMalformed) {
			t.Error("does not unwrap")
		}
	})
}

func TestEqualValues(t *testing.T) {
	t.Parallel()

	docs := []string{
		`null`, `true`, `false`, `0`, `1`, `1.5`, `""`, `"a"`, `"1"`,
		`[]`, `[1]`, `[1,2]`, `[2,1]`, `[[1]]`, `[{"a":1}]`, `[null]`,
		`{}`, `{"a":1}`, `{"a":2}`, `{"b":1}`, `{"a":1,"b":2}`, `{"a":null}`, `{"a":[1]}`, `{"a":{"b":[true]}}`, `{"a":{"b":[false]}}`,
	}
	values := make([]any, len(docs))
	for i, d := range docs {
		if err := json.Unmarshal([]byte(d), &values[i]); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("two decoded JSON values are equal exactly when reflect.DeepEqual says so", func(t *testing.T) {
		t.Parallel()
		for i, a := range values {
			for j, b := range values {
				var again any
				if err := json.Unmarshal([]byte(docs[j]), &again); err != nil { // a copy of b, not b itself
					t.Fatal(err)
				}
				for _, w := range []any{b, again} {
					if got, want := equalValues(a, w), reflect.DeepEqual(a, w); got != want {
						t.Errorf("equalValues(%s, %s) = %v, want %v", docs[i], docs[j], got, want)
					}
				}
			}
		}
	})
}
