// Package errcode holds the coded errors of fm.
//
// Every failure that reaches an operator carries exactly one code from the
// contract's list (CONTRACT §14) and a lower-case message that names the
// offending path, field or value. The CLI prints it as one line
// "error[<code>]: <message>" and exits 1 (2 for usage).
package errcode

import (
	"errors"
	"fmt"
)

// Code is one of the contract's error codes.
type Code string

// The error codes of CONTRACT §14. Add one only when none fits, and list it in
// docs/troubleshooting.md (a test checks both).
const (
	Usage                Code = "usage"
	HomeInvalid          Code = "home-invalid"
	JSONInvalid          Code = "json-invalid"
	JSONOversized        Code = "json-oversized"
	SchemaInvalid        Code = "schema-invalid"
	PathUnsafe           Code = "path-unsafe"
	LinkUnsafe           Code = "link-unsafe"
	ModeUnsafe           Code = "mode-unsafe"
	OwnerMismatch        Code = "owner-mismatch"
	PackageMissing       Code = "package-missing"
	PackageInvalid       Code = "package-invalid"
	PackageOversized     Code = "package-oversized"
	ManifestMissing      Code = "manifest-missing"
	EntrypointMissing    Code = "entrypoint-missing"
	EntrypointInvalid    Code = "entrypoint-invalid"
	IntegrityMismatch    Code = "integrity-mismatch"
	ProtocolIncompatible Code = "protocol-incompatible"
	ConsentMissing       Code = "consent-missing"
	CapabilityMismatch   Code = "capability-mismatch"
	AdapterConflict      Code = "adapter-conflict"
	AdapterUnbound       Code = "adapter-unbound"
	BindingExists        Code = "binding-exists"
	BindingMissing       Code = "binding-missing"
	BindingInUse         Code = "binding-in-use"
	RegistryOversized    Code = "registry-oversized"
	RegistryInvalid      Code = "registry-invalid"
	HandshakeInvalid     Code = "handshake-invalid"
	RequestIDMismatch    Code = "request-id-mismatch"
	ResponseInvalid      Code = "response-invalid"
	ResponseOversized    Code = "response-oversized"
	RequestOversized     Code = "request-oversized"
	StderrOversized      Code = "stderr-oversized"
	Timeout              Code = "timeout"
	ProcessFailed        Code = "process-failed"
	ProcessLeak          Code = "process-leak"
	ProcessCleanupFailed Code = "process-cleanup-failed"
	ExtInvalidRequest    Code = "extension-invalid-request"
	ExtIncompatible      Code = "extension-incompatible"
	ExtConflict          Code = "extension-conflict"
	ExtUnavailable       Code = "extension-unavailable"
	ExtInternal          Code = "extension-internal"
	SourceMissing        Code = "source-missing"
	SourceActive         Code = "source-active"
	OwnerTokenMismatch   Code = "owner-token-mismatch"
	TransferExists       Code = "transfer-exists"
	TransferMissing      Code = "transfer-missing"
	RetirementPartial    Code = "retirement-partial"
	Internal             Code = "internal"

	// Codes this project adds where none of the contract's fits (each is
	// listed in docs/troubleshooting.md and defined in docs/spec.md).

	// HostResource is the host's own resource exhaustion (EMFILE, ENFILE,
	// ENOSPC, ENOMEM, EFBIG, EAGAIN on fork): never a package's failure.
	HostResource Code = "host-resource"
	// SecondmateMissing is an `fm on` or remote-bind route that the home's
	// data/secondmates.json does not define.
	SecondmateMissing Code = "secondmate-missing"
	// SequenceExhausted is a counter (a source's sequence, the wake queue's
	// queue-seq) that cannot advance without wrapping.
	SequenceExhausted Code = "sequence-exhausted"
	// SourceRegistered refuses a direct source.poll of a registered source id,
	// whose event would be consumed outside capture.
	SourceRegistered Code = "source-registered"
	// RemoteInvalid is a remote transport that did not answer with the exact
	// lines of a successful remote command, or hung past its deadline.
	RemoteInvalid Code = "remote-invalid"
	// HomeImportNeeded is a home written by the earlier Firstmate
	// implementation: run `fm home import`.
	HomeImportNeeded Code = "home-import-needed"
	// HomeBusy refuses `fm home import` while a process of the earlier
	// implementation may still run in that home.
	HomeBusy Code = "home-busy"
	// ConfinementUnavailable refuses to run a package in a home whose
	// confinement is strict when the kernel cannot enforce its whole
	// ruleset (no Landlock, or an ABI without a needed feature) [CONF-2].
	ConfinementUnavailable Code = "confinement-unavailable"
)

// All lists every code, in the contract's order. Documentation tests use it.
var All = []Code{
	Usage, HomeInvalid, JSONInvalid, JSONOversized, SchemaInvalid, PathUnsafe,
	LinkUnsafe, ModeUnsafe, OwnerMismatch, PackageMissing, PackageInvalid,
	PackageOversized, ManifestMissing, EntrypointMissing, EntrypointInvalid,
	IntegrityMismatch, ProtocolIncompatible, ConsentMissing, CapabilityMismatch,
	AdapterConflict, AdapterUnbound, BindingExists, BindingMissing, BindingInUse,
	RegistryOversized, RegistryInvalid, HandshakeInvalid, RequestIDMismatch,
	ResponseInvalid, ResponseOversized, RequestOversized, StderrOversized,
	Timeout, ProcessFailed, ProcessLeak, ProcessCleanupFailed, ExtInvalidRequest,
	ExtIncompatible, ExtConflict, ExtUnavailable, ExtInternal, SourceMissing,
	SourceActive, OwnerTokenMismatch, TransferExists, TransferMissing,
	RetirementPartial, Internal,
	HostResource, SecondmateMissing, SequenceExhausted, SourceRegistered,
	RemoteInvalid, HomeImportNeeded, HomeBusy, ConfinementUnavailable,
}

// Error is a failure with a contract code. Msg is shown to the operator; Err,
// when set, is the underlying cause kept for errors.Is/As.
type Error struct {
	Code Code
	Msg  string
	Err  error
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Err }

// New returns an Error with a formatted message.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Wrap returns an Error with a formatted message that keeps err as its cause.
// The cause's text is appended after ": ". A cause that is the host's own
// resource exhaustion (HostFault) makes the code HostResource, whatever code
// was asked for (hostfault.go).
func Wrap(code Code, err error, format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	if err != nil {
		msg += ": " + err.Error()
	}
	if HostFault(err) {
		code = HostResource
	}
	return &Error{Code: code, Msg: msg, Err: err}
}

// Of returns HostResource when err's chain holds the host's own resource
// exhaustion (HostFault), else the code of the outermost coded error in the
// chain, or Internal when there is none.
func Of(err error) Code {
	if HostFault(err) {
		return HostResource
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Internal
}

// Is reports whether err carries code.
func Is(err error, code Code) bool { return err != nil && Of(err) == code }
