package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
)

// decodeJSON reads exactly one JSON object from the body into v, refusing unknown
// fields, trailing data and bodies over the limit, each as a 400 naming what is wrong.
// A body that is not declared application/json is a 415; a string holding bytes that
// are not UTF-8 is a 400 naming its field, where encoding/json would silently replace
// them.
func decodeJSON(r *http.Request, v any) error {
	body, buf, err := readJSON(r)
	if err != nil {
		return err
	}
	defer giveBody(buf)
	return decodeJSONBody(body, v)
}

// bodyBuffers holds the buffers request bodies are read into: what is decoded from a
// body is copied out of it (strings are), so a buffer serves the next request once its
// body is decoded.
var bodyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readJSON reads a JSON request's body: declared application/json (else 415), within
// the limit, UTF-8 (else a 400 naming the field that is not). The body is read into
// buf and good until buf is given back (giveBody); nothing decoded from it may keep a
// reference into it.
func readJSON(r *http.Request) (body []byte, buf *bytes.Buffer, err error) {
	if err := checkJSONContentType(r.Header["Content-Type"]); err != nil {
		return nil, nil, err
	}
	buf = bodyBuffers.Get().(*bytes.Buffer)
	buf.Reset()
	if _, err := buf.ReadFrom(r.Body); err != nil {
		giveBody(buf)
		return nil, nil, jsonError(err)
	}
	body = buf.Bytes()
	if !utf8.Valid(body) {
		err := space.FieldError(space.EINVALID, invalidUTF8Field(body), "is not valid UTF-8")
		giveBody(buf)
		return nil, nil, err
	}
	return body, buf, nil
}

// giveBody gives back a buffer readJSON read a body into. The pool keeps the buffers
// of ordinary bodies: one grown past the default limit (by a body near it, or a larger
// one where SPACE_MAX_BODY_BYTES is raised) is left to the GC.
func giveBody(buf *bytes.Buffer) {
	if buf.Cap() <= config.DefaultMaxBodyBytes {
		bodyBuffers.Put(buf)
	}
}

// decodeJSONBody decodes body, read by readJSON, into v as decodeJSON does.
func decodeJSONBody(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if skipJSONSpace(body, int(dec.InputOffset())) != len(body) {
		return space.FieldError(space.EINVALID, "body", "must hold a single JSON object and nothing after it")
	}
	return checkKeys(body, v)
}

// knownKeys caches, by struct type, the JSON names of its fields.
var knownKeys sync.Map // reflect.Type -> []string

// fieldNames is the JSON names of the fields of the struct v points to, nil when v is
// not a struct.
func fieldNames(v any) []string {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	if cached, ok := knownKeys.Load(t); ok {
		return cached.([]string)
	}
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
	}
	cached, _ := knownKeys.LoadOrStore(t, names)
	return cached.([]string)
}

// checkKeys refuses what encoding/json lets through a struct: a key that names a field
// in another case ("Template" decodes into template) and a key given twice (the last
// one wins). Both would let a body mean one thing to a proxy or a log reader that
// checks "template" and another to space-api. v is the struct (pointer) body was
// decoded into; body is one JSON value that decoded cleanly, so it is valid JSON.
//
// It walks the object's top-level keys over the bytes once and allocates nothing for a
// body whose keys carry no escape: every create, refused ones included, passes here,
// and json.Decoder's token API cost about 45 allocations a body (BenchmarkDecodeJSON).
func checkKeys(body []byte, v any) error {
	names := fieldNames(v)
	if names == nil {
		return nil
	}
	i := skipJSONSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil // null, or not an object: Decode has answered already
	}
	i++
	var seen uint64 // bit n: names[n] was given (a struct of over 64 fields is not checked for repeats past the 64th)
	for {
		i = skipJSONSpace(body, i)
		if i >= len(body) || body[i] == '}' {
			return nil
		}
		if body[i] == ',' {
			i = skipJSONSpace(body, i+1)
		}
		end := jsonStringEnd(body, i)
		n := keyIndex(names, body[i+1:end-1])
		if n < 0 {
			key := string(body[i+1 : end-1])
			if strings.IndexByte(key, '\\') >= 0 { // an escaped key: compare what it says
				if err := json.Unmarshal(body[i:end], &key); err != nil {
					return jsonError(err)
				}
				n = slices.Index(names, key)
			}
			if n < 0 {
				return unknownKey(names, key)
			}
		}
		if n < 64 {
			if seen&(1<<n) != 0 {
				return space.FieldError(space.EINVALID, names[n], "is given twice")
			}
			seen |= 1 << n
		}
		i = skipJSONSpace(body, end)
		i = skipJSONValue(body, i+1) // past the ':'
	}
}

// keyIndex is the index in names of the raw (unescaped) key, -1 if none is equal.
func keyIndex(names []string, raw []byte) int {
	for n, name := range names {
		if name == string(raw) {
			return n
		}
	}
	return -1
}

// unknownKey refuses a key that names no field, naming the field it names in another
// case if there is one.
func unknownKey(names []string, key string) error {
	for _, name := range names {
		if strings.EqualFold(name, key) {
			return space.FieldError(space.EINVALID, name, "is given as %s: field names are case-sensitive", quoteField(key))
		}
	}
	return space.FieldError(space.EINVALID, "body", "has an unknown field %s", quoteField(key))
}

// skipJSONSpace is the index of the first byte at or after i that is not JSON
// whitespace.
func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// jsonStringEnd is the index just past the closing quote of the string that opens at
// b[i]; b is valid JSON.
func jsonStringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipJSONValue is the index of the ',' or '}' that ends the object member whose value
// starts at or after i (after whitespace); b is valid JSON.
func skipJSONValue(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			i = jsonStringEnd(b, i) - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
		case ',':
			if depth == 0 {
				return i
			}
		}
	}
	return i
}

// checkJSONContentType accepts one Content-Type that is application/json as a media
// type (RFC 9110: case-insensitive, parameters such as charset=utf-8 allowed) and
// refuses anything else, none included, with a 415.
func checkJSONContentType(values []string) error {
	if len(values) != 1 {
		return space.FieldError(space.EUNSUPPORTED, "Content-Type", "send one Content-Type: application/json with a body")
	}
	// What nearly every client sends, accepted without parsing (ParseMediaType builds a
	// map per call); anything else is parsed.
	if strings.EqualFold(values[0], "application/json") {
		return nil
	}
	mt, params, err := mime.ParseMediaType(values[0])
	switch {
	case err != nil || mt != "application/json":
		return space.FieldError(space.EUNSUPPORTED, "Content-Type", "must be application/json, got %s", quoteField(values[0]))
	case params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8"):
		return space.FieldError(space.EUNSUPPORTED, "Content-Type", "the body must be UTF-8, got charset %s", quoteField(params["charset"]))
	}
	return nil
}

// invalidUTF8Field names the field of the first JSON string in body that holds bytes
// that are not UTF-8: "template", "metadata.<key>", or the object holding a key that is
// not UTF-8 itself. Body stands in when the JSON is too broken to walk.
func invalidUTF8Field(body []byte) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	type frame struct {
		object  bool
		key     string // the current key, once read
		wantKey bool   // the next string in this object is a key
	}
	var stack []frame
	path := func() string {
		var parts []string
		for _, f := range stack {
			if f.object && f.key != "" {
				parts = append(parts, f.key)
			}
		}
		if len(parts) == 0 {
			return "body"
		}
		return strings.Join(parts, ".")
	}
	var prev int64
	for {
		tok, err := dec.Token()
		if err != nil {
			return "body"
		}
		end := dec.InputOffset()
		valid := utf8.Valid(body[prev:end])
		prev = end
		var top *frame
		if len(stack) > 0 {
			top = &stack[len(stack)-1]
		}
		isKey := top != nil && top.object && top.wantKey
		if !valid {
			// A bad value is named by its key; a bad key by the object holding it.
			return path()
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				if top != nil && top.object {
					top.wantKey = true
				}
				stack = append(stack, frame{object: true, wantKey: true})
			case '[':
				if top != nil && top.object {
					top.wantKey = true
				}
				stack = append(stack, frame{})
			default:
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].object {
					stack[len(stack)-1].key = ""
				}
			}
		default:
			if isKey {
				top.key, top.wantKey = fmt.Sprint(t), false
			} else if top != nil && top.object {
				top.key, top.wantKey = "", true
			}
		}
	}
}

// jsonError turns a decoding error into a 400 that names the offending field where the
// decoder knows it.
func jsonError(err error) error {
	var de *space.Error
	if errors.As(err, &de) {
		return de // a field's own decoder said what is wrong (see metadata)
	}
	var (
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
		mbe    *http.MaxBytesError
	)
	switch {
	case errors.Is(err, io.EOF):
		return space.FieldError(space.EINVALID, "body", "is empty; want a JSON object")
	case errors.As(err, &mbe):
		return space.FieldError(space.EINVALID, "body", "is larger than the limit of %d bytes", mbe.Limit)
	case errors.As(err, &syntax):
		return space.FieldError(space.EINVALID, "body", "is not valid JSON (at byte %d): %s", syntax.Offset, syntax.Error())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return space.FieldError(space.EINVALID, "body", "is truncated JSON")
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		return space.FieldError(space.EINVALID, field, "must be %s, got %s", jsonKind(typ.Type.Kind().String()), typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		if unquoted, qerr := strconv.Unquote(name); qerr == nil {
			name = unquoted
		}
		if name == "" || len(name) > 64 {
			return space.FieldError(space.EINVALID, "body", "has an unknown field %s", quoteField(name))
		}
		return space.FieldError(space.EINVALID, name, "is not a known field")
	}
	return space.FieldError(space.EINVALID, "body", "cannot be decoded: %s", err.Error())
}

func quoteField(name string) string {
	if len(name) > 64 {
		name = name[:64] + "..."
	}
	return strconv.Quote(name)
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "map", "struct":
		return "an object"
	case "slice", "array":
		return "an array"
	}
	return fmt.Sprintf("of type %s", goKind)
}

// writeJSON writes v as a JSON response with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
