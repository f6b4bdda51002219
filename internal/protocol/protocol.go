// Package protocol holds the host's side of the protocol between fm and a
// package entrypoint (CONTRACT §7.2, §9, §10.4): what it sends, how it judges
// what a package answers, and what it records when a poll fails. The wire
// itself (schemas, envelopes, bounds, formats) is defined once, in the public
// package firstmate.dev/fm/pkg/adapter/wire, which the SDK imports too; this
// package adds only host policy on top of it.
//
// The rules, and why each holds:
//
//  1. Every byte a package returns is untrusted evidence. Answers are parsed
//     strictly (wire's rule 1) with their object keys hidden from refusals
//     (strictjson.DecodeOpts.HidePointers), since a key is package text.
//  2. Every identity in an answer must equal what the host sent: the request
//     id (request-id-mismatch otherwise), and in a handshake the schema,
//     extension id and version, a host protocol and capability version the
//     host offered, and exactly the enabled adapter-name set
//     (handshake-invalid otherwise; CheckHandshake). An answer can never
//     widen what the host does.
//  3. A package failure is reported by its code only, as extension-<code>;
//     its diagnostic is validated and dropped (CheckResponse), so no package
//     text reaches an operator as if it were fm's.
//  4. A poll output beyond wire.MaxOutputBytes, or beyond
//     wire.MaxEscapedOutputBytes once escaped, is response-oversized at
//     capture (DecodeResult): it could never be carried into a verdict
//     request, so it is never captured as a result.
//  5. The request id of a runner's poll is derived, not random
//     (PollRequestID, [RID-1]): the same registration generation and the
//     same next sequence give the same id, so a retry before a durable
//     capture is idempotent for the package. Every other request id is fresh
//     and random (NewRequestID).
//  6. A failed poll is replaced by host-written evidence (EvidenceFor,
//     [OP-3]) holding only host-chosen values: the code, the extension id,
//     the operation and, when the host refused the answer, the host's own
//     parse detail, bounded to MaxDetail bytes of printable ASCII.
//  7. Operator input that names protocol values (a request id, a source id,
//     a config ref) is checked with wire's formats and refused as usage
//     (CheckRequestID, CheckSourceID, CheckConfigRef).
package protocol

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// HandshakeTimeout is the default bound of a handshake, in milliseconds
// ([PROTO-1]); an operator may set another per binding ([HINT-3]).
const HandshakeTimeout = 5000

// The versions this host speaks, offered in every handshake: host protocol
// wire.HostProtocol and capability version wire.CapabilityVersion.
var (
	HostProtocols      = []int64{wire.HostProtocol}
	CapabilityVersions = []int64{wire.CapabilityVersion}
)

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
	if !wire.ValidRequestID(id) {
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
	if !wire.ValidSourceID(s) {
		return errcode.New(errcode.Usage, "source id %q must be 1..64 of [A-Za-z0-9._-], not starting with '.'", trunc(s))
	}
	return nil
}

// CheckConfigRef applies [OP-1] to a config reference.
func CheckConfigRef(s string) error {
	if !wire.ValidConfigRef(s) {
		return errcode.New(errcode.Usage, "config ref must be one line of 1..%d bytes of UTF-8 with no control characters", wire.MaxConfigRefBytes)
	}
	return nil
}

// hidden decodes a document a package wrote: its object keys are package
// text, so refusals name a JSON pointer only as far as this host's own keys
// spell it (strictjson.DecodeOpts.HidePointers, [PROTO-4]).
var hidden = strictjson.DecodeOpts{HidePointers: true}

// CheckHandshake verifies a handshake response against the request it answers
// ([PROTO-2]); see DecodeHandshake.
func CheckHandshake(data []byte, req *wire.HandshakeRequest) error {
	_, err := DecodeHandshake(data, req)
	return err
}

// DecodeHandshake verifies a handshake response against the request it
// answers ([PROTO-2]) and returns it: strictly parsed, the request id
// echoed, the schema and extension identity equal, a host protocol and
// capability version the request offered, and exactly the enabled
// adapter-name set.
func DecodeHandshake(data []byte, req *wire.HandshakeRequest) (*wire.HandshakeResponse, error) {
	var resp wire.HandshakeResponse
	if err := strictjson.DecodeWith(data, wire.MaxEnvelopeBytes, "handshake response", &resp, hidden); err != nil {
		return nil, refused(errcode.HandshakeInvalid, err)
	}
	if resp.RequestID != req.RequestID {
		return nil, refuse(errcode.RequestIDMismatch, "handshake response: request_id does not match the request")
	}
	bad := func(field string) (*wire.HandshakeResponse, error) {
		return nil, refuse(errcode.HandshakeInvalid, "handshake response: %s does not match the binding", field)
	}
	switch {
	case resp.Schema != wire.HandshakeResponseSchema:
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
	return &resp, nil
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

// DecodeResponse verifies an invoke response to the request requestID and
// returns it: strictly parsed, the request id echoed, and either ok=true with
// an object result and a null error, or ok=false with a null result and a
// valid error body (one of the five codes, a bounded diagnostic).
func DecodeResponse(data []byte, requestID string) (*wire.Response, error) {
	var resp wire.Response
	if err := strictjson.DecodeWith(data, wire.MaxEnvelopeBytes, "response", &resp, hidden); err != nil {
		return nil, refused(errcode.ResponseInvalid, err)
	}
	if resp.Schema != wire.ResponseSchema {
		return nil, refuse(errcode.ResponseInvalid, "response: schema must be %q", wire.ResponseSchema)
	}
	if resp.RequestID != requestID {
		return nil, refuse(errcode.RequestIDMismatch, "response: request_id does not match the request")
	}
	result := jsontext.Value(resp.Result).Kind()
	if resp.OK {
		if resp.Error != nil || result != '{' {
			return nil, refuse(errcode.ResponseInvalid, "response: ok=true needs an object result and a null error")
		}
		return &resp, nil
	}
	if resp.Error == nil || result != 'n' {
		return nil, refuse(errcode.ResponseInvalid, "response: ok=false needs a null result and an error object")
	}
	e := resp.Error
	if !e.Code.Valid() {
		return nil, refuse(errcode.ResponseInvalid, "response: error.code is not one of %s", codeList)
	}
	if !wire.ValidDiagnostic(e.Diagnostic) {
		return nil, refuse(errcode.ResponseInvalid, "response: error.diagnostic must be 1..%d bytes without control characters", wire.MaxDiagnosticBytes)
	}
	return &resp, nil
}

// codeList spells wire.Codes for messages.
var codeList = func() string {
	var b strings.Builder
	for i, c := range wire.Codes {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(string(c))
	}
	return b.String()
}()

// CheckResponse verifies an invoke response (DecodeResponse) and returns its
// result object. A well-formed ok=false answer becomes extension-<code>; its
// diagnostic is validated and left out of the error (host.Call.Diagnostic
// hands it to the operator's opt-ins).
func CheckResponse(data []byte, requestID string) ([]byte, error) {
	resp, err := DecodeResponse(data, requestID)
	if err != nil {
		return nil, err
	}
	if resp.OK {
		return resp.Result, nil
	}
	e := resp.Error
	retry := ""
	if e.Retryable {
		retry = " (retryable)"
	}
	return nil, errcode.New(errcode.Code("extension-"+string(e.Code)), "the package answered %s%s; its diagnostic is shown only where asked: --show-stderr of a direct call, or the source's debug log (fm procevent debug)", e.Code, retry)
}

// DecodeResult parses an operation's result object into the operation's exact
// shape (*wire.PollResult, *wire.ClassifyResult or *wire.BoolResult) and
// applies its value rules.
func DecodeResult(op string, raw []byte) (any, error) {
	wrap := func(err error) error { return refused(errcode.ResponseInvalid, err) }
	what := op + " result"
	switch op {
	case wire.OpPoll:
		var r wire.PollResult
		if err := strictjson.DecodeWith(raw, wire.MaxEnvelopeBytes, what, &r, hidden); err != nil {
			return nil, wrap(err)
		}
		switch {
		case r.Status == wire.StatusResult && len(r.Output) > wire.MaxOutputBytes:
			return nil, refuse(errcode.ResponseOversized, "%s: output is larger than %d bytes", what, wire.MaxOutputBytes)
		case r.Status == wire.StatusResult && wire.EscapedLen(r.Output) > wire.MaxEscapedOutputBytes:
			return nil, refuse(errcode.ResponseOversized, "%s: output takes %d bytes once JSON-escaped, more than the %d that fit in a verdict request", what, wire.EscapedLen(r.Output), wire.MaxEscapedOutputBytes)
		case r.Status == wire.StatusResult && len(r.Output) >= 1:
		case r.Status == wire.StatusNoResult && r.Output == "":
		default:
			return nil, refuse(errcode.ResponseInvalid, "%s: needs status \"result\" with 1..%d bytes of output, or \"no-result\" with empty output", what, wire.MaxOutputBytes)
		}
		return &r, nil
	case wire.OpClassify:
		var r wire.ClassifyResult
		if err := strictjson.DecodeWith(raw, wire.MaxEnvelopeBytes, what, &r, hidden); err != nil {
			return nil, wrap(err)
		}
		if !wire.ValidClassification(r.Classification) {
			return nil, refuse(errcode.ResponseInvalid, "%s: classification must be a lower-case token of at most %d bytes", what, wire.MaxClassificationBytes)
		}
		return &r, nil
	case wire.OpTerminal, wire.OpSilent:
		var r wire.BoolResult
		if err := strictjson.DecodeWith(raw, wire.MaxEnvelopeBytes, what, &r, hidden); err != nil {
			return nil, wrap(err)
		}
		return &r, nil
	}
	return nil, errcode.New(errcode.Usage, "unknown operation %q (one of %s)", op, strings.Join(wire.Operations, ", "))
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

// MaxDetail bounds the evidence's detail in bytes.
const MaxDetail = 200

// EvidenceFor returns the canonical evidence line (wire.Evidence) for a
// failed poll ([OP-3]).
func EvidenceFor(err error, extensionID string) []byte {
	if extensionID == "" {
		extensionID = "unknown"
	}
	ev := wire.Evidence{Code: string(errcode.Of(err)), ExtensionID: extensionID, Operation: wire.OpPoll, Schema: wire.EvidenceSchema}
	var r *refusal
	if errors.As(err, &r) {
		ev.Detail = r.Detail
	}
	var c *confinedNote
	if errors.As(err, &c) {
		ev.Detail = strings.TrimPrefix(ev.Detail+"; "+c.note, "; ")
	}
	ev.Detail = printable(ev.Detail, MaxDetail)
	b, _ := strictjson.Canonical(ev)
	return b
}

// RefusalDetail is the host's account of a refused answer in err, printable
// and bounded as evidence carries it, without the confinement note; "" when
// err refused no answer.
func RefusalDetail(err error) string {
	var r *refusal
	if errors.As(err, &r) {
		return printable(r.Detail, MaxDetail)
	}
	return ""
}

// confinedNote carries the host's account of a failed invocation's
// confinement (Confined).
type confinedNote struct {
	note string
	err  error
}

func (c *confinedNote) Error() string { return c.err.Error() }
func (c *confinedNote) Unwrap() error { return c.err }

// Confined marks err, the failure of an invocation that ran confined, with
// the host's note on it ([CONF-5]): EvidenceFor adds the note to the
// evidence's detail, so a failed poll's evidence says it ran confined. The
// note is host text, never package text.
func Confined(err error, note string) error { return &confinedNote{note: note, err: err} }

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

// Printable is the evidence's bound and escape (printable ASCII, at most n
// bytes) for other host texts fm keeps, such as a source's history.
func Printable(s string, n int) string { return printable(s, n) }
