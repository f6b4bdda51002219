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
// name the document and the JSON pointer, never the document's text, because
// some documents (responses) carry package text that must not be shown.
//
// Documents the host writes (CONTRACT [JSON-2]) are canonical: keys sorted
// bytewise, no insignificant whitespace; or pretty: the same order, two-space
// indent and one trailing newline.
package strictjson

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strconv"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"firstmate.dev/fm/internal/errcode"
)

// MaxDepth bounds nesting of objects and arrays in any document read.
const MaxDepth = 32

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
	if len(data) > limit {
		return errcode.New(errcode.JSONOversized, "%s: larger than %d bytes", what, limit)
	}
	if err := CheckSyntax(data, what); err != nil {
		return err
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return errcode.New(errcode.Internal, "%s: decode target is not a pointer", what)
	}
	if err := checkShape(jsontext.Value(data), rv.Type().Elem(), "", what); err != nil {
		return err
	}
	if err := json.Unmarshal(data, v, json.RejectUnknownMembers(true)); err != nil {
		return describe(err, what)
	}
	return nil
}

// CheckSyntax verifies that data is exactly one strict JSON value with no
// duplicate keys and nesting at most MaxDepth.
func CheckSyntax(data []byte, what string) error {
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	depth := 0
	for {
		tok, err := dec.ReadToken()
		if err != nil {
			return describe(err, what)
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
	if _, err := dec.ReadToken(); err != io.EOF {
		if err == nil {
			return errcode.New(errcode.JSONInvalid, "%s: more than one json document", what)
		}
		return describe(err, what)
	}
	return nil
}

var rawValueType = reflect.TypeFor[jsontext.Value]()

// checkShape enforces key presence and null placement, which json.Unmarshal
// does not: a missing key or a null for a non-nullable field is refused.
func checkShape(raw jsontext.Value, t reflect.Type, ptr, what string) error {
	if t == rawValueType || t.Kind() == reflect.Interface {
		return nil
	}
	isNull := raw.Kind() == 'n'
	if t.Kind() == reflect.Pointer {
		if isNull {
			return nil
		}
		return checkShape(raw, t.Elem(), ptr, what)
	}
	if isNull {
		return errcode.New(errcode.SchemaInvalid, "%s: %s must not be null", what, pointer(ptr))
	}
	switch t.Kind() {
	case reflect.Struct:
		if raw.Kind() != '{' {
			return errcode.New(errcode.SchemaInvalid, "%s: %s must be an object", what, pointer(ptr))
		}
		members, err := objectMembers(raw)
		if err != nil {
			return describe(err, what)
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, optional, ok := fieldName(f)
			if !ok {
				continue
			}
			val, present := members[name]
			if !present {
				if optional {
					continue
				}
				return errcode.New(errcode.SchemaInvalid, "%s: missing key %q at %s", what, name, pointer(ptr))
			}
			if err := checkShape(val, f.Type, ptr+"/"+name, what); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 && t.Kind() == reflect.Slice {
			return nil
		}
		if raw.Kind() != '[' {
			return errcode.New(errcode.SchemaInvalid, "%s: %s must be an array", what, pointer(ptr))
		}
		elems, err := arrayElems(raw)
		if err != nil {
			return describe(err, what)
		}
		for i, e := range elems {
			if err := checkShape(e, t.Elem(), ptr+"/"+strconv.Itoa(i), what); err != nil {
				return err
			}
		}
	case reflect.Map:
		if raw.Kind() != '{' {
			return errcode.New(errcode.SchemaInvalid, "%s: %s must be an object", what, pointer(ptr))
		}
		members, err := objectMembers(raw)
		if err != nil {
			return describe(err, what)
		}
		for k, v := range members {
			if err := checkShape(v, t.Elem(), ptr+"/"+k, what); err != nil {
				return err
			}
		}
	}
	return nil
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

func pointer(p string) string {
	if p == "" {
		return "the document"
	}
	return strconv.Quote(truncate(p, 96))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// describe turns a parser error into a coded error that names the document,
// the byte offset and the JSON pointer, but quotes none of the document text.
func describe(err error, what string) error {
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
		return errcode.Wrap(errcode.JSONInvalid, nil, "%s: %s at byte %d%s", what, reason, syn.ByteOffset, at(string(syn.JSONPointer)))
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return errcode.New(errcode.JSONInvalid, "%s: truncated or empty json", what)
	}
	var sem *json.SemanticError
	if errors.As(err, &sem) {
		reason := "wrong type or value"
		if errors.Is(sem.Err, json.ErrUnknownName) {
			reason = "unknown key"
		}
		return errcode.New(errcode.SchemaInvalid, "%s: %s%s", what, reason, at(string(sem.JSONPointer)))
	}
	return errcode.New(errcode.JSONInvalid, "%s: invalid json", what)
}

func at(ptr string) string {
	if ptr == "" {
		return ""
	}
	return " at " + strconv.Quote(truncate(ptr, 96))
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
