package adapter

import (
	"errors"
	"io"

	"github.com/go-json-experiment/json/jsontext"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/strictjson"
)

// The strict reading of every document (spec [JSON-1]) is the host's own,
// internal/strictjson: these wrappers only turn its errors into the SDK's.

// readEnvelope reads all of r, at most limit bytes. One byte more is refused
// without reading further. The error is an *Error with code invalid-request.
func readEnvelope(r io.Reader, limit int) ([]byte, error) {
	data, err := strictjson.Read(r, limit, "stdin")
	return data, requestError(err)
}

// checkSyntax verifies that data is exactly one strict JSON value: strict
// UTF-8, no byte-order mark, no duplicate object key, no unescaped control
// character, no unpaired surrogate, nesting bounded, and only JSON whitespace
// around it. The error is an *Error with code invalid-request.
func checkSyntax(data []byte, what string) error {
	return requestError(strictjson.CheckSyntax(data, what))
}

// decodeStrict parses data strictly into v (a pointer to a struct): the
// syntax rules of checkSyntax, then exactly the struct's keys (a missing or
// unknown key is refused), null only where the field is a pointer or a
// jsontext.Value, and integers only where integers are due. The error is an
// *Error with code invalid-request.
func decodeStrict(data []byte, limit int, what string, v any) error {
	return requestError(strictjson.Decode(data, limit, what, v))
}

// requestError turns an error of the host's packages into an *Error with the
// same message: internal for a mistake of the SDK itself, invalid-request for
// anything the document did wrong.
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

// peekRequestID returns the top-level "request_id" of a syntactically valid
// document when it is a well-formed request id.
func peekRequestID(data []byte) (string, bool) {
	id, ok := strictjson.PeekString(data, "request_id")
	if !ok || !ValidRequestID(id) {
		return "", false
	}
	return id, true
}

// Canonical encodes v as canonical JSON (spec [JSON-2]): object keys
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

// plain drops the code of an SDK error or of an error of the host's packages,
// keeping its message and any cause it wraps: used where the error describes
// a document the package writes (a response, a manifest), to which no
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
		return errors.New(errMessageOf(err))
	}
	return &plainError{msg: err.Error(), cause: cause}
}

// plainError is a message with a cause that errors.Is and errors.As see.
type plainError struct {
	msg   string
	cause error
}

func (e *plainError) Error() string { return e.msg }
func (e *plainError) Unwrap() error { return e.cause }
