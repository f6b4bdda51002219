// Package wire is the one definition of what a Firstmate process-event
// adapter and the Firstmate host (fm) exchange: the package manifest, the
// handshake and invoke envelopes of host protocol 1, the inputs and results
// of process-event-adapter/1, the five error codes, and the failure evidence
// document a poll's result may be (docs/protocol.md; clause ids such as
// [PROTO-4] are the contract's). The SDK (package adapter), its test harness
// (adaptertest) and the host all import it, so the two sides cannot drift:
// there is no second copy of a schema string, a bound or a format rule.
//
// Most adapter authors never import wire directly: package adapter re-exports
// the types a Handler sees. Import it to speak the protocol by hand, or to
// read the evidence document a result may hold.
//
// The rules, and why each holds:
//
//  1. Every document is one strict JSON value ([JSON-1]): UTF-8 only, no
//     byte-order mark, no duplicate, unknown or missing key, null only where
//     a field says so, integers only where integers are due, nesting bounded.
//     Nothing unknown is interpreted optimistically, so a field added by a
//     later version is refused instead of ignored (DecodeRequest,
//     DecodeHandshakeRequest, DecodeManifest).
//  2. Every document written is canonical JSON ([JSON-2], Canonical): keys
//     sorted, no insignificant whitespace, no trailing newline, so that the
//     same value has the same bytes on both sides and in every digest.
//  3. Every bound is inclusive and counted in bytes of UTF-8 (the Max*
//     constants): a value exactly at a bound is accepted, one byte more is
//     refused. A document is at most MaxEnvelopeBytes; a poll output is at
//     most MaxOutputBytes and at most MaxEscapedOutputBytes once JSON-escaped
//     (EscapedLen), so that every later verdict request can carry it.
//  4. Identifiers have one form each (ValidRequestID, ValidExtensionID,
//     ValidVersion, ValidAdapterName, ValidSourceID, ValidConfigRef,
//     ValidClassification, ValidDiagnostic): the host refuses exactly what
//     the SDK refuses, because both call these functions.
//  5. A text that reaches a log, a file name or a terminal holds no control
//     character (IsControl: C0, DEL and C1), so that a package cannot forge
//     a line or a terminal sequence in what the host or an operator reads;
//     Sanitize, Truncate and Clip make foreign text fit for a message.
//  6. Version lists (host_protocols, capability versions) are non-empty,
//     duplicate-free lists of integers 1..2^31-1 (CheckVersionList), int64
//     on both sides: no conversion can truncate one.
//  7. A package answers failure with one of five codes (Code) and a bounded
//     diagnostic; the host reports extension-<code> and never shows the
//     diagnostic, so package text never reaches an operator as if it were
//     the host's.
//  8. The evidence document (Evidence) is written by the host only, from
//     host-chosen values; a package reads it as the content of a result whose
//     poll failed, and never writes one.
//
// Validation errors of a request are *Error with code InvalidRequest or
// Incompatible (what the SDK answers); of a result, code Internal (the SDK
// refuses its own handler's mistake). How the host judges a package's
// answer, and with which of its error codes, is the host's policy
// (fm's internal/protocol), built on the same rules. No exported
// signature of this package carries a third-party type: raw JSON is
// encoding/json.RawMessage.
package wire

import "encoding/json"

// Schema strings of the documents ([PROTO-1]..[PROTO-4], [MAN-1], [OP-3]).
const (
	HandshakeRequestSchema  = "firstmate.extension-handshake-request.v1"
	HandshakeResponseSchema = "firstmate.extension-handshake-response.v1"
	RequestSchema           = "firstmate.extension-request.v1"
	ResponseSchema          = "firstmate.extension-response.v1"
	ManifestSchema          = "firstmate.extension-manifest.v1"
	EvidenceSchema          = "firstmate.process-event-extension-error.v1"
)

// ManifestFile is the manifest's name at the package root.
const ManifestFile = "firstmate-extension.json"

// Protocol identity: host protocol 1 and process-event-adapter/1. There is
// no negotiation beyond "1 must be offered".
const (
	HostProtocol      = 1
	CapabilityName    = "process-event-adapter"
	CapabilityVersion = 1
)

// The four operations of process-event-adapter/1 ([OP-1]).
const (
	OpPoll     = "source.poll"
	OpClassify = "result.classify"
	OpTerminal = "result.terminal"
	OpSilent   = "result.silent"
)

// Operations lists the four operations in the contract's order.
var Operations = []string{OpPoll, OpClassify, OpTerminal, OpSilent}

// Poll statuses.
const (
	StatusResult   = "result"
	StatusNoResult = "no-result"
)

// Bounds of the protocol, in bytes. Every bound is inclusive: a value exactly
// at the bound is accepted.
const (
	MaxEnvelopeBytes       = 65536 // one request or response document
	MaxManifestBytes       = 65536 // firstmate-extension.json
	MaxOutputBytes         = 32768 // source.poll output (UTF-8 bytes of the string)
	MaxEscapedOutputBytes  = 64696 // the same output JSON-escaped (see EscapedLen), so every verdict request can carry it
	MaxContentBytes        = 32768 // result content sent to classify/terminal/silent
	MaxConfigRefBytes      = 512   // config_ref
	MaxDiagnosticBytes     = 512   // error diagnostic
	MaxClassificationBytes = 64    // classification token
	MaxStderrBytes         = 8192  // everything the entrypoint writes to stderr, per run
	MaxSourceIDBytes       = 64
	MaxExtensionIDBytes    = 128
	MaxVersionBytes        = 128
	MaxAdapterNameBytes    = 32
	MaxEntrypointBytes     = 256
)

// Consents lists the consent facts a manifest may require, in the
// contract's order ([MAN-4]).
var Consents = []string{"network", "credential-store", "task-metadata", "artifact-references"}

// HandshakeRequest is what the host sends on stdin with the verb handshake
// ([PROTO-1]). Every key is required; no other key is accepted.
type HandshakeRequest struct {
	// Schema is always HandshakeRequestSchema.
	Schema string `json:"schema"`
	// RequestID is sha256:<64 lowercase hex>, fresh for every handshake.
	RequestID string `json:"request_id"`
	// HostProtocols lists the host protocols offered; the host sends [1].
	HostProtocols []int64 `json:"host_protocols"`
	// ExtensionID and ExtensionVersion are the bound manifest identity.
	ExtensionID      string `json:"extension_id"`
	ExtensionVersion string `json:"extension_version"`
	// PackageDigest is the installed tree digest, sha256:<64 lowercase hex>.
	PackageDigest string `json:"package_digest"`
	// Capability names the capability, its offered versions and the enabled
	// adapter-name subset.
	Capability HandshakeCapability `json:"capability"`
}

// HandshakeCapability is the capability object of a HandshakeRequest.
type HandshakeCapability struct {
	// Name is always CapabilityName.
	Name string `json:"name"`
	// Versions lists the capability versions offered; the host sends [1].
	Versions []int64 `json:"versions"`
	// AdapterNames is the subset of the manifest's adapters the operator
	// enabled with --adapter. The response must answer exactly this set.
	AdapterNames []string `json:"adapter_names"`
}

// HandshakeResponse is the one document the entrypoint writes to stdout for a
// handshake ([PROTO-2]). It has no error member: a package that refuses a
// handshake writes nothing and exits non-zero.
type HandshakeResponse struct {
	Schema            string   `json:"schema"`             // HandshakeResponseSchema
	RequestID         string   `json:"request_id"`         // echoed from the request
	ExtensionID       string   `json:"extension_id"`       // equals the request
	ExtensionVersion  string   `json:"extension_version"`  // equals the request
	HostProtocol      int64    `json:"host_protocol"`      // one the request offered
	Capability        string   `json:"capability"`         // CapabilityName
	CapabilityVersion int64    `json:"capability_version"` // one the request offered
	AdapterNames      []string `json:"adapter_names"`      // the requested subset
}

// Request is what the host sends on stdin with the verb invoke ([PROTO-3]).
// Input holds the operation's input object as raw JSON; decode it with
// PollInput or ResultInput.
type Request struct {
	Schema            string          `json:"schema"`     // RequestSchema
	RequestID         string          `json:"request_id"` // the idempotence key
	HostProtocol      int64           `json:"host_protocol"`
	ExtensionID       string          `json:"extension_id"`
	ExtensionVersion  string          `json:"extension_version"`
	PackageDigest     string          `json:"package_digest"`
	Capability        string          `json:"capability"`
	CapabilityVersion int64           `json:"capability_version"`
	Adapter           string          `json:"adapter"`
	Operation         string          `json:"operation"`
	Input             json.RawMessage `json:"input"`
}

// Response is the one document the entrypoint writes to stdout for an invoke
// ([PROTO-4]). With OK true, Result is a JSON object and Error is nil; with
// OK false, Result is JSON null and Error is set.
type Response struct {
	Schema    string          `json:"schema"`     // ResponseSchema
	RequestID string          `json:"request_id"` // echoed from the request
	OK        bool            `json:"ok"`
	Result    json.RawMessage `json:"result"`
	Error     *ErrorBody      `json:"error"`
}

// ErrorBody is the error member of a failed Response.
type ErrorBody struct {
	// Code is one of the five protocol codes.
	Code Code `json:"code"`
	// Retryable tells the host whether the same request may succeed later.
	Retryable bool `json:"retryable"`
	// Diagnostic is 1..512 bytes of UTF-8 with no control character. The host
	// never prints, logs or stores it; it exists for tests and debugging.
	Diagnostic string `json:"diagnostic"`
}

// PollInput is the input of source.poll.
type PollInput struct {
	// SourceID is [A-Za-z0-9._-]{1,64}, not starting with '.'.
	SourceID string `json:"source_id"`
	// ConfigRef is the operator's --config-ref: one line, 1..512 bytes, no
	// control character. Its meaning is the adapter's to define.
	ConfigRef string `json:"config_ref"`
}

// ResultInput is the input of result.classify, result.terminal and
// result.silent: one captured result of the source.
type ResultInput struct {
	SourceID string `json:"source_id"`
	// Sequence is the result's sequence number, 1 or more.
	Sequence int64 `json:"sequence"`
	// Content is the captured result decoded as UTF-8, at most 32,768 bytes.
	// It may be a poll output of this adapter or host-written failure
	// evidence (an Evidence line).
	Content string `json:"content"`
}

// PollResult is the result of source.poll: either
// {"status":"result","output":"<1..32768 bytes>"} or
// {"status":"no-result","output":""}.
type PollResult struct {
	Status string `json:"status"`
	Output string `json:"output"`
}

// ClassifyResult is the result of result.classify.
type ClassifyResult struct {
	// Classification is a lower-case token of 1..64 bytes matching
	// ^[a-z0-9]+([._-][a-z0-9]+)*$.
	Classification string `json:"classification"`
}

// BoolResult is the result of result.terminal and result.silent.
type BoolResult struct {
	Value bool `json:"value"`
}

// Evidence is the one-line document the host captures in place of an output
// when a source.poll fails ([OP-3]): EvidenceSchema, the host's error code
// (such as "extension-unavailable" or "extension-timeout"), the extension id
// and the operation. It carries only host-chosen values, never package text.
// Detail is this project's one extension of the contract's four keys:
// present only when the host refused the package's answer or the package
// ran confined ([CONF-5]), it is the host's own parse detail (a byte
// offset, the pointer of an unknown member) and its note on the
// confinement, at most 200 bytes of printable ASCII.
type Evidence struct {
	Code        string `json:"code"`
	Detail      string `json:"detail,omitzero"`
	ExtensionID string `json:"extension_id"`
	Operation   string `json:"operation"` // OpPoll
	Schema      string `json:"schema"`
}
