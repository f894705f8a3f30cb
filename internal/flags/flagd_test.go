package flags

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/open-feature/go-sdk/openfeature"

	"github.com/space-sandbox/space"
)

// TestFlagdSchemaCompatibility holds the flags file to flagd's flag-definition schema
// (flags.json, v0, the providers' form), case by case from its rules: what the schema
// accepts as a static definition loads, what it refuses is refused naming the flag.
func TestFlagdSchemaCompatibility(t *testing.T) {
	t.Parallel()

	accepted := map[string]string{
		"a flag without defaultVariant (schema 0.2.12)": `{"flags": {"f": {"state": "ENABLED", "variants": {"on": true, "off": false}}}}`,
		"a flag whose defaultVariant is null":           `{"flags": {"f": {"state": "ENABLED", "variants": {"on": true, "off": false}, "defaultVariant": null}}}`,
		"$schema, and metadata of the set and of a flag": `{"$schema": "https://flagd.dev/schema/v0/flags.json",
			"metadata": {"flagSetId": "sso/dev", "version": "1.0.0", "boolean": true, "string": "s", "float": 1.23, "int": 1},
			"flags": {"f": {"state": "ENABLED", "variants": {"red": "#FF0000", "blue": "#0000FF"}, "defaultVariant": "red",
				"metadata": {"boolean": true, "string": "string", "float": 1.23, "int": 1}}}}`,
		"shared $evaluators no flag uses": `{"$evaluators": {"emails": {"in": ["@a.example", {"var": "email"}]}},
			"flags": {"f": {"state": "DISABLED", "variants": {"a": 1, "b": 2.5}, "defaultVariant": "a"}}}`,
		"object variants":                 `{"flags": {"f": {"state": "ENABLED", "variants": {"a": {"x": [1, 2]}, "b": {}}, "defaultVariant": "b"}}}`,
		"fields the schema does not name": `{"$comment": "made by a tool", "flags": {"f": {"state": "ENABLED", "variants": {"on": true}, "defaultVariant": "on", "description": "a boolean"}}}`,
	}
	for name, file := range accepted {
		t.Run(name+" loads", func(t *testing.T) {
			t.Parallel()
			if _, err := parseFlagsFile([]byte(file), nil, nil); err != nil {
				t.Fatalf("refused: %v", err)
			}
		})
	}

	refused := map[string]struct{ file, flag string }{
		"variants of mixed types":               {`{"flags": {"f": {"state": "ENABLED", "variants": {"on": true, "off": "false"}, "defaultVariant": "on"}}}`, "f"},
		"numbers mixed with objects":            {`{"flags": {"f": {"state": "ENABLED", "variants": {"a": 1, "b": {"n": 1}}, "defaultVariant": "a"}}}`, "f"},
		"an array variant":                      {`{"flags": {"f": {"state": "ENABLED", "variants": {"a": [1, 2]}, "defaultVariant": "a"}}}`, "f"},
		"a null variant":                        {`{"flags": {"f": {"state": "ENABLED", "variants": {"a": null}, "defaultVariant": "a"}}}`, "f"},
		"no state":                              {`{"flags": {"f": {"variants": {"on": true}, "defaultVariant": "on"}}}`, "f"},
		"a state not in the enum":               {`{"flags": {"f": {"state": "WILL-FAIL", "variants": {"on": true}, "defaultVariant": "on"}}}`, "f"},
		"no variants":                           {`{"flags": {"f": {"state": "ENABLED"}}}`, "f"},
		"empty variants":                        {`{"flags": {"f": {"state": "ENABLED", "variants": {}, "defaultVariant": "on"}}}`, "f"},
		"an empty variant name":                 {`{"flags": {"f": {"state": "ENABLED", "variants": {"": true}}}}`, "f"},
		"a defaultVariant that is not a string": {`{"flags": {"f": {"state": "ENABLED", "variants": {"on": true}, "defaultVariant": true}}}`, "f"},
		"flag metadata holding an object":       {`{"flags": {"f": {"state": "ENABLED", "variants": {"on": true}, "defaultVariant": "on", "metadata": {"invalid": {"key": "value"}}}}}`, "f"},
		"an empty flag that is not a flag":      {`{"flags": {"ok": {"state": "ENABLED", "variants": {"on": true}}, "not-a-flag": {}}}`, "not-a-flag"},
		"targeting rules":                       {`{"flags": {"f": {"state": "ENABLED", "variants": {"a": 1, "b": 2}, "defaultVariant": "a", "targeting": {"if": [true, "b"]}}}}`, "f"},
	}
	for name, tc := range refused {
		t.Run(name+" is refused, naming the flag", func(t *testing.T) {
			t.Parallel()
			_, err := parseFlagsFile([]byte(tc.file), nil, nil)
			var fe *FlagError
			if !errors.As(err, &fe) || fe.Flag != tc.flag {
				t.Fatalf("err = %v, want a *FlagError naming %q", err, tc.flag)
			}
		})
	}

	for name, file := range map[string]string{
		"set metadata holding an object":                         `{"metadata": {"invalid": {"key": "value"}}, "flags": {}}`,
		"a flagSetId that is not a string":                       `{"metadata": {"flagSetId": 7}, "flags": {}}`,
		"flags as an array (flagd's own form, not a provider's)": `{"flags": [{"key": "f", "state": "ENABLED", "variants": {"on": true}, "defaultVariant": "on"}]}`,
		"an empty flag key":                                      `{"flags": {"": {"state": "ENABLED", "variants": {"on": true}}}}`,
	} {
		t.Run(name+" is refused", func(t *testing.T) {
			t.Parallel()
			if _, err := parseFlagsFile([]byte(file), nil, nil); err == nil {
				t.Fatal("loaded")
			}
		})
	}

	t.Run("a field the schema does not name is reported, not silently dropped", func(t *testing.T) {
		t.Parallel()
		var warnings []string
		_, err := parseFlagsFile([]byte(`{"flags": {"f": {"state": "ENABLED", "variants": {"on": true}, "defaultVariant": "on", "description": "x"}}}`),
			nil, func(s string) { warnings = append(warnings, s) })
		if err != nil || len(warnings) != 1 || !strings.Contains(warnings[0], `"description"`) || !strings.Contains(warnings[0], `flag "f"`) {
			t.Fatalf("err %v, warnings %q: want one naming the flag and the field", err, warnings)
		}
	})

	t.Run("a flag without defaultVariant serves the caller's default, with reason DEFAULT", func(t *testing.T) {
		t.Parallel()
		f := setup(t, `{"flags": {"f": {"state": "ENABLED", "variants": {"on": true, "off": false}, "defaultVariant": null, "metadata": {"owner": "sre"}}}}`)
		for _, def := range []bool{true, false} {
			d, err := f.client.BooleanValueDetails(context.Background(), "f", def, openfeature.EvaluationContext{})
			if err != nil || d.Value != def || d.Reason != openfeature.DefaultReason || d.Variant != "" || d.FlagMetadata["owner"] != "sre" {
				t.Fatalf("evaluation = %+v, %v; want the default %v with reason DEFAULT", d, err, def)
			}
		}
	})

	t.Run("a quota flag without defaultVariant is no quota flag: the env defaults apply", func(t *testing.T) {
		t.Parallel()
		f := setup(t, `{"flags": {"`+QuotaFlag+`": {"state": "ENABLED", "variants": {"on": {"clients": {"acme": {}}}}}}}`)
		if c := f.resolver.Resolve(context.Background(), "acme"); c.Key != space.Unknown || c.Concurrency != DefaultLimits().Concurrency {
			t.Fatalf("acme resolved to %+v, want unknown on the defaults", c)
		}
	})
}

// TestTargetingKey checks that the quota flag is evaluated with the authenticated
// client id as the OpenFeature targetingKey: a provider with targeting (flagd) can give
// a client a variant of its own, with no change to space-api.
func TestTargetingKey(t *testing.T) {
	t.Parallel()
	stub := &stubProvider{perKey: map[string]any{
		"acme":  decode(t, `{"clients": {"acme": {"concurrency": 7}}}`),
		"hooli": decode(t, `{"clients": {"hooli": {"concurrency": 3}}}`),
	}}
	stub.set(decode(t, `{"clients": {}}`))
	f := setup(t, quotaFile(`{}`), withProvider(stub))
	for id, want := range map[space.ClientID]int{"acme": 7, "hooli": 3} {
		c := f.resolver.Resolve(context.Background(), id)
		if c.Key != space.ClientKey(id) || c.Concurrency != want {
			t.Errorf("%s resolved to key %q concurrency %d, want its own variant (%d)", id, c.Key, c.Concurrency, want)
		}
	}
	if c := f.resolver.Resolve(context.Background(), "initech"); c.Key != space.Unknown {
		t.Errorf("a client no rule targets resolved to %q, want unknown", c.Key)
	}
}
