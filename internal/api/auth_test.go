package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/apikey"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
)

func TestParseBearer(t *testing.T) {
	t.Parallel()
	for header, want := range map[string]string{
		"Bearer spk_abc":     "spk_abc",
		"bearer spk_abc":     "spk_abc",
		"BEARER   spk_a-b.c": "spk_a-b.c",
		"Bearer ":            "",
		"Bearer":             "",
		"Basic spk_abc":      "",
		"Bearer spk abc":     "",
		"Bearer spk\x00abc":  "",
		"":                   "",
	} {
		got, err := ParseBearer(header)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("ParseBearer(%q) = %q, %v; want %q", header, got, err, want)
		}
	}
}

func TestSourceKey(t *testing.T) {
	t.Parallel()
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct {
		name, remote, xff, want string
	}{
		{"a direct peer is itself", "192.0.2.7:5000", "", "192.0.2.7"},
		{"an untrusted peer's X-Forwarded-For is ignored", "192.0.2.7:5000", "198.51.100.1", "192.0.2.7"},
		{"a trusted proxy speaks for the address it forwarded", "10.1.2.3:5000", "198.51.100.1", "198.51.100.1"},
		{"the nearest untrusted hop is taken, not a spoofed first one", "10.1.2.3:5000", "203.0.113.9, 198.51.100.1, 10.9.9.9", "198.51.100.1"},
		{"an IPv6 source is its /64", "[2001:db8:1:2:3:4:5:6]:443", "", "2001:db8:1:2::/64"},
		{"an IPv4-mapped IPv6 peer is its IPv4 address", "[::ffff:192.0.2.7]:80", "", "192.0.2.7"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.remote
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		if got := sourceKey(r, trusted); got != tc.want {
			t.Errorf("%s: sourceKey = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// noKeys finds no key: every well-formed secret is unknown.
type noKeys struct{}

func (noKeys) Lookup(context.Context, string) (apikey.Key, error) {
	return apikey.Key{}, apikey.ErrInvalid
}

// FuzzAuthorization feeds any Authorization header to the API key authenticator: it
// never panics, and it either refuses with a 401 or (never, here) accepts.
func FuzzAuthorization(f *testing.F) {
	for _, seed := range []string{"", "Bearer spk_x", "bearer  " + strings.Repeat("A", 600), "Basic Zm9vOmJhcg==", "Bearer \xff\xfe", "Bearer a b", "Bearer=", "Bearer spk_" + strings.Repeat("A", 43)} {
		f.Add(seed)
	}
	auth := &APIKey{Keys: noKeys{}}
	f.Fuzz(func(t *testing.T, header string) {
		r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
		r.Header["Authorization"] = []string{header}
		id, err := auth.Authenticate(r)
		if err == nil || id != "" {
			t.Fatalf("header %q authenticated as %q", header, id)
		}
		if Status(err) != http.StatusUnauthorized {
			t.Fatalf("header %q: status %d (%v), want 401", header, Status(err), err)
		}
	})
}

// FuzzCreateBody feeds any body to the create path's decoding, validation and shape
// resolution, the steps that run before anything is charged: it never panics and
// every refusal is a 400 or a 422.
func FuzzCreateBody(f *testing.F) {
	for _, seed := range []string{
		`{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10}`,
		`{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10,"metadata":{"a":"b"}}`,
		`{"template":"x","cpu_millis":-1}`, `{"template":1}`, `[]`, `null`, `{"cpu_millis":1e400}`,
		`{"template":"python-3.12","cpu_millis":99999999999999999999}`, `{}{}`, `{"metadata":{"":""}}`, "\xff",
	} {
		f.Add(seed)
	}
	catalog := sandbox.Catalog{
		Templates: substrate.Templates{"python-3.12": {Name: "python-3.12", Image: "python", MaxDiskGiB: 50}},
		Max:       space.Shape{CPUMillis: 16000, MemoryMiB: 65536, DiskGiB: 100},
	}
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		r.Body = http.MaxBytesReader(rec, r.Body, 64<<10)
		req, err := createRequest(r)
		if err == nil {
			if err = sandbox.ValidateCreate(req.Shape, req.Metadata); err == nil {
				_, err = catalog.Resolve(req.Shape)
			}
		}
		if err == nil {
			return
		}
		var de *space.Error
		if !errors.As(err, &de) {
			t.Fatalf("body %q: %v is not a domain error", body, err)
		}
		if s := Status(err); s != http.StatusBadRequest && s != http.StatusUnprocessableEntity {
			t.Fatalf("body %q: status %d (%v)", body, s, err)
		}
		if de.Field == "" {
			t.Fatalf("body %q: %v names no field", body, err)
		}
	})
}

func TestDecodeJSONIsStrict(t *testing.T) {
	t.Parallel()

	for name, tc := range map[string]struct{ body, field string }{
		"a field named in another case is refused, naming the field": {
			`{"Template":"python-3.12","cpu_millis":1,"memory_mib":1,"disk_gib":1}`, "template"},
		"a field given twice is refused, naming it (the last would win)": {
			`{"template":"x","template":"python-3.12","cpu_millis":1,"memory_mib":1,"disk_gib":1}`, "template"},
		"null metadata is refused, not read as none": {
			`{"template":"python-3.12","cpu_millis":1,"memory_mib":1,"disk_gib":1,"metadata":null}`, "metadata"},
		"a null metadata value is refused, not stored as an empty string": {
			`{"template":"python-3.12","cpu_millis":1,"memory_mib":1,"disk_gib":1,"metadata":{"team":null}}`, "metadata.team"},
		"a metadata value that is not a string is refused": {
			`{"template":"python-3.12","cpu_millis":1,"memory_mib":1,"disk_gib":1,"metadata":{"n":1}}`, "metadata.n"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(tc.body))
			r.Header.Set("Content-Type", "application/json")
			var b createBody
			err := decodeJSON(r, &b)
			var de *space.Error
			if !errors.As(err, &de) || de.Code != space.EINVALID || de.Field != tc.field {
				t.Fatalf("decode = %v, want EINVALID naming %q", err, tc.field)
			}
		})
	}

	t.Run("a body with every field once, in the right case, decodes", func(t *testing.T) {
		t.Parallel()
		r := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(
			`{"template":"python-3.12","cpu_millis":1,"memory_mib":2,"disk_gib":3,"metadata":{"team":"ml"}}`))
		r.Header.Set("Content-Type", "application/json")
		var b createBody
		if err := decodeJSON(r, &b); err != nil || b.Metadata["team"] != "ml" || b.DiskGiB != 3 {
			t.Fatalf("decode = %+v, %v", b, err)
		}
	})
}

// FuzzCreateBodyPlain holds createBody.decodePlain to the strict decoder: a body it
// decodes, decodeJSONBody decodes without an error into the same create, and the
// bodies a client usually sends take it.
func FuzzCreateBodyPlain(f *testing.F) {
	usual := []string{
		`{"template":"python-3.12","cpu_millis":500,"memory_mib":1024,"disk_gib":5}`,
		" {\n \"disk_gib\" : 10 ,\t\"template\":\"node-22\" } \r\n",
		`{}`, `{"cpu_millis":-0}`, `{"template":""}`, `{"memory_mib":123456789012345678}`,
	}
	for _, seed := range usual {
		f.Add(seed)
	}
	for _, seed := range []string{
		`{"template":"a","template":"b"}`, `{"Template":"a"}`, `{"template":"a\"b"}`, `{"template":"é"}`,
		`{"cpu_millis":1.0}`, `{"cpu_millis":1e3}`, `{"cpu_millis":01}`, `{"cpu_millis":1234567890123456789}`,
		`{"metadata":{}}`, `{"template":null}`, `{"template":"a",}`, `{"template":"a"}x`, `[]`, `{"cpu_millis":-}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var fast createBody
		if !fast.decodePlain([]byte(body)) {
			for _, u := range usual {
				if body == u {
					t.Fatalf("the usual body %q is not decoded plainly", body)
				}
			}
			return
		}
		var strict createBody
		if err := decodeJSONBody([]byte(body), &strict); err != nil {
			t.Fatalf("body %q: decoded plainly as %+v, the strict decoder refuses it: %v", body, fast, err)
		}
		if !reflect.DeepEqual(fast, strict) {
			t.Fatalf("body %q: decoded plainly as %+v, strictly as %+v", body, fast, strict)
		}
	})
}
