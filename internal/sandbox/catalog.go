package sandbox

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/substrate"
)

// Catalog resolves a requested shape into something a substrate can cold start: a
// known template, within the global caps (SPACE_MAX_*) and the template's own.
type Catalog struct {
	// Templates are the templates in force: a fixed set, or the reloading store.
	Templates substrate.TemplateSource
	// Max holds the global caps; a zero field is no cap.
	Max space.Shape
}

// Resolve returns the template of shape, or an EUNPROCESSABLE error naming the field
// that cannot be served. Nothing has been charged when it fails.
func (c Catalog) Resolve(shape space.Shape) (substrate.Template, error) {
	ts := c.Templates.Current()
	tmpl, ok := ts[shape.Template]
	if !ok {
		names := ts.Names()
		return substrate.Template{}, space.FieldError(space.EUNPROCESSABLE, "template",
			"template %q is not known; known templates: %s", shape.Template, strings.Join(names, ", "))
	}
	for _, f := range []struct {
		field      string
		value, max int
		env        string
	}{
		{"cpu_millis", shape.CPUMillis, c.Max.CPUMillis, "SPACE_MAX_CPU_MILLIS"},
		{"memory_mib", shape.MemoryMiB, c.Max.MemoryMiB, "SPACE_MAX_MEMORY_MIB"},
		{"disk_gib", shape.DiskGiB, c.Max.DiskGiB, "SPACE_MAX_DISK_GIB"},
	} {
		if f.max > 0 && f.value > f.max {
			return substrate.Template{}, space.FieldError(space.EUNPROCESSABLE, f.field,
				"%d is over the cluster's cap of %d", f.value, f.max)
		}
	}
	if field, limit, ok := tmpl.Fits(shape); !ok {
		return substrate.Template{}, space.FieldError(space.EUNPROCESSABLE, field,
			"is over template %q's cap of %d", shape.Template, limit)
	}
	return tmpl, nil
}

// Request limits. They bound what a client can make us store and log.
const (
	maxTemplateLen    = 128
	maxMetadataKeys   = 32
	maxMetadataKeyLen = 63
	maxMetadataValLen = 256
)

// templateName reports whether s is a template's name: a letter or digit, then
// letters, digits, '.', '_' or '-' (^[A-Za-z0-9][A-Za-z0-9._-]*$, which a regexp
// matched in a tenth of a microsecond more on every create: TestTemplateName).
func templateName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || i > 0 && (c == '.' || c == '_' || c == '-')) {
			return false
		}
	}
	return s != ""
}

// ValidateCreate checks a create request's shape and metadata, the first check of a create:
// an EINVALID error naming the field, before any limit or bucket is touched. Whether
// the shape can be served is Resolve's question, asked later.
func ValidateCreate(shape space.Shape, metadata map[string]string) error {
	switch {
	case shape.Template == "":
		return space.FieldError(space.EINVALID, "template", "is required")
	case len(shape.Template) > maxTemplateLen || !templateName(shape.Template):
		return space.FieldError(space.EINVALID, "template", "must be 1-%d letters, digits, '.', '_' or '-'", maxTemplateLen)
	}
	for _, f := range []struct {
		name  string
		value int
	}{{"cpu_millis", shape.CPUMillis}, {"memory_mib", shape.MemoryMiB}, {"disk_gib", shape.DiskGiB}} {
		switch {
		case f.value <= 0:
			return space.FieldError(space.EINVALID, f.name, "must be a positive integer, got %d", f.value)
		case f.value > math.MaxInt32:
			// Well formed, but no cap could ever allow it and no column holds it.
			return space.FieldError(space.EUNPROCESSABLE, f.name, "%d is over the largest size any sandbox can have (%d)", f.value, math.MaxInt32)
		}
	}
	if len(metadata) > maxMetadataKeys {
		return space.FieldError(space.EINVALID, "metadata", "has %d keys; at most %d are allowed", len(metadata), maxMetadataKeys)
	}
	for k, v := range metadata {
		if k == "" || len(k) > maxMetadataKeyLen || !text(k) {
			return space.FieldError(space.EINVALID, "metadata", "keys must be 1-%d bytes of UTF-8 text without NUL", maxMetadataKeyLen)
		}
		if len(v) > maxMetadataValLen {
			return space.FieldError(space.EINVALID, "metadata."+k, "is longer than %d bytes", maxMetadataValLen)
		}
		if !text(v) {
			return space.FieldError(space.EINVALID, "metadata."+k, "must be UTF-8 text without NUL")
		}
	}
	return nil
}

// text reports whether s can be stored and shown as text: valid UTF-8 without NUL,
// which Postgres refuses in text and jsonb.
func text(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// validID reports whether s is a sandbox id (a UUID in its canonical text form), so
// that nothing else reaches a query.
func validID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// CheckID returns an EINVALID error naming the id parameter when s is not an id.
func CheckID(s string) error {
	if !validID(s) {
		return space.FieldError(space.EINVALID, "id", "%s is not a sandbox id", quoteShort(s))
	}
	return nil
}

func quoteShort(s string) string {
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return fmt.Sprintf("%q", s)
}
