package adapter

import (
	"slices"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"firstmate.dev/fm/internal/manifest"
	"firstmate.dev/fm/internal/protocol"
)

// Schema strings of the envelopes (spec [PROTO-1]..[PROTO-4]).
const (
	HandshakeRequestSchema  = "firstmate.extension-handshake-request.v1"
	HandshakeResponseSchema = "firstmate.extension-handshake-response.v1"
	RequestSchema           = "firstmate.extension-request.v1"
	ResponseSchema          = "firstmate.extension-response.v1"
)

// Protocol identity this SDK speaks: host protocol 1 and
// process-event-adapter/1. There is no negotiation beyond "1 must be offered".
const (
	HostProtocol      = 1
	CapabilityName    = "process-event-adapter"
	CapabilityVersion = 1
)

// The four operations of process-event-adapter/1 (spec §9).
const (
	OpPoll     = "source.poll"
	OpClassify = "result.classify"
	OpTerminal = "result.terminal"
	OpSilent   = "result.silent"
)

// Poll statuses.
const (
	StatusResult   = "result"
	StatusNoResult = "no-result"
)

// Bounds of the protocol, in bytes. Every bound is inclusive: a value exactly
// at the bound is accepted.
const (
	MaxEnvelopeBytes       = 65536 // one request or response document
	MaxOutputBytes         = 32768 // source.poll output (UTF-8 bytes of the string)
	MaxEscapedOutputBytes  = 64696 // the same output JSON-escaped ('"' and '\\' count 2, \b\t\n\f\r 2, other C0 controls 6), so every verdict request can carry it
	MaxContentBytes        = 32768 // result content sent to classify/terminal/silent
	MaxConfigRefBytes      = 512   // config_ref
	MaxDiagnosticBytes     = 512   // error diagnostic
	MaxClassificationBytes = 64    // classification token
	MaxStderrBytes         = 8192  // everything the entrypoint writes to stderr, per run
	MaxSourceIDBytes       = 64
	MaxExtensionIDBytes    = 128
	MaxVersionBytes        = 128
	MaxAdapterNameBytes    = 32
)

// HandshakeRequest is what the host sends on stdin with the verb handshake
// (spec [PROTO-1]). Every key is required; no other key is accepted.
type HandshakeRequest struct {
	// Schema is always HandshakeRequestSchema.
	Schema string `json:"schema"`
	// RequestID is sha256:<64 lowercase hex>, fresh for every handshake.
	RequestID string `json:"request_id"`
	// HostProtocols lists the host protocols offered; the host sends [1].
	HostProtocols []int `json:"host_protocols"`
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
	Versions []int `json:"versions"`
	// AdapterNames is the subset of the manifest's adapters the operator
	// enabled with --adapter. The response must answer exactly this set.
	AdapterNames []string `json:"adapter_names"`
}

// HandshakeResponse is the one document the entrypoint writes to stdout for a
// handshake (spec [PROTO-2]). It has no error member: a package that
// refuses a handshake writes nothing and exits non-zero.
type HandshakeResponse struct {
	Schema            string   `json:"schema"`             // HandshakeResponseSchema
	RequestID         string   `json:"request_id"`         // echoed from the request
	ExtensionID       string   `json:"extension_id"`       // equals the request
	ExtensionVersion  string   `json:"extension_version"`  // equals the request
	HostProtocol      int      `json:"host_protocol"`      // 1
	Capability        string   `json:"capability"`         // CapabilityName
	CapabilityVersion int      `json:"capability_version"` // 1
	AdapterNames      []string `json:"adapter_names"`      // the requested subset
}

// Request is what the host sends on stdin with the verb invoke
// (spec [PROTO-3]). Input holds the operation's input object as raw JSON;
// decode it with PollInput or ResultInput.
type Request struct {
	Schema            string         `json:"schema"`     // RequestSchema
	RequestID         string         `json:"request_id"` // the idempotence key
	HostProtocol      int            `json:"host_protocol"`
	ExtensionID       string         `json:"extension_id"`
	ExtensionVersion  string         `json:"extension_version"`
	PackageDigest     string         `json:"package_digest"`
	Capability        string         `json:"capability"`
	CapabilityVersion int            `json:"capability_version"`
	Adapter           string         `json:"adapter"`
	Operation         string         `json:"operation"`
	Input             jsontext.Value `json:"input"`
}

// Response is the one document the entrypoint writes to stdout for an invoke
// (spec [PROTO-4]). With OK true, Result is a JSON object and Error is nil;
// with OK false, Result is JSON null and Error is set.
type Response struct {
	Schema    string         `json:"schema"`     // ResponseSchema
	RequestID string         `json:"request_id"` // echoed from the request
	OK        bool           `json:"ok"`
	Result    jsontext.Value `json:"result"`
	Error     *ErrorBody     `json:"error"`
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
	// evidence (a firstmate.process-event-extension-error.v1 line).
	Content string `json:"content"`
}

// PollResult is the result of source.poll: either
// {"status":"result","output":"<1..32768 bytes>"} or
// {"status":"no-result","output":""}. Build it with Output or NoResult.
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

// Output returns the poll result carrying output.
func Output(output string) PollResult {
	return PollResult{Status: StatusResult, Output: output}
}

// NoResult returns the poll result meaning "nothing happened before my wait
// ended". The host simply polls again with the same request id.
func NoResult() PollResult {
	return PollResult{Status: StatusNoResult, Output: ""}
}

// The format rules below are the host's own (internal/protocol and
// internal/manifest), so that the SDK accepts exactly what the host sends and
// refuses exactly what the host would refuse.

// ValidRequestID reports whether s is sha256:<64 lowercase hex>.
func ValidRequestID(s string) bool { return protocol.ValidRequestID(s) }

// ValidExtensionID reports whether s is a valid manifest id (at most 128
// bytes, ^[a-z0-9]+([.-][a-z0-9]+)*$).
func ValidExtensionID(s string) bool { return manifest.CheckID(s) == nil }

// ValidVersion reports whether s is a SemVer 2.0 version of at most 128 bytes
// (no "v" prefix, no leading zeros).
func ValidVersion(s string) bool { return manifest.CheckVersion(s) == nil }

// ValidAdapterName reports whether s is a valid adapter name (at most 32
// bytes, ^[a-z0-9]+(-[a-z0-9]+)*$).
func ValidAdapterName(s string) bool { return manifest.CheckAdapter(s) == nil }

// ValidSourceID reports whether s is [A-Za-z0-9._-]{1,64} not starting with '.'.
func ValidSourceID(s string) bool { return protocol.ValidSourceID(s) }

// ValidConfigRef reports whether s is one line of 1..512 bytes of UTF-8 with
// no control character (U+0000..U+001F, U+007F..U+009F).
func ValidConfigRef(s string) bool { return protocol.ValidConfigRef(s) }

// ValidClassification reports whether s is a classification token: 1..64
// bytes matching ^[a-z0-9]+([._-][a-z0-9]+)*$ (lower-case ASCII letters and
// digits in runs separated by single '.', '_' or '-').
func ValidClassification(s string) bool { return protocol.ValidClassification(s) }

// Validate checks the request's field formats beyond its JSON shape: schema,
// request id, digest, host protocol, capability, and that operation is one of
// the four. It does not check the identity against a handler (Run does).
// Errors are *Error with code invalid-request or incompatible.
func (r *HandshakeRequest) Validate() error {
	switch {
	case r.Schema != HandshakeRequestSchema:
		return errf(Incompatible, "handshake request: schema is not %s", HandshakeRequestSchema)
	case !ValidRequestID(r.RequestID):
		return errf(InvalidRequest, "handshake request: request_id is not sha256:<64 lowercase hex>")
	case !ValidExtensionID(r.ExtensionID):
		return errf(InvalidRequest, "handshake request: extension_id is not a valid id")
	case !ValidVersion(r.ExtensionVersion):
		return errf(InvalidRequest, "handshake request: extension_version is not a semantic version")
	case !ValidRequestID(r.PackageDigest):
		return errf(InvalidRequest, "handshake request: package_digest is not sha256:<64 lowercase hex>")
	}
	if err := manifest.CheckVersionList(convertInts[int64](r.HostProtocols), "host_protocols"); err != nil {
		return errf(InvalidRequest, "handshake request: %v", err)
	}
	if !slices.Contains(r.HostProtocols, HostProtocol) {
		return errf(Incompatible, "handshake request: host protocol %d is not offered", HostProtocol)
	}
	if r.Capability.Name != CapabilityName {
		return errf(Incompatible, "handshake request: capability is not %s", CapabilityName)
	}
	if err := manifest.CheckVersionList(convertInts[int64](r.Capability.Versions), "capability/versions"); err != nil {
		return errf(InvalidRequest, "handshake request: %v", err)
	}
	if !slices.Contains(r.Capability.Versions, CapabilityVersion) {
		return errf(Incompatible, "handshake request: %s version %d is not offered", CapabilityName, CapabilityVersion)
	}
	if err := manifest.CheckAdapterNames(r.Capability.AdapterNames); err != nil {
		return errf(InvalidRequest, "handshake request: capability/%v", err)
	}
	return nil
}

// Validate checks the request's field formats beyond its JSON shape. A wrong
// schema, host protocol, capability, capability version or an unknown
// operation is incompatible; a malformed id or digest is invalid-request. It
// does not check the identity or adapter against a handler, nor the input
// (PollInput and ResultInput do).
func (r *Request) Validate() error {
	switch {
	case r.Schema != RequestSchema:
		return errf(Incompatible, "request: schema is not %s", RequestSchema)
	case !ValidRequestID(r.RequestID):
		return errf(InvalidRequest, "request: request_id is not sha256:<64 lowercase hex>")
	case r.HostProtocol != HostProtocol:
		return errf(Incompatible, "request: host_protocol %d is not supported (only %d)", r.HostProtocol, HostProtocol)
	case r.Capability != CapabilityName:
		return errf(Incompatible, "request: capability is not %s", CapabilityName)
	case r.CapabilityVersion != CapabilityVersion:
		return errf(Incompatible, "request: capability_version %d is not supported (only %d)", r.CapabilityVersion, CapabilityVersion)
	case !ValidExtensionID(r.ExtensionID):
		return errf(InvalidRequest, "request: extension_id is not a valid id")
	case !ValidVersion(r.ExtensionVersion):
		return errf(InvalidRequest, "request: extension_version is not a semantic version")
	case !ValidRequestID(r.PackageDigest):
		return errf(InvalidRequest, "request: package_digest is not sha256:<64 lowercase hex>")
	case !ValidAdapterName(r.Adapter):
		return errf(InvalidRequest, "request: adapter is not a valid adapter name")
	}
	if !slices.Contains(protocol.Operations, r.Operation) {
		return errf(Incompatible, "request: operation %q is not part of %s/%d", clip(r.Operation, 40), CapabilityName, CapabilityVersion)
	}
	return nil
}

// PollInput strictly decodes and validates the input of a source.poll request.
func (r *Request) PollInput() (PollInput, error) {
	var in PollInput
	if err := decodeStrict(r.Input, MaxEnvelopeBytes, "request input", &in); err != nil {
		return PollInput{}, err
	}
	if err := in.Validate(); err != nil {
		return PollInput{}, err
	}
	return in, nil
}

// ResultInput strictly decodes and validates the input of a result.classify,
// result.terminal or result.silent request.
func (r *Request) ResultInput() (ResultInput, error) {
	var in ResultInput
	if err := decodeStrict(r.Input, MaxEnvelopeBytes, "request input", &in); err != nil {
		return ResultInput{}, err
	}
	if err := in.Validate(); err != nil {
		return ResultInput{}, err
	}
	return in, nil
}

// Validate checks the source id and config_ref formats (spec [OP-1]).
func (in PollInput) Validate() error {
	if !ValidSourceID(in.SourceID) {
		return errf(InvalidRequest, "input: source_id is not [A-Za-z0-9._-]{1,64} without a leading dot")
	}
	if !ValidConfigRef(in.ConfigRef) {
		return errf(InvalidRequest, "input: config_ref is not one line of 1..512 bytes without control characters")
	}
	return nil
}

// Validate checks the source id, sequence and content bound (spec [OP-1]).
func (in ResultInput) Validate() error {
	if !ValidSourceID(in.SourceID) {
		return errf(InvalidRequest, "input: source_id is not [A-Za-z0-9._-]{1,64} without a leading dot")
	}
	if in.Sequence < 1 {
		return errf(InvalidRequest, "input: sequence %d is not 1 or more", in.Sequence)
	}
	if len(in.Content) > MaxContentBytes {
		return errf(InvalidRequest, "input: content is larger than %d bytes", MaxContentBytes)
	}
	return nil
}

// Validate checks a poll result: status "result" with 1..32,768 bytes of
// UTF-8 output that take at most 64,696 bytes JSON-escaped (the host
// refuses a larger one as response-oversized: it could not be carried into
// the result's verdict requests), or status "no-result" with empty output.
func (p PollResult) Validate() error {
	switch p.Status {
	case StatusResult:
		if len(p.Output) == 0 {
			return errf(Internal, "poll result: status result with empty output (return adapter.NoResult() instead)")
		}
		if len(p.Output) > MaxOutputBytes {
			return errf(Internal, "poll result: output is %d bytes, more than %d", len(p.Output), MaxOutputBytes)
		}
		if n := protocol.EscapedLen(p.Output); n > MaxEscapedOutputBytes {
			return errf(Internal, "poll result: output takes %d bytes JSON-escaped, more than %d", n, MaxEscapedOutputBytes)
		}
		if !utf8.ValidString(p.Output) {
			return errf(Internal, "poll result: output is not valid utf-8")
		}
	case StatusNoResult:
		if p.Output != "" {
			return errf(Internal, "poll result: status no-result with non-empty output")
		}
	default:
		return errf(Internal, "poll result: status %q is neither %q nor %q", clip(p.Status, 40), StatusResult, StatusNoResult)
	}
	return nil
}

// Validate checks the classification token.
func (c ClassifyResult) Validate() error {
	if !ValidClassification(c.Classification) {
		return errf(Internal, "classify result: classification is not a lower-case token of 1..64 bytes matching ^[a-z0-9]+([._-][a-z0-9]+)*$")
	}
	return nil
}

// Validate checks the error body: one of the five codes and a diagnostic of
// 1..512 bytes of UTF-8 with no control character.
func (e *ErrorBody) Validate() error {
	if !e.Code.Valid() {
		return errf(Internal, "error: code %q is not one of the five protocol codes", clip(string(e.Code), 40))
	}
	if !protocol.ValidDiagnostic(e.Diagnostic) {
		return errf(Internal, "error: diagnostic is not 1..%d bytes of utf-8 without control characters", MaxDiagnosticBytes)
	}
	return nil
}

// Validate checks a handshake response: schema, request id, protocol and
// capability, and a non-empty, duplicate-free list of valid adapter names.
// Matching against the request is the caller's job (see CheckHandshake).
func (r *HandshakeResponse) Validate() error {
	switch {
	case r.Schema != HandshakeResponseSchema:
		return errf(Internal, "handshake response: schema is not %s", HandshakeResponseSchema)
	case !ValidRequestID(r.RequestID):
		return errf(Internal, "handshake response: request_id is not sha256:<64 lowercase hex>")
	case r.HostProtocol != HostProtocol || r.Capability != CapabilityName || r.CapabilityVersion != CapabilityVersion:
		return errf(Internal, "handshake response: protocol or capability is not %d / %s/%d", HostProtocol, CapabilityName, CapabilityVersion)
	case !ValidExtensionID(r.ExtensionID) || !ValidVersion(r.ExtensionVersion):
		return errf(Internal, "handshake response: extension identity is not valid")
	}
	if err := manifest.CheckAdapterNames(r.AdapterNames); err != nil {
		return errf(Internal, "handshake response: %v", err)
	}
	return nil
}

// CheckHandshake reports whether resp answers req as the host requires
// (spec [PROTO-2]): the same request id, extension id and version, and
// the same adapter-name set (order ignored).
func CheckHandshake(req *HandshakeRequest, resp *HandshakeResponse) error {
	if err := resp.Validate(); err != nil {
		return err
	}
	if resp.RequestID != req.RequestID {
		return errf(Internal, "handshake response: request_id does not match the request")
	}
	if resp.ExtensionID != req.ExtensionID || resp.ExtensionVersion != req.ExtensionVersion {
		return errf(Internal, "handshake response: extension identity does not match the request")
	}
	a, b := slices.Clone(resp.AdapterNames), slices.Clone(req.Capability.AdapterNames)
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) {
		return errf(Internal, "handshake response: adapter_names is not the requested set")
	}
	return nil
}

// Validate checks the response envelope: schema, request id, and the ok /
// result / error consistency rules. It does not check the result's shape for
// an operation (DecodePollResult and friends do).
func (r *Response) Validate() error {
	if r.Schema != ResponseSchema {
		return errf(Internal, "response: schema is not %s", ResponseSchema)
	}
	if !ValidRequestID(r.RequestID) {
		return errf(Internal, "response: request_id is not sha256:<64 lowercase hex>")
	}
	if r.OK {
		if r.Result.Kind() != '{' {
			return errf(Internal, "response: ok is true but result is not an object")
		}
		if r.Error != nil {
			return errf(Internal, "response: ok is true but error is not null")
		}
		return nil
	}
	if r.Result.Kind() != 'n' {
		return errf(Internal, "response: ok is false but result is not null")
	}
	if r.Error == nil {
		return errf(Internal, "response: ok is false but error is null")
	}
	return r.Error.Validate()
}

func clip(s string, n int) string {
	s = sanitize(s)
	if len(s) <= n {
		return s
	}
	return truncateUTF8(s, n) + "..."
}
