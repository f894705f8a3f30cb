package flags

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"unsafe"
)

// sharedMax is the longest text of an object or array that decodeObject decodes once
// and shares wherever the same text appears again in the file. A quota flag's client
// entries ({"tier": "gold"}, {"tier": "pro", "concurrency": 20}) are a few dozen bytes
// and repeat thousands of times in a table of 10,000 clients; 128 bytes holds any
// entry of a few fields and keeps the texts remembered during one decode small.
const sharedMax = 128

// maxDepth is encoding/json's bound on nesting: a deeper document is left to it, and
// refused with its error.
const maxDepth = 10000

// decodeObject decodes exactly one JSON object, refusing anything after it, into the
// values json.Unmarshal into a map[string]any gives (numbers float64, objects
// map[string]any, arrays []any), with one difference: an object or array whose text is
// at most sharedMax bytes is decoded once per distinct text, and that one value is
// shared wherever the text appears. The values are never modified (a flag's value is
// shared by every evaluation), so sharing one is the same as holding copies.
//
// Why: a 10,000-client quota flag is hundreds of kilobytes whose entries repeat, and
// its reload (decode, validate, swap) every 500 ms raised the p99 of the creates
// beside it by 1.5–1.8× on two cores, in proportion to the reload's CPU time
// (docs/benchmarks.md, "A reload that decodes a repeated entry once"). Decoding each
// repeated entry once takes most of the decode's allocations away, and the quota
// flag's parse (parseQuotas) parses a shared entry once.
//
// The fast path takes on well-formed documents only. Anything else (a syntax error, a
// number strconv cannot hold, nesting deeper than maxDepth, data after the object)
// goes to json.Unmarshal as a whole, so that the error is encoding/json's own word for
// word; a string with an escape or a byte outside ASCII is decoded by json.Unmarshal
// alone, which owns the escapes, surrogate pairs and the U+FFFD that replaces invalid
// UTF-8. FuzzDecodeObject holds the two to the same values and the same errors.
func decodeObject(data []byte) (map[string]any, error) {
	d := decoder{data: data}
	if obj, ok := d.document(); ok {
		return obj, nil
	}
	return decodeObjectStd(data)
}

// decodeObjectStd is decodeObject by json.Unmarshal alone. json.Unmarshal rather than
// a Decoder over data: a Decoder copies the file into a buffer of its own as it grows,
// 2.2 MB of garbage a reload of a 10,000-client flag (BenchmarkReloadAtSize).
func decodeObjectStd(data []byte) (map[string]any, error) {
	var obj map[string]any
	if err := json.Unmarshal(data, &obj); err != nil {
		if se, ok := errors.AsType[*json.SyntaxError](err); ok && strings.Contains(se.Error(), "after top-level value") {
			return nil, errors.New("unexpected data after the JSON object")
		}
		return nil, err
	}
	if obj == nil {
		return nil, errors.New("want a JSON object, got null")
	}
	return obj, nil
}

// decoder is decodeObject's fast path. Its methods report false, and leave the
// document to json.Unmarshal, at the first thing they do not take on.
type decoder struct {
	data  []byte
	pos   int
	depth int
	// shared maps the text of each object and array of at most sharedMax bytes decoded
	// so far to its value.
	shared map[string]any
	// members and elems are the members and elements of the objects and arrays being
	// decoded, innermost last: each is copied into a map or slice of its exact size
	// when its closing bracket is read, so that no map grows while it is filled.
	members []member
	elems   []any
}

type member struct {
	key   string
	value any
}

func (d *decoder) document() (map[string]any, bool) {
	if !d.at('{') {
		return nil, false
	}
	v, ok := d.composite()
	if !ok {
		return nil, false
	}
	d.space()
	if d.pos != len(d.data) {
		return nil, false
	}
	return v.(map[string]any), true
}

// at steps over white space and reports whether c comes next (not stepped over).
func (d *decoder) at(c byte) bool {
	d.space()
	return d.pos < len(d.data) && d.data[d.pos] == c
}

func (d *decoder) space() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *decoder) value() (any, bool) {
	d.space()
	if d.pos >= len(d.data) {
		return nil, false
	}
	switch c := d.data[d.pos]; {
	case c == '{' || c == '[':
		return d.composite()
	case c == '"':
		s, ok := d.str()
		return s, ok
	case c == 't':
		return true, d.literal("true")
	case c == 'f':
		return false, d.literal("false")
	case c == 'n':
		return nil, d.literal("null")
	case c == '-' || '0' <= c && c <= '9':
		return d.number()
	}
	return nil, false
}

// composite decodes the object or array at d.pos, or hands out the value decoded from
// the same text before.
func (d *decoder) composite() (any, bool) {
	start := d.pos
	end := d.extent()
	if end > 0 {
		if v, ok := d.shared[string(d.data[start:end])]; ok {
			d.pos = end
			return v, true
		}
	}
	if d.depth++; d.depth > maxDepth {
		return nil, false
	}
	var v any
	var ok bool
	if d.data[start] == '{' {
		v, ok = d.object()
	} else {
		v, ok = d.array()
	}
	d.depth--
	if !ok {
		return nil, false
	}
	if end > 0 {
		if d.pos != end { // extent and the decode disagree: leave it to json.Unmarshal
			return nil, false
		}
		if d.shared == nil {
			d.shared = make(map[string]any)
		}
		// The key is the text in place, not a copy: d.data outlives d.shared, which
		// is dropped with the decoder, and nothing writes to it meanwhile.
		d.shared[unsafe.String(&d.data[start], end-start)] = v
	}
	return v, true
}

// extent is the end of the object or array at d.pos when its text is at most
// sharedMax bytes, and -1 otherwise. It only matches brackets outside strings: the
// decode that follows a miss checks the text, and a hit's text is one it checked.
func (d *decoder) extent() int {
	depth := 0
	limit := min(len(d.data), d.pos+sharedMax)
	for i := d.pos; i < limit; i++ {
		switch d.data[i] {
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return i + 1
			}
		case '"':
			for i++; i < limit && d.data[i] != '"'; i++ {
				if d.data[i] == '\\' {
					i++
				}
			}
		}
	}
	return -1
}

func (d *decoder) object() (any, bool) {
	if d.open('}') {
		return map[string]any{}, true
	}
	base := len(d.members)
	for more := true; more; {
		if !d.at('"') {
			return nil, false
		}
		k, ok := d.str()
		if !ok {
			return nil, false
		}
		if !d.at(':') {
			return nil, false
		}
		d.pos++
		v, ok := d.value()
		if !ok {
			return nil, false
		}
		d.members = append(d.members, member{k, v})
		if more, ok = d.next('}'); !ok {
			return nil, false
		}
	}
	ms := d.members[base:]
	m := make(map[string]any, len(ms))
	for _, x := range ms {
		m[x.key] = x.value // a repeated key: the last one, as json.Unmarshal
	}
	clear(ms)
	d.members = d.members[:base]
	return m, true
}

func (d *decoder) array() (any, bool) {
	if d.open(']') {
		return []any{}, true
	}
	base := len(d.elems)
	for more := true; more; {
		v, ok := d.value()
		if !ok {
			return nil, false
		}
		d.elems = append(d.elems, v)
		if more, ok = d.next(']'); !ok {
			return nil, false
		}
	}
	es := d.elems[base:]
	a := make([]any, len(es))
	copy(a, es)
	clear(es)
	d.elems = d.elems[:base]
	return a, true
}

// open steps over the opening bracket at d.pos, and reports whether the closing one,
// end, follows at once (stepped over too).
func (d *decoder) open(end byte) bool {
	d.pos++
	d.space()
	if d.pos < len(d.data) && d.data[d.pos] == end {
		d.pos++
		return true
	}
	return false
}

// next steps over what follows a member or an element: a comma (more) or the closing
// bracket end; ok is false for anything else.
func (d *decoder) next(end byte) (more, ok bool) {
	d.space()
	if d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ',':
			d.pos++
			return true, true
		case end:
			d.pos++
			return false, true
		}
	}
	return false, false
}

// str decodes the string at d.pos (its opening quote).
func (d *decoder) str() (string, bool) {
	start := d.pos
	for i := start + 1; i < len(d.data); i++ {
		switch c := d.data[i]; {
		case c == '"':
			d.pos = i + 1
			return string(d.data[start+1 : i]), true
		case c == '\\' || c >= 0x80:
			return d.escaped(start)
		case c < 0x20:
			return "", false
		}
	}
	return "", false
}

// escaped decodes, by json.Unmarshal, the string at start that holds an escape or a
// byte outside ASCII.
func (d *decoder) escaped(start int) (string, bool) {
	for i := start + 1; i < len(d.data); i++ {
		switch d.data[i] {
		case '\\':
			i++
		case '"':
			var s string
			if json.Unmarshal(d.data[start:i+1], &s) != nil {
				return "", false
			}
			d.pos = i + 1
			return s, true
		}
	}
	return "", false
}

func (d *decoder) literal(word string) bool {
	end := d.pos + len(word)
	if end > len(d.data) || string(d.data[d.pos:end]) != word {
		return false
	}
	d.pos = end
	return true
}

// number decodes a number of JSON's grammar as json.Unmarshal does: strconv.ParseFloat
// of its text, and a number it cannot hold (1e400) left to json.Unmarshal's error.
func (d *decoder) number() (any, bool) {
	data, i := d.data, d.pos
	digits := func() int {
		j := i
		for i < len(data) && '0' <= data[i] && data[i] <= '9' {
			i++
		}
		return i - j
	}
	if data[i] == '-' {
		i++
	}
	switch {
	case i < len(data) && data[i] == '0':
		i++
	case digits() == 0:
		return nil, false
	}
	if i < len(data) && data[i] == '.' {
		i++
		if digits() == 0 {
			return nil, false
		}
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if digits() == 0 {
			return nil, false
		}
	}
	f, err := strconv.ParseFloat(string(data[d.pos:i]), 64)
	if err != nil {
		return nil, false
	}
	d.pos = i
	return f, true
}
