package adapter

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// maxDepth bounds the nesting of objects and arrays in any document read. The
// deepest envelope the protocol defines has depth 3.
const maxDepth = 16

var bom = []byte{0xEF, 0xBB, 0xBF}

// readEnvelope reads all of r, at most limit bytes. One byte more is refused
// without reading further. The error is an *Error with code invalid-request.
func readEnvelope(r io.Reader, limit int) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, errf(InvalidRequest, "stdin: read failed: %v", err)
	}
	if len(data) > limit {
		return nil, errf(InvalidRequest, "stdin: document larger than %d bytes", limit)
	}
	return data, nil
}

// checkSyntax verifies that data is exactly one strict JSON value: strict
// UTF-8, no byte-order mark, no duplicate object key, no unescaped control
// character, no unpaired surrogate, nesting at most maxDepth, and only JSON
// whitespace around it.
func checkSyntax(data []byte, what string) error {
	if bytes.HasPrefix(data, bom) {
		return errf(InvalidRequest, "%s: starts with a byte-order mark", what)
	}
	if !utf8.Valid(data) {
		return errf(InvalidRequest, "%s: not valid utf-8", what)
	}
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
			if depth > maxDepth {
				return errf(InvalidRequest, "%s: nesting deeper than %d", what, maxDepth)
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
			return errf(InvalidRequest, "%s: more than one json document", what)
		}
		return describe(err, what)
	}
	return nil
}

// decodeStrict parses data strictly into v (a pointer to a struct): the
// syntax rules of checkSyntax, then exactly the struct's keys (a missing or
// unknown key is refused), null only where the field is a pointer or a
// jsontext.Value, and integers only where integers are due.
func decodeStrict(data []byte, limit int, what string, v any) error {
	if len(data) > limit {
		return errf(InvalidRequest, "%s: larger than %d bytes", what, limit)
	}
	if err := checkSyntax(data, what); err != nil {
		return err
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return errf(Internal, "%s: decode target is not a pointer", what)
	}
	if err := checkShape(jsontext.Value(data), rv.Type().Elem(), "", what); err != nil {
		return err
	}
	if err := json.Unmarshal(data, v, json.RejectUnknownMembers(true)); err != nil {
		return describe(err, what)
	}
	return nil
}

var rawValueType = reflect.TypeFor[jsontext.Value]()

// checkShape enforces exact key sets and null placement, which json.Unmarshal
// does not: a missing key, an unknown key, or a null for a non-pointer field
// is refused. Types are left to json.Unmarshal.
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
		return errf(InvalidRequest, "%s: %s must not be null", what, pointerName(ptr))
	}
	switch t.Kind() {
	case reflect.Struct:
		if raw.Kind() != '{' {
			return errf(InvalidRequest, "%s: %s must be an object", what, pointerName(ptr))
		}
		members, order, err := objectMembers(raw)
		if err != nil {
			return describe(err, what)
		}
		known := map[string]bool{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, ok := fieldName(f)
			if !ok {
				continue
			}
			known[name] = true
			val, present := members[name]
			if !present {
				return errf(InvalidRequest, "%s: missing key %q at %s", what, name, pointerName(ptr))
			}
			if err := checkShape(val, f.Type, ptr+"/"+name, what); err != nil {
				return err
			}
		}
		for _, name := range order {
			if !known[name] {
				return errf(InvalidRequest, "%s: unknown key %q at %s", what, clip(name, 40), pointerName(ptr))
			}
		}
	case reflect.Slice:
		if raw.Kind() != '[' {
			return errf(InvalidRequest, "%s: %s must be an array", what, pointerName(ptr))
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
	}
	return nil
}

func fieldName(f reflect.StructField) (string, bool) {
	if !f.IsExported() {
		return "", false
	}
	tag := f.Tag.Get("json")
	if tag == "-" {
		return "", false
	}
	name, _, _ := strings.Cut(tag, ",")
	if name == "" {
		name = f.Name
	}
	return name, true
}

func objectMembers(raw jsontext.Value) (map[string]jsontext.Value, []string, error) {
	dec := jsontext.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.ReadToken(); err != nil {
		return nil, nil, err
	}
	out := map[string]jsontext.Value{}
	var order []string
	for dec.PeekKind() != '}' {
		tok, err := dec.ReadToken()
		if err != nil {
			return nil, nil, err
		}
		name := tok.String() // the token is voided by the next read
		val, err := dec.ReadValue()
		if err != nil {
			return nil, nil, err
		}
		out[name] = val.Clone()
		order = append(order, name)
	}
	return out, order, nil
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

// peekRequestID returns the top-level "request_id" of a syntactically valid
// document when it is a well-formed request id.
func peekRequestID(data []byte) (string, bool) {
	if jsontext.Value(data).Kind() != '{' {
		return "", false
	}
	members, _, err := objectMembers(jsontext.Value(bytes.TrimSpace(data)))
	if err != nil {
		return "", false
	}
	raw, ok := members["request_id"]
	if !ok || raw.Kind() != '"' {
		return "", false
	}
	var id string
	if err := json.Unmarshal(raw, &id); err != nil || !ValidRequestID(id) {
		return "", false
	}
	return id, true
}

func pointerName(p string) string {
	if p == "" {
		return "the top level"
	}
	return strconv.Quote(clip(p, 80))
}

// describe turns a parser error into an *Error (invalid-request) that names
// the byte offset and JSON pointer but quotes none of the document's text.
func describe(err error, what string) error {
	var ae *Error
	if errors.As(err, &ae) {
		return ae
	}
	var syn *jsontext.SyntacticError
	if errors.As(err, &syn) {
		reason := "invalid json"
		switch {
		case errors.Is(syn.Err, jsontext.ErrDuplicateName):
			reason = "duplicate object key"
		case errors.Is(syn.Err, io.ErrUnexpectedEOF):
			reason = "truncated json"
		}
		return errf(InvalidRequest, "%s: %s at byte %d%s", what, reason, syn.ByteOffset, at(string(syn.JSONPointer)))
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return errf(InvalidRequest, "%s: truncated or empty json", what)
	}
	var sem *json.SemanticError
	if errors.As(err, &sem) {
		reason := "wrong type or value"
		if errors.Is(sem.Err, json.ErrUnknownName) {
			reason = "unknown key"
		}
		return errf(InvalidRequest, "%s: %s%s", what, reason, at(string(sem.JSONPointer)))
	}
	return errf(InvalidRequest, "%s: invalid json", what)
}

func at(ptr string) string {
	if ptr == "" {
		return ""
	}
	return " at " + strconv.Quote(clip(ptr, 80))
}

// Canonical encodes v as canonical JSON (CONTRACT [JSON-2]): object keys
// sorted, no insignificant whitespace, no trailing newline, minimal string
// escaping (RFC 8785). Invalid UTF-8 in a string is an error.
func Canonical(v any) ([]byte, error) {
	b, err := json.Marshal(v, json.Deterministic(true))
	if err != nil {
		return nil, fmt.Errorf("encode json: %w", err)
	}
	val := jsontext.Value(b)
	if err := val.Canonicalize(); err != nil {
		return nil, fmt.Errorf("canonicalize json: %w", err)
	}
	return val, nil
}

// DecodeHandshakeRequest strictly parses and validates a handshake request.
func DecodeHandshakeRequest(data []byte) (*HandshakeRequest, error) {
	var r HandshakeRequest
	if err := decodeStrict(data, MaxEnvelopeBytes, "handshake request", &r); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// DecodeRequest strictly parses and validates an invoke request envelope
// (not its input: see Request.PollInput and Request.ResultInput). Errors are
// *Error with code invalid-request or incompatible.
func DecodeRequest(data []byte) (*Request, error) {
	var r Request
	if err := decodeStrict(data, MaxEnvelopeBytes, "request", &r); err != nil {
		return nil, err
	}
	if r.Input.Kind() != '{' {
		return nil, errf(InvalidRequest, "request: input must be an object")
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// DecodeHandshakeResponse strictly parses and validates a handshake response
// as the host would (use CheckHandshake to compare it with its request).
func DecodeHandshakeResponse(data []byte) (*HandshakeResponse, error) {
	var r HandshakeResponse
	if err := decodeStrict(data, MaxEnvelopeBytes, "handshake response", &r); err != nil {
		return nil, plain(err)
	}
	if err := r.Validate(); err != nil {
		return nil, plain(err)
	}
	return &r, nil
}

// DecodeResponse strictly parses and validates an invoke response envelope as
// the host would. The result's shape is checked by DecodePollResult,
// DecodeClassifyResult or DecodeBoolResult.
func DecodeResponse(data []byte) (*Response, error) {
	var r Response
	if err := decodeStrict(data, MaxEnvelopeBytes, "response", &r); err != nil {
		return nil, plain(err)
	}
	if err := r.Validate(); err != nil {
		return nil, plain(err)
	}
	return &r, nil
}

// DecodePollResult strictly parses and validates a source.poll result object.
func DecodePollResult(raw jsontext.Value) (PollResult, error) {
	var p PollResult
	if err := decodeStrict(raw, MaxEnvelopeBytes, "poll result", &p); err != nil {
		return PollResult{}, plain(err)
	}
	return p, plain(p.Validate())
}

// DecodeClassifyResult strictly parses and validates a result.classify result.
func DecodeClassifyResult(raw jsontext.Value) (ClassifyResult, error) {
	var c ClassifyResult
	if err := decodeStrict(raw, MaxEnvelopeBytes, "classify result", &c); err != nil {
		return ClassifyResult{}, plain(err)
	}
	return c, plain(c.Validate())
}

// DecodeBoolResult strictly parses a result.terminal or result.silent result.
func DecodeBoolResult(raw jsontext.Value) (BoolResult, error) {
	var b BoolResult
	if err := decodeStrict(raw, MaxEnvelopeBytes, "bool result", &b); err != nil {
		return BoolResult{}, plain(err)
	}
	return b, nil
}

// plain drops the protocol code of an SDK error: used where the error
// describes a document the package writes (a response, a manifest), to which
// no protocol code applies.
func plain(err error) error {
	if err == nil {
		return nil
	}
	return errors.New(errMessageOf(err))
}
