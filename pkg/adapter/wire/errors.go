package wire

import (
	"fmt"
	"slices"
)

// Code is one of the five error codes a package may answer with
// ([PROTO-4]). The host reports a package failure as extension-<code>.
type Code string

// The five protocol error codes.
const (
	// InvalidRequest: the request is malformed or its input is unusable
	// (e.g. a config_ref this adapter cannot parse). Usually not retryable.
	InvalidRequest Code = "invalid-request"
	// Incompatible: the request asks for something this package does not
	// speak (protocol, capability version, adapter, operation, identity).
	Incompatible Code = "incompatible"
	// Conflict: the request collides with the package's own state (e.g. the
	// source is being served by something else).
	Conflict Code = "conflict"
	// Unavailable: a dependency is temporarily missing (a directory, a
	// service, the network). Usually retryable.
	Unavailable Code = "unavailable"
	// Internal: a bug or an unexpected failure inside the package. Every
	// error that is not an *Error becomes internal.
	Internal Code = "internal"
)

// Codes lists the five codes in the contract's order.
var Codes = []Code{InvalidRequest, Incompatible, Conflict, Unavailable, Internal}

// Valid reports whether c is one of the five protocol codes.
func (c Code) Valid() bool { return slices.Contains(Codes, c) }

// Error is a failure with a protocol code: what the validators of this
// package return, and what a handler returns (directly or wrapped) to choose
// the code and retryability of its error response.
type Error struct {
	Code      Code
	Retryable bool
	// Err carries the message; it becomes the diagnostic after sanitizing
	// (control characters removed, at most 512 bytes).
	Err error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Message is the error's message without the "<code>: " prefix of Error.
func (e *Error) Message() string {
	if e.Err == nil {
		return ""
	}
	return e.Err.Error()
}

func errf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Err: fmt.Errorf(format, args...)}
}
