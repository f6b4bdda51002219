package adapter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"firstmate.dev/fm/internal/protocol"
)

// Code is one of the five error codes a package may answer with
// (spec [PROTO-4]). The host reports a package failure as
// extension-<code>.
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

// Valid reports whether c is one of the five protocol codes.
func (c Code) Valid() bool { return slices.Contains(protocol.PackageErrorCodes, string(c)) }

// Error is a handler failure with a protocol code. Return one (directly or
// wrapped) from a Handler method to choose the code and retryability of the
// error response; any other error is answered as internal, not retryable.
type Error struct {
	Code      Code
	Retryable bool
	// Err carries the message; it becomes the diagnostic after sanitizing
	// (control characters removed, at most 512 bytes).
	Err error
}

// Errorf returns an *Error with the given code and retryability whose message
// is fmt.Errorf(format, args...); %w wraps a cause as usual. An invalid code
// is answered as internal.
func Errorf(code Code, retryable bool, format string, args ...any) error {
	return &Error{Code: code, Retryable: retryable, Err: fmt.Errorf(format, args...)}
}

func errf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Err: fmt.Errorf(format, args...)}
}

func (e *Error) Error() string {
	if e.Err == nil {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// ErrorBodyOf maps a handler error to the error body answered on the wire:
// the first *Error in err's chain decides code (internal if invalid) and
// retryability, with err's message as the diagnostic; a context cancellation
// or deadline is unavailable and retryable; anything else is internal and not
// retryable. The diagnostic always satisfies the protocol (see Diagnostic).
func ErrorBodyOf(err error) ErrorBody {
	if err == nil {
		return ErrorBody{Code: Internal, Diagnostic: "nil error"}
	}
	var ae *Error
	if errors.As(err, &ae) {
		code := ae.Code
		if !code.Valid() {
			code = Internal
		}
		msg := err.Error()
		if err == error(ae) {
			msg = errMessage(ae) // without the "<code>: " prefix
		}
		return ErrorBody{Code: code, Retryable: ae.Retryable, Diagnostic: Diagnostic(msg, code)}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return ErrorBody{Code: Unavailable, Retryable: true, Diagnostic: Diagnostic(err.Error(), Unavailable)}
	}
	return ErrorBody{Code: Internal, Diagnostic: Diagnostic(err.Error(), Internal)}
}

func errMessage(e *Error) string {
	if e.Err == nil {
		return ""
	}
	return e.Err.Error()
}

// Diagnostic turns msg into a valid diagnostic: invalid UTF-8 is replaced by
// U+FFFD, tabs and line breaks become spaces, every other control character
// (U+0000..U+001F, U+007F..U+009F) is removed, surrounding space is trimmed,
// and the result is cut at a rune boundary to at most 512 bytes. It is never
// longer than 512 bytes and never empty: an empty result becomes the code's
// name (or "error").
func Diagnostic(msg string, code Code) string {
	s := sanitize(msg)
	s = strings.TrimSpace(s)
	s = truncateUTF8(s, MaxDiagnosticBytes)
	s = strings.TrimSpace(s)
	if s == "" {
		if code.Valid() {
			return string(code)
		}
		return "error"
	}
	return s
}

// sanitize replaces invalid UTF-8, maps tab/CR/LF to spaces and drops other
// control characters.
func sanitize(msg string) string {
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	var b strings.Builder
	b.Grow(len(msg))
	for _, r := range msg {
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			b.WriteByte(' ')
		case protocol.IsControl(r):
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// truncateUTF8 cuts valid UTF-8 s to at most n bytes at a rune boundary.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
