// Package protocol holds the executable protocol between the host and a
// package entrypoint: the handshake and invoke envelopes, the
// process-event-adapter/1 operations, request ids, and the failure evidence
// document (CONTRACT §7.2, §9, §10.4).
//
// Every byte a package returns is untrusted evidence: responses are parsed
// strictly, every identity must equal what the host sent, and no field can
// widen what the host does. A package's diagnostic text is never returned by
// this package to a caller; only its error code is.
package protocol

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/strictjson"
)

// Schemas and names on the wire.
const (
	HandshakeRequestSchema  = "firstmate.extension-handshake-request.v1"
	HandshakeResponseSchema = "firstmate.extension-handshake-response.v1"
	RequestSchema           = "firstmate.extension-request.v1"
	ResponseSchema          = "firstmate.extension-response.v1"
	EvidenceSchema          = "firstmate.process-event-extension-error.v1"
	Capability              = "process-event-adapter"
)

// Bounds of the protocol (CONTRACT [INV-4], [INV-5], [OP-1]).
const (
	MaxEnvelope      = 65536
	MaxStderr        = 8192
	MaxPollOutput    = 32768
	MaxEscapedOutput = 64696 // see EscapedLen
	MaxContent       = 32768
	MaxDiagnostic    = 512
	MaxClassifyToken = 64
	MaxConfigRef     = 512
	HandshakeTimeout = 5000 // milliseconds
)

// Supported versions of this host.
var (
	HostProtocols      = []int64{1}
	CapabilityVersions = []int64{1}
)

// The four operations of process-event-adapter/1.
const (
	OpPoll     = "source.poll"
	OpClassify = "result.classify"
	OpTerminal = "result.terminal"
	OpSilent   = "result.silent"
)

// Operations lists them in the contract's order.
var Operations = []string{OpPoll, OpClassify, OpTerminal, OpSilent}

// HandshakeCapability is the capability block of a handshake request.
type HandshakeCapability struct {
	Name         string   `json:"name"`
	Versions     []int64  `json:"versions"`
	AdapterNames []string `json:"adapter_names"`
}

// HandshakeRequest is sent with verb "handshake" ([PROTO-1]).
type HandshakeRequest struct {
	Schema           string              `json:"schema"`
	RequestID        string              `json:"request_id"`
	HostProtocols    []int64             `json:"host_protocols"`
	ExtensionID      string              `json:"extension_id"`
	ExtensionVersion string              `json:"extension_version"`
	PackageDigest    string              `json:"package_digest"`
	Capability       HandshakeCapability `json:"capability"`
}

// HandshakeResponse is what the entrypoint answers ([PROTO-2]).
type HandshakeResponse struct {
	Schema            string   `json:"schema"`
	RequestID         string   `json:"request_id"`
	ExtensionID       string   `json:"extension_id"`
	ExtensionVersion  string   `json:"extension_version"`
	HostProtocol      int64    `json:"host_protocol"`
	Capability        string   `json:"capability"`
	CapabilityVersion int64    `json:"capability_version"`
	AdapterNames      []string `json:"adapter_names"`
}

// Request is sent with verb "invoke" ([PROTO-3]).
type Request struct {
	Schema            string `json:"schema"`
	RequestID         string `json:"request_id"`
	HostProtocol      int64  `json:"host_protocol"`
	ExtensionID       string `json:"extension_id"`
	ExtensionVersion  string `json:"extension_version"`
	PackageDigest     string `json:"package_digest"`
	Capability        string `json:"capability"`
	CapabilityVersion int64  `json:"capability_version"`
	Adapter           string `json:"adapter"`
	Operation         string `json:"operation"`
	Input             any    `json:"input"`
}

// Response is the invoke answer ([PROTO-4]).
type Response struct {
	Schema    string         `json:"schema"`
	RequestID string         `json:"request_id"`
	OK        bool           `json:"ok"`
	Result    jsontext.Value `json:"result"`
	Error     *ErrorBody     `json:"error"`
}

// ErrorBody is a package failure.
type ErrorBody struct {
	Code       string `json:"code"`
	Retryable  bool   `json:"retryable"`
	Diagnostic string `json:"diagnostic"`
}

// PackageErrorCodes are the codes a package may answer.
var PackageErrorCodes = []string{"invalid-request", "incompatible", "conflict", "unavailable", "internal"}

// PollInput is the input of source.poll.
type PollInput struct {
	SourceID  string `json:"source_id"`
	ConfigRef string `json:"config_ref"`
}

// ResultInput is the input of result.classify, result.terminal and result.silent.
type ResultInput struct {
	SourceID string `json:"source_id"`
	Sequence int64  `json:"sequence"`
	Content  string `json:"content"`
}

// PollResult is the result of source.poll.
type PollResult struct {
	Status string `json:"status"`
	Output string `json:"output"`
}

// ClassifyResult is the result of result.classify.
type ClassifyResult struct {
	Classification string `json:"classification"`
}

// BoolResult is the result of result.terminal and result.silent.
type BoolResult struct {
	Value bool `json:"value"`
}

// tokenRe is the classification token's form. The request id and source id
// are checked by hand (isSHA256Hex, isSourceID): their bounded repetitions
// make regular expressions that cost fm about 0.2 ms to compile at start-up.
var tokenRe = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*$`)

// isSHA256Hex reports whether s matches ^sha256:[0-9a-f]{64}$.
func isSHA256Hex(s string) bool {
	hexPart, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(hexPart) != 64 {
		return false
	}
	for i := 0; i < len(hexPart); i++ {
		if c := hexPart[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// isSourceID reports whether s matches ^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$.
func isSourceID(s string) bool {
	if len(s) == 0 || len(s) > 64 || s[0] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ValidRequestID reports whether s is a request id or digest:
// sha256:<64 lowercase hex> ([PROTO-5]).
func ValidRequestID(s string) bool { return isSHA256Hex(s) }

// ValidSourceID reports whether s is a source id ([OP-1]):
// [A-Za-z0-9._-]{1,64}, not starting with '.'.
func ValidSourceID(s string) bool { return isSourceID(s) }

// ValidConfigRef reports whether s is a config reference ([OP-1]): one line of
// 1..MaxConfigRef bytes of UTF-8 with no control character.
func ValidConfigRef(s string) bool {
	return len(s) >= 1 && len(s) <= MaxConfigRef && utf8.ValidString(s) && !strings.ContainsFunc(s, IsControl)
}

// ValidClassification reports whether s is a classification token (§9): 1..64
// bytes matching ^[a-z0-9]+([._-][a-z0-9]+)*$.
func ValidClassification(s string) bool {
	return len(s) <= MaxClassifyToken && tokenRe.MatchString(s)
}

// ValidDiagnostic reports whether s is an error diagnostic ([PROTO-4]):
// 1..MaxDiagnostic bytes of UTF-8 with no control character.
func ValidDiagnostic(s string) bool {
	return len(s) >= 1 && len(s) <= MaxDiagnostic && utf8.ValidString(s) && !strings.ContainsFunc(s, IsControl)
}

// EscapedLen is the length of s inside a string of the canonical JSON that
// carries it in a request (strictjson.Canonical, RFC 8785): '"' and '\\'
// take 2 bytes, the C0 controls with a short escape (\b \t \n \f \r) 2,
// every other C0 control 6 (\u00XX), every other byte 1 (s is valid UTF-8).
//
// A captured result is carried as the content of every later
// result.classify, result.terminal and result.silent request, which must fit
// in MaxEnvelope bytes ([INV-4]). So a source.poll output is bounded twice
// ([OP-1], [CAP-4]): at most MaxPollOutput bytes, and at most
// MaxEscapedOutput bytes once escaped, which is MaxEnvelope less the longest
// such request with an empty content (adapter of 32 bytes, extension id and
// version of 128, source id of 64, every number of 19 digits: 840 bytes).
// Any output within both bounds can then be carried, whoever owns it and
// whatever its sequence; one beyond is refused at capture as
// response-oversized evidence, never captured as a result that no verdict
// could ever be asked about.
func EscapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\' || c == '\b' || c == '\t' || c == '\n' || c == '\f' || c == '\r':
			n++
		case c < 0x20:
			n += 5
		}
	}
	return n
}

// IsControl reports whether r is a control character in the protocol's sense:
// C0 (U+0000..U+001F), DEL (U+007F) or C1 (U+0080..U+009F).
func IsControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) }

// NewRequestID returns a fresh random request id ([PROTO-5]).
func NewRequestID() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return "sha256:" + hex.EncodeToString(b[:])
}

// CheckRequestID reports whether id is sha256:<64 lowercase hex>.
func CheckRequestID(id string) error {
	if !isSHA256Hex(id) {
		return errcode.New(errcode.Usage, "request id %q must be sha256:<64 lowercase hex>", trunc(id))
	}
	return nil
}

// PollRequestID derives the request id of a runner's source.poll ([RID-1]):
// the same registration generation and the same next sequence give the same
// id, so a retry before a durable capture is idempotent for the package.
func PollRequestID(adapter, sourceID string, seq int64, token, packageDigest string) string {
	h := sha256.New()
	for _, line := range []string{"firstmate-process-event-request-v1", adapter, sourceID, strconv.FormatInt(seq, 10), token, packageDigest} {
		h.Write([]byte(line))
		h.Write([]byte{'\n'})
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// CheckSourceID applies [OP-1] to a source id.
func CheckSourceID(s string) error {
	if !isSourceID(s) {
		return errcode.New(errcode.Usage, "source id %q must be 1..64 of [A-Za-z0-9._-], not starting with '.'", trunc(s))
	}
	return nil
}

// CheckConfigRef applies [OP-1] to a config reference.
func CheckConfigRef(s string) error {
	if !ValidConfigRef(s) {
		return errcode.New(errcode.Usage, "config ref must be one line of 1..%d bytes of UTF-8 with no control characters", MaxConfigRef)
	}
	return nil
}

// hidden decodes a document a package wrote: its object keys are package
// text, so refusals name a JSON pointer only as far as this host's own keys
// spell it (strictjson.DecodeOpts.HidePointers, [PROTO-4]).
var hidden = strictjson.DecodeOpts{HidePointers: true}

// CheckHandshake verifies a handshake response against the request it answers
// ([PROTO-2]). The adapter-name set must equal the enabled subset exactly.
func CheckHandshake(data []byte, req *HandshakeRequest) error {
	var resp HandshakeResponse
	if err := strictjson.DecodeWith(data, MaxEnvelope, "handshake response", &resp, hidden); err != nil {
		return refused(errcode.HandshakeInvalid, err)
	}
	if resp.RequestID != req.RequestID {
		return refuse(errcode.RequestIDMismatch, "handshake response: request_id does not match the request")
	}
	bad := func(field string) error {
		return refuse(errcode.HandshakeInvalid, "handshake response: %s does not match the binding", field)
	}
	switch {
	case resp.Schema != HandshakeResponseSchema:
		return bad("schema")
	case resp.ExtensionID != req.ExtensionID:
		return bad("extension_id")
	case resp.ExtensionVersion != req.ExtensionVersion:
		return bad("extension_version")
	case !slices.Contains(req.HostProtocols, resp.HostProtocol):
		return bad("host_protocol")
	case resp.Capability != req.Capability.Name:
		return bad("capability")
	case !slices.Contains(req.Capability.Versions, resp.CapabilityVersion):
		return bad("capability_version")
	case !sameSet(resp.AdapterNames, req.Capability.AdapterNames):
		return bad("adapter_names")
	}
	return nil
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y) && len(slices.Compact(x)) == len(a)
}

// CheckResponse verifies an invoke response and returns its result object.
// A well-formed ok=false answer becomes extension-<code>; its diagnostic is
// validated and dropped, never returned.
func CheckResponse(data []byte, requestID string) (jsontext.Value, error) {
	var resp Response
	if err := strictjson.DecodeWith(data, MaxEnvelope, "response", &resp, hidden); err != nil {
		return nil, refused(errcode.ResponseInvalid, err)
	}
	if resp.Schema != ResponseSchema {
		return nil, refuse(errcode.ResponseInvalid, "response: schema must be %q", ResponseSchema)
	}
	if resp.RequestID != requestID {
		return nil, refuse(errcode.RequestIDMismatch, "response: request_id does not match the request")
	}
	if resp.OK {
		if resp.Error != nil || resp.Result.Kind() != '{' {
			return nil, refuse(errcode.ResponseInvalid, "response: ok=true needs an object result and a null error")
		}
		return resp.Result, nil
	}
	if resp.Error == nil || resp.Result.Kind() != 'n' {
		return nil, refuse(errcode.ResponseInvalid, "response: ok=false needs a null result and an error object")
	}
	e := resp.Error
	if !slices.Contains(PackageErrorCodes, e.Code) {
		return nil, refuse(errcode.ResponseInvalid, "response: error.code is not one of %s", strings.Join(PackageErrorCodes, ", "))
	}
	if !ValidDiagnostic(e.Diagnostic) {
		return nil, refuse(errcode.ResponseInvalid, "response: error.diagnostic must be 1..%d bytes without control characters", MaxDiagnostic)
	}
	retry := ""
	if e.Retryable {
		retry = " (retryable)"
	}
	return nil, errcode.New(errcode.Code("extension-"+e.Code), "the package answered %s%s; its diagnostic is not shown", e.Code, retry)
}

// DecodeResult parses an operation's result object into the operation's exact
// shape and applies its value rules.
func DecodeResult(op string, raw jsontext.Value) (any, error) {
	wrap := func(err error) error { return refused(errcode.ResponseInvalid, err) }
	what := op + " result"
	switch op {
	case OpPoll:
		var r PollResult
		if err := strictjson.DecodeWith(raw, MaxEnvelope, what, &r, hidden); err != nil {
			return nil, wrap(err)
		}
		switch {
		case r.Status == "result" && len(r.Output) > MaxPollOutput:
			return nil, refuse(errcode.ResponseOversized, "%s: output is larger than %d bytes", what, MaxPollOutput)
		case r.Status == "result" && EscapedLen(r.Output) > MaxEscapedOutput:
			return nil, refuse(errcode.ResponseOversized, "%s: output takes %d bytes once JSON-escaped, more than the %d that fit in a verdict request", what, EscapedLen(r.Output), MaxEscapedOutput)
		case r.Status == "result" && len(r.Output) >= 1:
		case r.Status == "no-result" && r.Output == "":
		default:
			return nil, refuse(errcode.ResponseInvalid, "%s: needs status \"result\" with 1..%d bytes of output, or \"no-result\" with empty output", what, MaxPollOutput)
		}
		return &r, nil
	case OpClassify:
		var r ClassifyResult
		if err := strictjson.DecodeWith(raw, MaxEnvelope, what, &r, hidden); err != nil {
			return nil, wrap(err)
		}
		if !ValidClassification(r.Classification) {
			return nil, refuse(errcode.ResponseInvalid, "%s: classification must be a lower-case token of at most %d bytes", what, MaxClassifyToken)
		}
		return &r, nil
	case OpTerminal, OpSilent:
		var r BoolResult
		if err := strictjson.DecodeWith(raw, MaxEnvelope, what, &r, hidden); err != nil {
			return nil, wrap(err)
		}
		return &r, nil
	}
	return nil, errcode.New(errcode.Usage, "unknown operation %q (one of %s)", op, strings.Join(Operations, ", "))
}

// refusal is the host's own account of why it refused a package's answer
// (a handshake or invoke response, or an operation's result): the parse
// detail of strictjson (byte offset, JSON pointer, at most the escaped and
// bounded name of an unknown member) or the rule the answer broke. Its text
// is the coded error's message, and the evidence of a failed poll carries it
// as "detail" (EvidenceFor). It never holds any other package text: no value,
// no diagnostic, no stderr.
type refusal struct{ Detail string }

func (r *refusal) Error() string { return r.Detail }

// refuse is a coded refusal of a package's answer with the host's words.
func refuse(code errcode.Code, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return &errcode.Error{Code: code, Msg: msg, Err: &refusal{Detail: msg}}
}

// refused turns a strictjson refusal of a package's answer into code. Text
// that is not JSON, or a second document, is most often a stray line on
// stdout, so that refusal says where the package's own output must go.
func refused(code errcode.Code, err error) error {
	msg := err.Error()
	if errors.Is(err, strictjson.ErrStrayText) {
		msg += "; stdout must carry only the answer document (write debug output to stderr)"
	}
	return refuse(code, "%s", msg)
}

// Evidence is the host-produced document that replaces a failed source.poll
// ([OP-3]). It carries only host-chosen values, never package text. Detail
// is this project's one extension of the contract's four keys: present only
// when the host refused the package's answer (a refusal), it is the host's
// parse detail, at most MaxDetail bytes of printable ASCII.
type Evidence struct {
	Code        string `json:"code"`
	Detail      string `json:"detail,omitzero"`
	ExtensionID string `json:"extension_id"`
	Operation   string `json:"operation"`
	Schema      string `json:"schema"`
}

// MaxDetail bounds the evidence's detail in bytes.
const MaxDetail = 200

// EvidenceFor returns the canonical evidence line for a failed poll.
func EvidenceFor(err error, extensionID string) []byte {
	if extensionID == "" {
		extensionID = "unknown"
	}
	ev := Evidence{Code: string(errcode.Of(err)), ExtensionID: extensionID, Operation: OpPoll, Schema: EvidenceSchema}
	var r *refusal
	if errors.As(err, &r) {
		ev.Detail = printable(r.Detail, MaxDetail)
	}
	b, _ := strictjson.Canonical(ev)
	return b
}

// printable bounds s to n bytes of printable ASCII: any other byte becomes
// '?', and a longer text is cut and ends in "...". The host's refusal texts
// are ASCII already; this keeps the bound a property of the evidence itself.
func printable(s string, n int) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	if len(b) > n {
		b = append(b[:n-3], "..."...)
	}
	return string(b)
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
