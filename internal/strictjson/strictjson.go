// Package strictjson reads untrusted JSON documents strictly and writes the
// host's own documents canonically.
//
// Rules for every document read (CONTRACT [JSON-1]):
//   - at most the caller's byte limit (json-oversized), checked before parsing;
//   - strict UTF-8, no byte-order mark, no unescaped control character, no
//     unpaired surrogate (raw or escaped), no NaN or Infinity;
//   - exactly one value with only JSON whitespace around it;
//   - no duplicate object key, nesting at most MaxDepth;
//   - exactly the schema's keys: an unknown key and a missing key are both
//     refused, and null is accepted only where the Go field is a pointer,
//     jsontext.Value or interface (so null never silently becomes a zero value);
//   - integers where the Go field is an integer (1.0 and 1e2 are refused).
//
// Syntax failures are json-invalid; shape failures are schema-invalid. Messages
// name the document, the byte offset and the JSON pointer, never the
// document's text, because some documents (responses) carry package text that
// must not be shown. A pointer itself holds the document's object keys, so
// for a document whose keys a package chose, DecodeWith with HidePointers
// shows a pointer only as far as its segments are keys of the Go type decoded
// into (CONTRACT [PROTO-4]), with one exception: an unknown member directly
// inside a known object is named, because its author needs exactly that name
// to fix it, and it is shown bounded (MaxShownKey bytes) and escaped to
// printable ASCII: `unknown key at "/result/debug"`. A key inside a raw value,
// a map key and a duplicate key past the known prefix stay hidden.
//
// Documents the host writes (CONTRACT [JSON-2]) are canonical: keys sorted
// bytewise, no insignificant whitespace; or pretty: the same order, two-space
// indent and one trailing newline.
package strictjson

import (
	"bytes"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/shown"
)

// MaxDepth bounds nesting of objects and arrays in any document read.
const MaxDepth = 32

// ErrStrayText is the cause of a json-invalid refusal where the document
// holds text that is not JSON (an invalid character) or a second value after
// the first: what a stray line in a stream that must carry one document
// looks like.
var ErrStrayText = errors.New("text that is not part of the json document")

// Read reads at most limit bytes from r. One byte more is json-oversized.
func Read(r io.Reader, limit int, what string) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, errcode.Wrap(errcode.JSONInvalid, err, "%s: read failed", what)
	}
	if len(data) > limit {
		return nil, errcode.New(errcode.JSONOversized, "%s: larger than %d bytes", what, limit)
	}
	return data, nil
}

// Decode parses data strictly into v (a pointer to a struct, slice or map).
// what names the document in errors.
func Decode(data []byte, limit int, what string, v any) error {
	return DecodeWith(data, limit, what, v, DecodeOpts{})
}

// DecodeOpts are the options of DecodeWith. The zero value is Decode.
type DecodeOpts struct {
	// HidePointers keeps the document's own object keys out of error
	// messages, for documents whose keys a package chose (handshake and
	// invoke responses, operation results: CONTRACT [PROTO-4]). A JSON
	// pointer is shown only as far as each segment is a key of the Go type
	// being decoded (or an array index below one), and a refusal past that
	// prefix is reported "in" it: `duplicate object key at byte 57 in
	// "/result"`, `wrong type or value in "/m"`. The one exception is an
	// unknown member directly inside a known object, named bounded and
	// escaped (unknownAt): `unknown key at "/error/trace"`.
	HidePointers bool
}

// DecodeWith is Decode with opts.
func DecodeWith(data []byte, limit int, what string, v any, opts DecodeOpts) error {
	if len(data) > limit {
		return errcode.New(errcode.JSONOversized, "%s: larger than %d bytes", what, limit)
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return errcode.New(errcode.Internal, "%s: decode target is not a pointer", what)
	}
	r := &reporter{what: what, hide: opts.HidePointers, root: rv.Type().Elem(), data: data}
	if err := r.checkSyntax(data); err != nil {
		return err
	}
	if err := r.checkShape(jsontext.Value(data), r.root, ""); err != nil {
		return err
	}
	if err := json.Unmarshal(data, v, json.RejectUnknownMembers(true)); err != nil {
		return r.describe(err)
	}
	return nil
}

// reporter words the refusals of one Decode: what names the document, and
// with hide the pointers are cut to the part that root's keys spell.
type reporter struct {
	what string
	hide bool
	root reflect.Type // nil: no key is known, every pointer is hidden
	data []byte       // the document, for the positions of members (shownPointer)
}

// CheckSyntax verifies that data is exactly one strict JSON value with no
// duplicate keys and nesting at most MaxDepth.
func CheckSyntax(data []byte, what string) error {
	return (&reporter{what: what}).checkSyntax(data)
}

func (r *reporter) checkSyntax(data []byte) error {
	what := r.what
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	depth := 0
	for {
		tok, err := dec.ReadToken()
		if err != nil {
			return r.syntaxError(data, err, depth == 0)
		}
		switch tok.Kind() {
		case '{', '[':
			depth++
			if depth > MaxDepth {
				return errcode.New(errcode.JSONInvalid, "%s: nesting deeper than %d", what, MaxDepth)
			}
		case '}', ']':
			depth--
		}
		if depth == 0 {
			break
		}
	}
	end := dec.InputOffset()
	if _, err := dec.ReadToken(); err != io.EOF {
		if err == nil {
			next := end + int64(len(data[end:])-len(bytes.TrimLeft(data[end:], " \t\r\n")))
			return &errcode.Error{Code: errcode.JSONInvalid, Msg: fmt.Sprintf("%s: more than one json document (the second starts at byte %d)", what, next), Err: ErrStrayText}
		}
		return r.syntaxError(data, err, true)
	}
	return nil
}

var bom = []byte{0xEF, 0xBB, 0xBF}

// syntaxError describes a parse failure of data. A byte-order mark and
// invalid UTF-8 are named as such (the parser reports both as an invalid
// character); they are looked for only once parsing has failed, so a valid
// document costs nothing more. outside says the parser stood before the
// document's first token or past its end: text it refused there is stray
// text (ErrStrayText). A fault inside the document (an unescaped line break
// in a string, a missing comma) is not, whatever its pointer.
func (r *reporter) syntaxError(data []byte, err error, outside bool) error {
	switch {
	case bytes.HasPrefix(data, bom):
		return errcode.New(errcode.JSONInvalid, "%s: starts with a byte-order mark", r.what)
	case !utf8.Valid(data):
		return errcode.New(errcode.JSONInvalid, "%s: not valid utf-8", r.what)
	}
	var syn *jsontext.SyntacticError
	if outside && errors.As(err, &syn) && !errors.Is(syn.Err, io.ErrUnexpectedEOF) {
		return &errcode.Error{Code: errcode.JSONInvalid, Msg: r.describe(err).Error(), Err: ErrStrayText}
	}
	return r.describe(err)
}

// PeekString returns the string value of the member name of data's top-level
// object. It applies no shape rule, so a caller can learn, say, the request
// id of a document that Decode refuses, in order to answer it. ok is false when data is not a syntactically valid object
// (check it with CheckSyntax first), has no such member, or its value is not
// a string.
func PeekString(data []byte, name string) (value string, ok bool) {
	if jsontext.Value(data).Kind() != '{' {
		return "", false
	}
	members, err := objectMembers(jsontext.Value(data))
	if err != nil {
		return "", false
	}
	raw, present := members[name]
	if !present || raw.Kind() != '"' {
		return "", false
	}
	if err := json.Unmarshal(raw, &value); err != nil {
		return "", false
	}
	return value, true
}

// The raw value types: a field of either holds any JSON value, null
// included, unchecked here. json.RawMessage is the one that public packages
// use, so that no exported signature carries a third-party type.
var (
	rawValueType   = reflect.TypeFor[jsontext.Value]()
	rawMessageType = reflect.TypeFor[stdjson.RawMessage]()
)

// checkShape enforces key presence and null placement, which json.Unmarshal
// does not: a missing key or a null for a non-nullable field is refused.
func (r *reporter) checkShape(raw jsontext.Value, t reflect.Type, ptr string) error {
	what := r.what
	if t == rawValueType || t == rawMessageType || t.Kind() == reflect.Interface {
		return nil
	}
	isNull := raw.Kind() == 'n'
	if t.Kind() == reflect.Pointer {
		if isNull {
			return nil
		}
		return r.checkShape(raw, t.Elem(), ptr)
	}
	if isNull {
		return errcode.New(errcode.SchemaInvalid, "%s: %s must not be null", what, r.pointer(ptr))
	}
	switch t.Kind() {
	case reflect.Struct:
		if raw.Kind() != '{' {
			return errcode.New(errcode.SchemaInvalid, "%s: %s must be an object", what, r.pointer(ptr))
		}
		members, err := objectMembers(raw)
		if err != nil {
			return r.describe(err)
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if inlined(f) {
				if err := r.checkShape(raw, f.Type, ptr); err != nil {
					return err
				}
				continue
			}
			name, optional, ok := fieldName(f)
			if !ok {
				continue
			}
			val, present := members[name]
			if !present {
				if optional {
					continue
				}
				return errcode.New(errcode.SchemaInvalid, "%s: missing key %q at %s", what, name, r.pointer(ptr))
			}
			if err := r.checkShape(val, f.Type, ptr+"/"+name); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 && t.Kind() == reflect.Slice {
			return nil
		}
		if raw.Kind() != '[' {
			return errcode.New(errcode.SchemaInvalid, "%s: %s must be an array", what, r.pointer(ptr))
		}
		elems, err := arrayElems(raw)
		if err != nil {
			return r.describe(err)
		}
		for i, e := range elems {
			if err := r.checkShape(e, t.Elem(), ptr+"/"+strconv.Itoa(i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if raw.Kind() != '{' {
			return errcode.New(errcode.SchemaInvalid, "%s: %s must be an object", what, r.pointer(ptr))
		}
		members, err := objectMembers(raw)
		if err != nil {
			return r.describe(err)
		}
		for k, v := range members {
			if err := r.checkShape(v, t.Elem(), ptr+"/"+escape(k)); err != nil {
				return err
			}
		}
	}
	return nil
}

// inlined reports whether f is an embedded struct without a JSON name,
// whose members the encoder writes as its parent's own.
func inlined(f reflect.StructField) bool {
	return f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag.Get("json") == ""
}

func fieldName(f reflect.StructField) (name string, optional, ok bool) {
	if !f.IsExported() {
		return "", false, false
	}
	tag := f.Tag.Get("json")
	if tag == "-" {
		return "", false, false
	}
	name = f.Name
	if tag != "" {
		parts := bytes.Split([]byte(tag), []byte(","))
		if len(parts[0]) > 0 {
			name = string(parts[0])
		}
		for _, opt := range parts[1:] {
			if string(opt) == "omitzero" || string(opt) == "omitempty" {
				optional = true
			}
		}
	}
	return name, optional, true
}

func objectMembers(raw jsontext.Value) (map[string]jsontext.Value, error) {
	dec := jsontext.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.ReadToken(); err != nil {
		return nil, err
	}
	out := map[string]jsontext.Value{}
	for dec.PeekKind() != '}' {
		tok, err := dec.ReadToken()
		if err != nil {
			return nil, err
		}
		name := tok.String()
		val, err := dec.ReadValue()
		if err != nil {
			return nil, err
		}
		out[name] = val.Clone()
	}
	return out, nil
}

func arrayElems(raw jsontext.Value) ([]jsontext.Value, error) {
	dec := jsontext.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.ReadToken(); err != nil {
		return nil, err
	}
	var out []jsontext.Value
	for dec.PeekKind() != ']' {
		val, err := dec.ReadValue()
		if err != nil {
			return nil, err
		}
		out = append(out, val.Clone())
	}
	return out, nil
}

// escape makes an object key one JSON pointer segment (RFC 6901).
func escape(k string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
}

// pointer names the value at the JSON pointer p: "the document" or the
// quoted pointer; with hide, a pointer that runs past the known keys is
// "a value in" its known prefix.
func (r *reporter) pointer(p string) string {
	shown, whole := r.known(p)
	switch {
	case whole && shown == "":
		return "the document"
	case whole:
		return r.quote(shown)
	case shown == "":
		return "a value in the document"
	}
	return "a value in " + r.quote(shown)
}

// at is the place suffix of a refusal at the JSON pointer p (empty for none):
// ` at "/p"`, or with hide, past the known keys, ` in "/prefix"` or
// ` in the document`.
func (r *reporter) at(p string) string {
	if p == "" {
		return ""
	}
	shown, whole := r.known(p)
	switch {
	case whole:
		return " at " + r.quote(shown)
	case shown == "":
		return " in the document"
	}
	return " in " + r.quote(shown)
}

// known returns the longest prefix of the JSON pointer p that may be shown,
// and whether that is all of p. Without hide it is p. With hide, a segment is
// kept only while it is the JSON name of a field of the Go type reached so
// far (starting at root), or an array index where that type is a slice or
// array of something other than bytes; a map key, anything inside a raw
// value, and any key the type does not declare end the prefix.
func (r *reporter) known(p string) (string, bool) {
	if !r.hide || p == "" {
		return p, true
	}
	t := r.root
	shown := ""
	for _, seg := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		for t != nil && t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		next := reflect.Type(nil)
		switch {
		case t == nil || t == rawValueType:
		case t.Kind() == reflect.Struct:
			for i := 0; i < t.NumField(); i++ {
				if name, _, ok := fieldName(t.Field(i)); ok && name == seg {
					next = t.Field(i).Type
					break
				}
			}
		case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && t.Elem().Kind() != reflect.Uint8 && isIndex(seg):
			next = t.Elem()
		}
		if next == nil {
			return shown, false
		}
		shown += "/" + seg
		t = next
	}
	return shown, true
}

// unknownAt is the place suffix of an unknown member at the JSON pointer p.
// With hide, a member directly inside an object whose pointer is all known
// keys is shown too (as every segment is, by quote: its name when
// token-shaped, else its position), because its author needs it to fix the
// answer. Any deeper unknown place stays hidden as in at.
func (r *reporter) unknownAt(p string) string {
	shown, whole := r.known(p)
	if whole || !r.hide {
		return r.at(p)
	}
	name, ok := strings.CutPrefix(p, shown+"/")
	if !ok || strings.Contains(name, "/") {
		return r.at(p)
	}
	return " at " + r.quote(p)
}

// quote shows the JSON pointer p of r's document, quoted: a segment that is
// token-shaped (shown.IsToken: [A-Za-z0-9_.-]{1,64}, which array indices
// are) as it is, any other as "#<n>", the member's 1-based position in its
// object ("#?" when it cannot be found), so no name the document's author
// chose reaches a message unless it is a plain token (CONTRACT [OP-3]). The
// result is printable ASCII, cut to at most 96 bytes and "...".
func (r *reporter) quote(p string) string {
	var b strings.Builder
	prefix := ""
	for _, seg := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		name := strings.NewReplacer("~1", "/", "~0", "~").Replace(seg)
		b.WriteByte('/')
		if shown.IsToken(name) {
			b.WriteString(name)
		} else if n := memberIndex(r.data, prefix+"/"+seg); n > 0 {
			b.WriteString("#" + strconv.Itoa(n))
		} else {
			b.WriteString("#?")
		}
		prefix += "/" + seg
	}
	return strconv.Quote(truncate(b.String(), 96))
}

// memberIndex returns the 1-based position of the object member at the JSON
// pointer p among its object's members in data, 0 when there is none.
func memberIndex(data []byte, p string) int {
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.ReadToken()
		if err != nil {
			return 0
		}
		// A name: the innermost object has an odd count of names and values.
		if kind, n := dec.StackIndex(dec.StackDepth()); tok.Kind() == '"' && kind == '{' && n%2 == 1 && string(dec.StackPointer()) == p {
			return int(n+1) / 2
		}
	}
}

func isIndex(s string) bool {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// describe turns a parser error into a coded error that names the document,
// the byte offset and the JSON pointer, but quotes none of the document text.
func (r *reporter) describe(err error) error {
	what := r.what
	var syn *jsontext.SyntacticError
	if errors.As(err, &syn) {
		reason := "invalid json"
		switch {
		case errors.Is(syn.Err, jsontext.ErrDuplicateName):
			reason = "duplicate object key"
		case errors.Is(syn.Err, io.ErrUnexpectedEOF):
			reason = "truncated json"
		case errors.Is(syn.Err, jsontext.ErrNonStringName):
			reason = "object key is not a string"
		}
		return errcode.New(errcode.JSONInvalid, "%s: %s at byte %d%s", what, reason, syn.ByteOffset, r.at(string(syn.JSONPointer)))
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return errcode.New(errcode.JSONInvalid, "%s: truncated or empty json", what)
	}
	var sem *json.SemanticError
	if errors.As(err, &sem) {
		if errors.Is(sem.Err, json.ErrUnknownName) {
			return errcode.New(errcode.SchemaInvalid, "%s: unknown key%s", what, r.unknownAt(string(sem.JSONPointer)))
		}
		return errcode.New(errcode.SchemaInvalid, "%s: wrong type or value%s", what, r.at(string(sem.JSONPointer)))
	}
	return errcode.New(errcode.JSONInvalid, "%s: invalid json", what)
}

// Canonical encodes v with keys sorted bytewise and no insignificant
// whitespace. The host's keys and strings are ASCII-safe, so RFC 8785's
// UTF-16 ordering equals bytewise ordering for every key it writes.
func Canonical(v any) ([]byte, error) {
	b, err := json.Marshal(v, json.Deterministic(true))
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "encode json")
	}
	val := jsontext.Value(b)
	if err := val.Canonicalize(); err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "canonicalize json")
	}
	return val, nil
}

// Pretty encodes v canonically, then indents it by two spaces and ends it with
// one newline (CONTRACT [BND-2]).
func Pretty(v any) ([]byte, error) {
	b, err := Canonical(v)
	if err != nil {
		return nil, err
	}
	val := jsontext.Value(b)
	if err := val.Indent(jsontext.WithIndent("  ")); err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "indent json")
	}
	return append(val, '\n'), nil
}
