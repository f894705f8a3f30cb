package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/space-sandbox/space"
)

// decodeJSON reads exactly one JSON object from the body into v, refusing unknown
// fields, trailing data and bodies over the limit, each as a 400 naming what is wrong.
func decodeJSON(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return space.FieldError(space.EINVALID, "Content-Type", "must be application/json, got %q", ct)
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return jsonError(err)
		}
		return space.FieldError(space.EINVALID, "body", "must hold a single JSON object and nothing after it")
	}
	return nil
}

// jsonError turns a decoding error into a 400 that names the offending field where the
// decoder knows it.
func jsonError(err error) error {
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
