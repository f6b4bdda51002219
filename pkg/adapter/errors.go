package adapter

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"firstmate.dev/fm/pkg/adapter/wire"
)

// Errorf returns an *Error with the given code and retryability whose message
// is fmt.Errorf(format, args...); %w wraps a cause as usual. An invalid code
// is answered as internal.
func Errorf(code Code, retryable bool, format string, args ...any) error {
	return &Error{Code: code, Retryable: retryable, Err: fmt.Errorf(format, args...)}
}

// ErrorBodyOf maps a handler error to the error body answered on the wire:
// the first *Error in err's chain decides code (internal if invalid) and
// retryability, with err's message as the diagnostic; a context cancellation
// or deadline is unavailable and retryable; anything else is internal and not
// retryable. The diagnostic always satisfies the protocol (see Diagnostic).
//
// It never panics, whatever err is: a nil *Error found as err or in its
// chain (a typed nil: the common mistake of returning a nil *Error as an
// error) is internal and says so; an error whose Error, Unwrap, Is or As
// method panics is internal, named by its type only.
func ErrorBodyOf(err error) (body ErrorBody) {
	defer func() {
		if p := recover(); p != nil {
			body = ErrorBody{Code: Internal, Diagnostic: Diagnostic(fmt.Sprintf("the handler's error (%T) panicked when read: %s", err, panicText(p)), Internal)}
		}
	}()
	if err == nil {
		return ErrorBody{Code: Internal, Diagnostic: "nil error"}
	}
	var ae *Error
	if errors.As(err, &ae) {
		if ae == nil {
			return ErrorBody{Code: Internal, Diagnostic: fmt.Sprintf("the handler returned a nil *adapter.Error inside a non-nil error (%T): return a nil error for success", err)}
		}
		code := ae.Code
		if !code.Valid() {
			code = Internal
		}
		msg := err.Error()
		if err == error(ae) {
			msg = ae.Message() // without the "<code>: " prefix
		}
		return ErrorBody{Code: code, Retryable: ae.Retryable, Diagnostic: Diagnostic(msg, code)}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return ErrorBody{Code: Unavailable, Retryable: true, Diagnostic: Diagnostic(err.Error(), Unavailable)}
	}
	return ErrorBody{Code: Internal, Diagnostic: Diagnostic(err.Error(), Internal)}
}

// panicText describes a recovered panic value p: its text, or only its type
// when printing it panics too (fmt gives up on a nested panic by panicking).
func panicText(p any) (s string) {
	defer func() {
		if recover() != nil {
			s = fmt.Sprintf("a %T whose text cannot be read", p)
		}
	}()
	return fmt.Sprint(p)
}

// Diagnostic turns msg into a valid diagnostic: invalid UTF-8 is replaced by
// U+FFFD, tabs and line breaks become spaces, every other control character
// (U+0000..U+001F, U+007F..U+009F) is removed, surrounding space is trimmed,
// and the result is cut at a rune boundary to at most 512 bytes. It is never
// longer than 512 bytes and never empty: an empty result becomes the code's
// name (or "error").
func Diagnostic(msg string, code Code) string {
	s := wire.Sanitize(msg)
	s = strings.TrimSpace(s)
	s = wire.Truncate(s, wire.MaxDiagnosticBytes)
	s = strings.TrimSpace(s)
	if s == "" {
		if code.Valid() {
			return string(code)
		}
		return "error"
	}
	return s
}
