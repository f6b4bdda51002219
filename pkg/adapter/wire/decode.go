package wire

import (
	"encoding/json"
	"errors"
	"io"

	"github.com/go-json-experiment/json/jsontext"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/strictjson"
)

// The strict reading of every document (rule 1) is the host's own,
// internal/strictjson: these functions only turn its errors into *Error.

// Read reads all of r, at most limit bytes. One byte more is refused without
// reading further. The error is an *Error with code InvalidRequest; what
// names the stream in it.
func Read(r io.Reader, limit int, what string) ([]byte, error) {
	data, err := strictjson.Read(r, limit, what)
	return data, requestError(err)
}

// CheckSyntax verifies that data is exactly one strict JSON value: strict
// UTF-8, no byte-order mark, no duplicate object key, no unescaped control
// character, no unpaired surrogate, nesting bounded, and only JSON whitespace
// around it. The error is an *Error with code InvalidRequest.
func CheckSyntax(data []byte, what string) error {
	return requestError(strictjson.CheckSyntax(data, what))
}

// Decode parses data strictly into v (a pointer to a struct): the syntax
// rules of CheckSyntax, then exactly the struct's keys (a missing or unknown
// key is refused, unless its tag says omitzero), null only where the field is
// a pointer or a json.RawMessage, and integers only where integers are due.
// The error is an *Error with code InvalidRequest.
func Decode(data []byte, limit int, what string, v any) error {
	return requestError(strictjson.Decode(data, limit, what, v))
}

// PeekRequestID returns the top-level "request_id" of a syntactically valid
// document when it is a well-formed request id, so that a request whose
// envelope is otherwise invalid can still be answered with an error response.
func PeekRequestID(data []byte) (string, bool) {
	id, ok := strictjson.PeekString(data, "request_id")
	if !ok || !ValidRequestID(id) {
		return "", false
	}
	return id, true
}

// Canonical encodes v as canonical JSON (rule 2, [JSON-2]): object keys
// sorted, no insignificant whitespace, no trailing newline, minimal string
// escaping (RFC 8785). Invalid UTF-8 in a string is an error.
func Canonical(v any) ([]byte, error) {
	b, err := strictjson.Canonical(v)
	if err != nil {
		return nil, plain(err)
	}
	return b, nil
}

// DecodeHandshakeRequest strictly parses and validates a handshake request.
func DecodeHandshakeRequest(data []byte) (*HandshakeRequest, error) {
	var r HandshakeRequest
	if err := Decode(data, MaxEnvelopeBytes, "handshake request", &r); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// DecodeRequest strictly parses and validates an invoke request envelope
// (not its input: see Request.PollInput and Request.ResultInput). Errors are
// *Error with code InvalidRequest or Incompatible.
func DecodeRequest(data []byte) (*Request, error) {
	var r Request
	if err := Decode(data, MaxEnvelopeBytes, "request", &r); err != nil {
		return nil, err
	}
	if kind(r.Input) != '{' {
		return nil, errf(InvalidRequest, "request: input must be an object")
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// PollInput strictly decodes and validates the input of a source.poll request.
func (r *Request) PollInput() (PollInput, error) { return decodeInput[PollInput](r.Input) }

// ResultInput strictly decodes and validates the input of a result.classify,
// result.terminal or result.silent request.
func (r *Request) ResultInput() (ResultInput, error) { return decodeInput[ResultInput](r.Input) }

// decodeInput strictly decodes and validates a request's input.
func decodeInput[In interface{ Validate() error }](raw []byte) (In, error) {
	var in, zero In
	if err := Decode(raw, MaxEnvelopeBytes, "request input", &in); err != nil {
		return zero, err
	}
	if err := in.Validate(); err != nil {
		return zero, err
	}
	return in, nil
}

// kind is the kind of the raw JSON value v: '{', '[', '"', '0', 't', 'f' or
// 'n', or 0 when v is empty.
func kind(v json.RawMessage) jsontext.Kind { return jsontext.Value(v).Kind() }

// requestError turns an error of the host's packages into an *Error with the
// same message: Internal for a mistake of this package itself,
// InvalidRequest for anything the document did wrong.
func requestError(err error) error {
	if err == nil {
		return nil
	}
	code := InvalidRequest
	if errcode.Of(err) == errcode.Internal {
		code = Internal
	}
	return &Error{Code: code, Err: errors.New(err.Error())}
}

// plain drops the code of an *Error or of an error of the host's packages,
// keeping its message and any cause it wraps: used where the error describes
// a document the package writes (a manifest, a response), to which no
// protocol code applies.
func plain(err error) error {
	if err == nil {
		return nil
	}
	var cause error
	if e, ok := err.(*errcode.Error); ok {
		cause = e.Err
	}
	if cause == nil {
		return errors.New(messageOf(err))
	}
	return &plainError{msg: err.Error(), cause: cause}
}

// messageOf is err's message without the "<code>: " prefix of an *Error.
func messageOf(err error) string {
	if e, ok := err.(*Error); ok {
		return e.Message()
	}
	return err.Error()
}

// plainError is a message with a cause that errors.Is and errors.As see.
type plainError struct {
	msg   string
	cause error
}

func (e *plainError) Error() string { return e.msg }
func (e *plainError) Unwrap() error { return e.cause }
