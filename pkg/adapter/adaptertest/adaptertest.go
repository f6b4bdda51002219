// Package adaptertest runs a process-event adapter Handler in-process, the
// way the Firstmate host would run its entrypoint, and checks every answer as
// strictly as the host does.
//
// A Harness builds valid envelopes (fresh random request ids, a random
// package digest, the handler's own identity), feeds them to adapter.RunContext
// with the verb, and checks stdout with the host's own checks (package
// internal/protocol of fm, the same code fm runs): exit status 0, exactly one
// canonical JSON document of at most 65,536 bytes, the request id echoed, the
// result shaped and bounded for its operation, stderr within the host's
// 8,192-byte bound, and nothing written to os.Stdout by the handler beside the
// response (a stray fmt.Println would break the response of a program that
// did not use Serve). Any protocol violation fails the test (t.Fatalf); an
// ok=false answer is returned to the test as an *adapter.ErrorBody.
//
//	func TestPoll(t *testing.T) {
//		h := adaptertest.New(t, myadapter.New())
//		h.Handshake(h.HandshakeRequest())
//		res, fail := h.Poll("my-adapter", adapter.PollInput{SourceID: "s1", ConfigRef: "main"})
//		if fail != nil { t.Fatalf("poll failed: %+v", fail) }
//		_ = res
//	}
//
// Raw feeds arbitrary bytes, for testing refusals. CheckManifest compares a
// firstmate-extension.json with the handler's identity.
//
// The harness does not start a process: it cannot observe process groups,
// leaked children, the minimal environment or the host's timeouts. Run the
// built entrypoint under a real fm for that, with Home.
//
// # Against a real fm
//
// NewHome gives a test a throwaway Firstmate home and runs a real fm binary
// in it (os/exec only: it links no host code beyond the shapes and checks of
// what fm prints). It lays out a
// package with the modes fm accepts, binds it, registers sources and runs
// them with the fm commands an operator types, and reads their output
// strictly. The package's entrypoint can be the test binary itself, so the
// test builds nothing but needs an fm: pass its path, or set FM_BIN, or put
// fm in PATH (otherwise the test is skipped).
//
//	func TestMain(m *testing.M) {
//		if filepath.Base(os.Args[0]) == "firstmate-extension" {
//			adapter.Serve(myadapter.New()) // run by fm as the entrypoint
//			return
//		}
//		os.Exit(m.Run())
//	}
//
//	func TestUnderFM(t *testing.T) {
//		h := adaptertest.NewHome(t, "") // $FM_BIN or fm in $PATH
//		exe, _ := os.Executable()
//		pkg := h.EntrypointPackage("firstmate-extension.json", exe)
//		h.Bind(pkg, []string{"my-adapter"}, []string{"artifact-references"})
//		h.Register("my-adapter", "s1", "main")
//		r := h.Start("s1") // one attached poll
//		if r.Status != adaptertest.Captured { t.Fatalf("%+v", r) }
//		data, _ := os.ReadFile(r.Path)           // exactly what Poll returned
//		class := h.Classify(r.Path)              // result.classify, by the captured owner
//		wakes := h.Wakes()                       // the check wake announcing it
//		h.Handled("s1", h.Inbox()[0].Sequence)
//		_, _, _ = data, class, wakes
//	}
//
// Each helper fails the test with fm's error line when fm refuses; Run and
// Refused hand the exit status to the test instead. See NewHome for what the
// home contains (in particular: no built-in adapters) and how it is removed.
package adaptertest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/go-json-experiment/json/jsontext"

	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/pkg/adapter"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// NewRequestID returns a fresh random request id, sha256:<64 lowercase hex>.
func NewRequestID() string { return protocol.NewRequestID() }

// Harness runs one Handler in-process. Its fields may be changed between
// calls.
type Harness struct {
	T       testing.TB
	Handler adapter.Handler
	// Env is passed to the handler. New sets ExtensionID and
	// ExtensionVersion from the handler's identity and StateDir to a fresh
	// t.TempDir(); the same StateDir is kept for every call, as the host
	// keeps FIRSTMATE_EXTENSION_STATE.
	Env adapter.Env
	// PackageDigest is sent in every envelope; New picks a random one.
	PackageDigest string
	// Context is handed to the handler; New uses t.Context().
	Context context.Context
}

// New returns a Harness for h.
func New(t testing.TB, h adapter.Handler) *Harness {
	t.Helper()
	id := h.Identity()
	if err := id.Validate(); err != nil {
		t.Fatalf("adaptertest: handler %v", err)
	}
	return &Harness{
		T:       t,
		Handler: h,
		Env: adapter.Env{
			ExtensionID:      id.ExtensionID,
			ExtensionVersion: id.ExtensionVersion,
			StateDir:         t.TempDir(),
		},
		PackageDigest: NewRequestID(),
		Context:       t.Context(),
	}
}

// Outcome is what one run of the entrypoint produced.
type Outcome struct {
	Exit   int
	Stdout []byte
	Stderr []byte
	// Stray is what the handler wrote to the process's os.Stdout, beside
	// the response (at most the first maxStray bytes). Under Serve those
	// bytes go to stderr, where they count against the host's bound;
	// Handshake and Invoke fail the test when there are any.
	Stray []byte
	// StrayBytes is how many bytes the handler wrote to os.Stdout.
	StrayBytes int64
}

// maxStray bounds what Outcome.Stray keeps.
const maxStray = 4096

// stdoutMu serializes harness runs: each one replaces the process-wide
// os.Stdout while the handler runs.
var stdoutMu sync.Mutex

// Raw runs the handler with the verb and stdin exactly as given and returns
// what it produced, without checking anything.
//
// While the handler runs, os.Stdout is a capture file, so that what the
// handler writes there (fmt.Println, a logger or a child process given
// os.Stdout) is reported as Outcome.Stray instead of passing silently: the
// response reaches the host only through the SDK. The capture is read
// through a handle of its own, so a handler that closes os.Stdout hides
// nothing. What it cannot see is a writer that took os.Stdout before the
// run (a package-level log.New(os.Stdout, …)) or a raw write to fd 1: those
// reach fd 1 itself, where the test framework writes too. Under Serve they
// land on stderr all the same. Runs of harnesses are serialized for that; code outside the
// handler that prints to os.Stdout while a run is under way (another
// parallel test) is captured too, and under the race detector its reading
// of the os.Stdout variable is reported as a data race with the harness:
// do not print to os.Stdout from tests that run in parallel with one.
func (h *Harness) Raw(verb string, stdin []byte) Outcome {
	h.T.Helper()
	capture, err := os.CreateTemp("", "adaptertest-stdout-")
	if err != nil {
		h.T.Fatalf("adaptertest: %v", err)
	}
	defer capture.Close()
	captured, err := os.Open(capture.Name())
	os.Remove(capture.Name()) // both kept open, gone from the file system
	if err != nil {
		h.T.Fatalf("adaptertest: %v", err)
	}
	defer captured.Close()
	var stdout, stderr bytes.Buffer
	stdoutMu.Lock()
	saved := os.Stdout
	os.Stdout = capture
	exit := func() int {
		defer func() { os.Stdout = saved; stdoutMu.Unlock() }()
		return adapter.RunContext(h.Context, h.Env, []string{"firstmate-extension", verb},
			bytes.NewReader(stdin), &stdout, &stderr, h.Handler)
	}()
	out := Outcome{Exit: exit, Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	if fi, err := captured.Stat(); err == nil && fi.Size() > 0 {
		out.StrayBytes = fi.Size()
		out.Stray = make([]byte, min(fi.Size(), maxStray))
		n, _ := captured.ReadAt(out.Stray, 0)
		out.Stray = out.Stray[:n]
	}
	return out
}

// HandshakeRequest returns a valid handshake request for the handler's
// identity enabling adapterNames (all declared adapters when none is given).
func (h *Harness) HandshakeRequest(adapterNames ...string) *wire.HandshakeRequest {
	id := h.Handler.Identity()
	if len(adapterNames) == 0 {
		adapterNames = id.AdapterNames
	}
	return &wire.HandshakeRequest{
		Schema:           wire.HandshakeRequestSchema,
		RequestID:        NewRequestID(),
		HostProtocols:    []int64{wire.HostProtocol},
		ExtensionID:      id.ExtensionID,
		ExtensionVersion: id.ExtensionVersion,
		PackageDigest:    h.PackageDigest,
		Capability: wire.HandshakeCapability{
			Name:         wire.CapabilityName,
			Versions:     []int64{wire.CapabilityVersion},
			AdapterNames: append([]string(nil), adapterNames...),
		},
	}
}

// Handshake sends req with the verb handshake. When the handler answers
// (exit 0), the answer must be a strict, canonical handshake response that
// the host would accept for req, and it is returned. When the handler refuses
// (non-zero exit), stdout must be empty, and nil is returned with the
// outcome for the test to inspect.
func (h *Harness) Handshake(req *wire.HandshakeRequest) (*wire.HandshakeResponse, Outcome) {
	h.T.Helper()
	data, err := wire.Canonical(req)
	if err != nil {
		h.T.Fatalf("adaptertest: encode handshake request: %v", err)
	}
	out := h.Raw("handshake", data)
	h.checkStreams(out)
	if out.Exit != adapter.ExitOK {
		if len(out.Stdout) != 0 {
			h.T.Fatalf("adaptertest: handshake exited %d but wrote %d bytes to stdout", out.Exit, len(out.Stdout))
		}
		return nil, out
	}
	resp, err := DecodeHandshakeResponse(req, out.Stdout)
	if err != nil {
		h.T.Fatalf("adaptertest: handshake: %v\nstdout: %s", err, out.Stdout)
	}
	return resp, out
}

// Request returns a valid invoke request for the handler's identity with a
// fresh random request id. input is encoded as the request's input object
// (normally an adapter.PollInput or adapter.ResultInput).
func (h *Harness) Request(adapterName, operation string, input any) *wire.Request {
	h.T.Helper()
	raw, err := wire.Canonical(input)
	if err != nil {
		h.T.Fatalf("adaptertest: encode input: %v", err)
	}
	id := h.Handler.Identity()
	return &wire.Request{
		Schema:            wire.RequestSchema,
		RequestID:         NewRequestID(),
		HostProtocol:      wire.HostProtocol,
		ExtensionID:       id.ExtensionID,
		ExtensionVersion:  id.ExtensionVersion,
		PackageDigest:     h.PackageDigest,
		Capability:        wire.CapabilityName,
		CapabilityVersion: wire.CapabilityVersion,
		Adapter:           adapterName,
		Operation:         operation,
		Input:             raw,
	}
}

// Invoke sends req with the verb invoke and returns the strictly decoded
// response. The handler must exit 0 with exactly one canonical response
// document that echoes req's request id; anything else fails the test.
func (h *Harness) Invoke(req *wire.Request) (*wire.Response, Outcome) {
	h.T.Helper()
	data, err := wire.Canonical(req)
	if err != nil {
		h.T.Fatalf("adaptertest: encode request: %v", err)
	}
	return h.InvokeRaw(req.RequestID, data)
}

// InvokeRaw sends arbitrary stdin bytes with the verb invoke and checks the
// answer like Invoke, expecting it to echo requestID.
func (h *Harness) InvokeRaw(requestID string, stdin []byte) (*wire.Response, Outcome) {
	h.T.Helper()
	out := h.Raw("invoke", stdin)
	h.checkStreams(out)
	if out.Exit != adapter.ExitOK {
		h.T.Fatalf("adaptertest: invoke exited %d\nstderr: %s", out.Exit, out.Stderr)
	}
	resp, err := DecodeResponse(requestID, out.Stdout)
	if err != nil {
		h.T.Fatalf("adaptertest: invoke: %v\nstdout: %.2000s", err, out.Stdout)
	}
	return resp, out
}

// checkStreams applies the rules common to both verbs: nothing written to
// os.Stdout beside the response, stderr within the host's bound, stdout
// empty or one canonical document within the envelope bound.
func (h *Harness) checkStreams(out Outcome) {
	h.T.Helper()
	if out.StrayBytes > 0 {
		h.T.Fatalf("adaptertest: the handler wrote %d bytes to stdout (os.Stdout), which carries only the response: %.200q\n"+
			"under Serve they go to stderr, counted against the host's %d-byte bound; log with Call.Logf or to os.Stderr instead",
			out.StrayBytes, out.Stray, wire.MaxStderrBytes)
	}
	if len(out.Stderr) > wire.MaxStderrBytes {
		h.T.Fatalf("adaptertest: %d bytes on stderr, more than the host's %d", len(out.Stderr), wire.MaxStderrBytes)
	}
	if len(out.Stdout) > wire.MaxEnvelopeBytes {
		h.T.Fatalf("adaptertest: %d bytes on stdout, more than %d", len(out.Stdout), wire.MaxEnvelopeBytes)
	}
	if len(out.Stdout) == 0 {
		return
	}
	canon := jsontext.Value(bytes.Clone(out.Stdout))
	if err := canon.Canonicalize(); err != nil || !bytes.Equal(canon, out.Stdout) {
		h.T.Fatalf("adaptertest: stdout is not one canonical json document: %.2000s", out.Stdout)
	}
}

// call invokes one operation and returns the ok result or the error body.
func (h *Harness) call(requestID, adapterName, operation string, input any) ([]byte, *adapter.ErrorBody) {
	h.T.Helper()
	req := h.Request(adapterName, operation, input)
	if requestID != "" {
		req.RequestID = requestID
	}
	resp, _ := h.Invoke(req)
	if !resp.OK {
		return nil, resp.Error
	}
	return resp.Result, nil
}

// Poll invokes source.poll with a fresh request id. It returns the validated
// result, or the error body of an ok=false answer.
func (h *Harness) Poll(adapterName string, in adapter.PollInput) (adapter.PollResult, *adapter.ErrorBody) {
	h.T.Helper()
	return h.PollID(NewRequestID(), adapterName, in)
}

// PollID is Poll with a chosen request id: send the same id twice to test
// idempotence, as the host does until it has captured a result.
func (h *Harness) PollID(requestID, adapterName string, in adapter.PollInput) (adapter.PollResult, *adapter.ErrorBody) {
	h.T.Helper()
	raw, fail := h.call(requestID, adapterName, wire.OpPoll, in)
	if fail != nil {
		return adapter.PollResult{}, fail
	}
	res, err := DecodePollResult(raw)
	if err != nil {
		h.T.Fatalf("adaptertest: %v", err)
	}
	return res, nil
}

// Classify invokes result.classify.
func (h *Harness) Classify(adapterName string, in adapter.ResultInput) (adapter.ClassifyResult, *adapter.ErrorBody) {
	h.T.Helper()
	raw, fail := h.call("", adapterName, wire.OpClassify, in)
	if fail != nil {
		return adapter.ClassifyResult{}, fail
	}
	res, err := decodeResult[wire.ClassifyResult](wire.OpClassify, raw)
	if err != nil {
		h.T.Fatalf("adaptertest: %v", err)
	}
	return res, nil
}

// Terminal invokes result.terminal.
func (h *Harness) Terminal(adapterName string, in adapter.ResultInput) (bool, *adapter.ErrorBody) {
	h.T.Helper()
	return h.boolOp(adapterName, wire.OpTerminal, in)
}

// Silent invokes result.silent.
func (h *Harness) Silent(adapterName string, in adapter.ResultInput) (bool, *adapter.ErrorBody) {
	h.T.Helper()
	return h.boolOp(adapterName, wire.OpSilent, in)
}

func (h *Harness) boolOp(adapterName, op string, in adapter.ResultInput) (bool, *adapter.ErrorBody) {
	h.T.Helper()
	raw, fail := h.call("", adapterName, op, in)
	if fail != nil {
		return false, fail
	}
	res, err := decodeResult[wire.BoolResult](op, raw)
	if err != nil {
		h.T.Fatalf("adaptertest: %v", err)
	}
	return res.Value, nil
}

// CheckManifest reads the manifest at path, validates it as bind would, and
// fails the test unless it declares exactly the handler's identity (id,
// version, adapter-name set) and offers host protocol 1 and
// process-event-adapter/1. It returns the manifest.
func CheckManifest(t testing.TB, path string, h adapter.Handler) *wire.Manifest {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("adaptertest: %v", err)
	}
	m, err := wire.DecodeManifest(data)
	if err != nil {
		t.Fatalf("adaptertest: %s: %v", path, err)
	}
	if err := CheckIdentity(m, h.Identity()); err != nil {
		t.Fatalf("adaptertest: %s: %v", path, err)
	}
	return m
}

// CheckIdentity reports whether m declares exactly id (same extension id,
// version and adapter-name set) and offers host protocol 1 and
// process-event-adapter/1, so that a bind and handshake can succeed.
func CheckIdentity(m *wire.Manifest, id adapter.Identity) error {
	if m.ID != id.ExtensionID || m.Version != id.ExtensionVersion {
		return fmt.Errorf("manifest: %s@%s, but the handler says %s@%s", m.ID, m.Version, id.ExtensionID, id.ExtensionVersion)
	}
	a, b := slices.Clone(m.Capabilities[0].AdapterNames), slices.Clone(id.AdapterNames)
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) {
		return fmt.Errorf("manifest: adapter names %v, but the handler says %v", a, b)
	}
	if !slices.Contains(m.HostProtocols, wire.HostProtocol) || !slices.Contains(m.Capabilities[0].Versions, wire.CapabilityVersion) {
		return fmt.Errorf("manifest: host protocol %d and %s version %d must be offered", wire.HostProtocol, wire.CapabilityName, wire.CapabilityVersion)
	}
	return nil
}

// DecodeHandshakeResponse checks a handshake response exactly as the host
// does (it is the host's own check) and returns it: strictly parsed, the
// request id echoed, the extension identity, a host protocol and capability
// version req offered, and exactly req's adapter-name set.
func DecodeHandshakeResponse(req *wire.HandshakeRequest, data []byte) (*wire.HandshakeResponse, error) {
	return protocol.DecodeHandshake(data, req)
}

// DecodeResponse checks an invoke response to the request requestID exactly
// as the host does (it is the host's own check) and returns it: strictly
// parsed, the request id echoed, ok=true with an object result, or ok=false
// with a valid error body, which the host would report as extension-<code>.
func DecodeResponse(requestID string, data []byte) (*wire.Response, error) {
	return protocol.DecodeResponse(data, requestID)
}

// DecodePollResult checks a source.poll result object exactly as the host
// does at capture and returns it; an output the host would refuse as
// response-oversized is an error here too.
func DecodePollResult(raw []byte) (wire.PollResult, error) {
	return decodeResult[wire.PollResult](wire.OpPoll, raw)
}

// decodeResult applies the host's check of op's result to raw.
func decodeResult[R wire.PollResult | wire.ClassifyResult | wire.BoolResult](op string, raw []byte) (R, error) {
	v, err := protocol.DecodeResult(op, raw)
	if err != nil {
		var zero R
		return zero, err
	}
	return *v.(*R), nil
}
