package flags

import (
	"reflect"
	"strings"
	"testing"
)

// decodeSeeds are documents on both sides of every rule the fast path takes on or
// leaves to json.Unmarshal.
var decodeSeeds = []string{
	`{}`, ` { } `, "{\t\"a\"\r\n:\n1}", `{"a":1,"a":2}`, `{"a":{"b":{"c":[1,[2,[3]]]}}}`,
	`{"a":[]}`, `{"a":[{}]}`, `{"a":{},"b":{}}`, `{"a":[1,2],"b":[1,2],"c":[1, 2]}`,
	`{"a":true,"b":false,"c":null}`, `{"a":tru}`, `{"a":nul}`, `{"a":falsey}`, `{"a":truefalse}`,
	`{"a":0,"b":-0,"c":1.5,"d":-2e10,"e":3E+2,"f":4e-3,"g":1234567890123456789012}`,
	`{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`, `{"a":1e}`, `{"a":1e+}`, `{"a":+1}`, `{"a":1e400}`, `{"a":-1e400}`, `{"a":0x10}`,
	`{"a":"x\"y"}`, `{"a":"\u00e9\ud83d\ude00"}`, `{"a":"\ud800"}`, `{"a":"\/\b\f\n\r\t\\"}`, `{"a":"\x"}`, `{"a":"\u12"}`,
	"{\"a\":\"\x01\"}", "{\"a\":\"caf\xc3\xa9\"}", "{\"a\":\"\xff\xfe\"}", "{\"\xff\":1}", `{"\u0061":1,"a":2}`,
	`{"a":1}x`, `{"a":1} {}`, `{"a":1}  `, `{"a":1,}`, `{"a" 1}`, `{"a":1 "b":2}`, `{a:1}`, `{"a":[1,]}`, `{"a":[1 2]}`,
	`{"a":{"b":1}`, `{"a":"`, `{"a`, `{`, `}`, `[]`, `[{}]`, `null`, `true`, `1`, `"a"`, ``, ` `, "\ufeff{}",
	`{"a":{"b":"` + strings.Repeat("x", sharedMax) + `"},"c":{"b":"` + strings.Repeat("x", sharedMax) + `"}}`,
	`{"a":{"b":"]}{["},"c":{"b":"]}{["}}`, `{"a":{"b":"\"}"},"c":{"b":"\"}"}}`,
	quotaFile(largeQuota(100, 5, 0)),
}

// FuzzDecodeObject holds decodeObject to json.Unmarshal's values and errors: whatever
// the bytes, the two decode to equal values or fail with the same message.
func FuzzDecodeObject(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, data)
	})
}

func checkDecode(t *testing.T, data []byte) {
	t.Helper()
	got, err := decodeObject(data)
	want, wantErr := decodeObjectStd(data)
	switch {
	case (err == nil) != (wantErr == nil):
		t.Fatalf("decodeObject(%q): error %v, json.Unmarshal's %v", data, err, wantErr)
	case err != nil && err.Error() != wantErr.Error():
		t.Fatalf("decodeObject(%q): error %q, json.Unmarshal's %q", data, err, wantErr)
	case !reflect.DeepEqual(got, want):
		t.Fatalf("decodeObject(%q) = %#v, json.Unmarshal gives %#v", data, got, want)
	}
}

func TestDecodeObject(t *testing.T) {
	t.Parallel()

	t.Run("every seed decodes as json.Unmarshal decodes it, or fails as it fails", func(t *testing.T) {
		t.Parallel()
		for _, s := range decodeSeeds {
			checkDecode(t, []byte(s))
		}
	})

	t.Run("nesting is bounded where json.Unmarshal bounds it", func(t *testing.T) {
		t.Parallel()
		for _, depth := range []int{maxDepth - 1, maxDepth, maxDepth + 1} {
			doc := `{"a":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + `}`
			checkDecode(t, []byte(doc))
		}
		if _, err := decodeObject([]byte(`{"a":` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `}`)); err == nil {
			t.Error("a document nested deeper than encoding/json allows decoded")
		}
	})

	t.Run("the same short text decodes to one shared value", func(t *testing.T) {
		t.Parallel()
		doc, err := decodeObject([]byte(`{"a": {"tier": "gold"}, "b": {"tier": "gold"}, "c": {"tier":"gold"}, "d": [1, 2], "e": [1, 2]}`))
		if err != nil {
			t.Fatal(err)
		}
		if identity(doc["a"]) != identity(doc["b"]) {
			t.Error(`two {"tier": "gold"} are two maps`)
		}
		if identity(doc["a"]) == identity(doc["c"]) {
			t.Error(`{"tier": "gold"} and {"tier":"gold"} (another text) are one map`)
		}
		if reflect.ValueOf(doc["d"]).Pointer() != reflect.ValueOf(doc["e"]).Pointer() {
			t.Error("two [1, 2] are two slices")
		}
	})

	t.Run("a text longer than sharedMax is decoded each time it appears", func(t *testing.T) {
		t.Parallel()
		long := `{"note": "` + strings.Repeat("x", sharedMax) + `"}`
		doc, err := decodeObject([]byte(`{"a": ` + long + `, "b": ` + long + `}`))
		if err != nil {
			t.Fatal(err)
		}
		if identity(doc["a"]) == identity(doc["b"]) {
			t.Error("two long entries are one map")
		}
		if !reflect.DeepEqual(doc["a"], doc["b"]) {
			t.Errorf("the two long entries differ: %v and %v", doc["a"], doc["b"])
		}
	})
}

func TestParseQuotasSharedEntries(t *testing.T) {
	t.Parallel()

	t.Run("clients whose entries are one text share one parsed entry", func(t *testing.T) {
		t.Parallel()
		v, err := decodeObject([]byte(`{"clients": {"acme": {"concurrency": 3}, "globex": {"concurrency": 3}, "initech": {"concurrency": 4}}}`))
		if err != nil {
			t.Fatal(err)
		}
		q, err := parseQuotas(v)
		if err != nil {
			t.Fatal(err)
		}
		if q.Clients["acme"] != q.Clients["globex"] {
			t.Error("acme's and globex's entries, one text, were parsed twice")
		}
		if *q.Clients["acme"].Concurrency != 3 || *q.Clients["initech"].Concurrency != 4 {
			t.Errorf("concurrency acme %d, initech %d; want 3 and 4", *q.Clients["acme"].Concurrency, *q.Clients["initech"].Concurrency)
		}
	})

	t.Run("a bad entry shared by several clients is reported under the first of them", func(t *testing.T) {
		t.Parallel()
		v, err := decodeObject([]byte(`{"clients": {"zeta": {"concurrency": -1}, "beta": {"concurrency": -1}, "alpha": {"concurrency": 1}}}`))
		if err != nil {
			t.Fatal(err)
		}
		for range 20 { // map order varies: the id reported must not
			_, err := parseQuotas(v)
			if err == nil || !strings.HasPrefix(err.Error(), "clients.beta: ") {
				t.Fatalf("error %v, want one of clients.beta", err)
			}
		}
	})
}
