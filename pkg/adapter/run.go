package adapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"

	"firstmate.dev/fm/pkg/adapter/wire"
)

// Handler is what an adapter author implements: the package's identity and
// the four operations of process-event-adapter/1. Run calls exactly one method
// per process, after validating the request; the result it returns is
// checked against the protocol's shapes and bounds before it is written.
//
// A method returns an error to answer ok=false: an *Error (see Errorf) picks
// the code and retryability, any other error is internal and not retryable.
// Methods must honour ctx: it is cancelled when the host sends SIGTERM or
// SIGINT (on its timeout or shutdown).
type Handler interface {
	// Identity returns the manifest's id and version and the adapter names
	// the manifest declares. It must match firstmate-extension.json.
	Identity() Identity
	// Poll waits a bounded time for the next event of in.SourceID and
	// returns Output(text) or NoResult(). It must return NoResult well
	// before the binding's timeout (default 300 s) when nothing happens.
	Poll(ctx context.Context, call *Call, in PollInput) (PollResult, error)
	// Classify names a captured result with a lower-case token.
	Classify(ctx context.Context, call *Call, in ResultInput) (ClassifyResult, error)
	// Terminal reports whether a captured result ends the source: true
	// retires that registration generation.
	Terminal(ctx context.Context, call *Call, in ResultInput) (BoolResult, error)
	// Silent reports whether a captured result needs no attention: true
	// marks it handled without announcing it.
	Silent(ctx context.Context, call *Call, in ResultInput) (BoolResult, error)
}

// Identity is the package identity a Handler declares.
type Identity struct {
	// ExtensionID is the manifest id, e.g. "org.example.review-feed".
	ExtensionID string
	// ExtensionVersion is the manifest version, e.g. "1.2.3".
	ExtensionVersion string
	// AdapterNames lists every adapter the manifest declares. The operator
	// may enable a subset; the handshake answers exactly that subset.
	AdapterNames []string
}

// Validate checks the identity's formats: a valid id and SemVer version, and
// a non-empty, duplicate-free list of valid adapter names.
func (id Identity) Validate() error {
	if err := wire.CheckID(id.ExtensionID); err != nil {
		return fmt.Errorf("identity: extension %v", err)
	}
	if err := wire.CheckVersion(id.ExtensionVersion); err != nil {
		return fmt.Errorf("identity: extension %v", err)
	}
	if err := wire.CheckAdapterNames(id.AdapterNames); err != nil {
		return fmt.Errorf("identity: %v", err)
	}
	return nil
}

// Env is the part of the process environment the host defines
// (spec [INV-3]). Nothing else of the operator's environment is passed.
type Env struct {
	ExtensionID      string // FIRSTMATE_EXTENSION_ID
	ExtensionVersion string // FIRSTMATE_EXTENSION_VERSION
	// StateDir is FIRSTMATE_EXTENSION_STATE: a private (0700) directory for
	// this package's own state, kept across invocations and upgrades.
	StateDir string
}

// EnvFromOS reads Env from the process environment.
func EnvFromOS() Env {
	return Env{
		ExtensionID:      os.Getenv("FIRSTMATE_EXTENSION_ID"),
		ExtensionVersion: os.Getenv("FIRSTMATE_EXTENSION_VERSION"),
		StateDir:         os.Getenv("FIRSTMATE_EXTENSION_STATE"),
	}
}

// Call describes the invocation a Handler method serves.
type Call struct {
	// RequestID is the request's id, the package's idempotence key: every
	// source.poll of a source carries the same id until the host has
	// durably captured something for it (see Replay).
	RequestID string
	// Adapter is the adapter this request is for (one of the enabled names).
	Adapter string
	// Operation is one of wire.OpPoll, OpClassify, OpTerminal, OpSilent.
	Operation string
	// ExtensionID, ExtensionVersion and PackageDigest are the bound identity.
	ExtensionID      string
	ExtensionVersion string
	PackageDigest    string
	// Env is the host-defined environment.
	Env Env

	log *logWriter
}

// Logf writes one line to stderr. Lines go through a budget of LogBudget
// bytes per process (the host refuses more than 8,192 bytes of stderr and
// never shows it); past the budget, lines are dropped. It is safe for
// concurrent use: lines from several goroutines are written whole, one at a
// time, and together never past the budget.
func (c *Call) Logf(format string, args ...any) {
	if c == nil || c.log == nil {
		return
	}
	c.log.printf(format, args...)
}

// LogBudget is how many bytes of stderr the SDK writes at most per process,
// its own messages and Call.Logf lines together. It leaves half of the host's
// 8,192-byte stderr bound for anything else the process writes.
const LogBudget = 4096

// logWriter is the budgeted stderr of one run; mu serializes its writers
// (a handler may log from several goroutines).
type logWriter struct {
	mu   sync.Mutex
	w    io.Writer
	left int
	cut  bool
}

func newLogWriter(w io.Writer) *logWriter { return &logWriter{w: w, left: LogBudget} }

const logCutMarker = "[log truncated]\n"

func (l *logWriter) printf(format string, args ...any) {
	line := wire.Sanitize(fmt.Sprintf(format, args...)) + "\n"
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w == nil || l.cut {
		return
	}
	room := l.left - len(logCutMarker)
	if len(line) > room {
		if room > 1 {
			io.WriteString(l.w, wire.Truncate(line, room-1)+"\n")
		}
		io.WriteString(l.w, logCutMarker)
		l.left = 0
		l.cut = true
		return
	}
	io.WriteString(l.w, line)
	l.left -= len(line)
}

// Exit statuses of Run.
const (
	ExitOK      = 0 // a response was written (an ok=false response included)
	ExitFailure = 1 // nothing was written: the request could not be answered
	ExitUsage   = 2 // the verb was missing or unknown
)

const usageText = "usage: %s handshake|invoke\n" +
	"This is a Firstmate process-event adapter (process-event-adapter/1). The Firstmate host runs it\n" +
	"with one verb and one JSON document on stdin; it is not meant to be run by hand.\n"

// Serve runs the entrypoint for h with the process's arguments, standard
// streams and environment, and exits with Run's status. It never returns.
// SIGTERM and SIGINT cancel the context handed to h.
//
// From its start until the process exits, file descriptor 1 is not the
// response channel: Serve writes the response through a private duplicate
// of the real stdout and points fd 1 and os.Stdout at stderr, so a stray
// fmt.Println (or a child process writing to the stdout it inherited, or a
// goroutine still printing after the handler returned) ends up on stderr
// instead of breaking the response. There it counts against the host's
// 8,192-byte stderr bound: a handler that prints more than that fails the
// invocation with stderr-oversized.
func Serve(h Handler) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	// Never restored: the process exits right after the response.
	stdout, _ := guardStdout(os.Stdout)
	code := RunContext(ctx, EnvFromOS(), os.Args, os.Stdin, stdout, os.Stderr, h)
	stop()
	os.Exit(code)
}

// Run is Serve without the process: it reads os environment variables
// through EnvFromOS, uses a background context, and returns the exit status
// instead of exiting. Tests call it (or adaptertest, which wraps it).
func Run(args []string, stdin io.Reader, stdout, stderr io.Writer, h Handler) int {
	return RunContext(context.Background(), EnvFromOS(), args, stdin, stdout, stderr, h)
}

// RunContext is Run with an explicit context and environment.
//
// args[1] must be "handshake" or "invoke" (args[0] is the program name);
// anything else prints usage on stderr and returns ExitUsage. stdin must hold
// exactly one strict JSON document of at most 65,536 bytes.
//
// A handshake is answered from h.Identity(); a handshake that cannot be
// answered truthfully (malformed, other extension identity, protocol or
// capability version 1 not offered, an adapter requested that h does not
// declare) writes nothing on stdout, logs one line on stderr and returns
// ExitFailure: the handshake response has no error member.
//
// When stdout is the process's own fd 1 (an *os.File), fd 1 and os.Stdout
// point at stderr while the request is read and answered, as under Serve,
// and are restored before RunContext returns.
//
// An invoke is answered with exactly one response document and ExitOK, an
// ok=false response included. Only when no request id can be read from stdin
// (broken JSON, oversize, a missing or malformed request_id) is nothing
// written, and ExitFailure returned.
func RunContext(ctx context.Context, env Env, args []string, stdin io.Reader, stdout, stderr io.Writer, h Handler) int {
	prog := "firstmate-extension"
	if len(args) > 0 && args[0] != "" {
		prog = args[0]
	}
	if len(args) != 2 || (args[1] != "handshake" && args[1] != "invoke") {
		fmt.Fprintf(stderr, usageText, wire.Sanitize(prog))
		return ExitUsage
	}
	stdout, restore := guardStdout(stdout)
	defer restore()
	log := newLogWriter(stderr)
	id, idErr := identityOf(h)
	if idErr != nil {
		log.printf("adapter: %v", idErr)
		if args[1] == "handshake" {
			return ExitFailure
		}
	}
	data, err := wire.Read(stdin, wire.MaxEnvelopeBytes, "stdin")
	if err != nil {
		log.printf("adapter: %s refused: %v", args[1], errMessageOf(err))
		return ExitFailure
	}
	var out []byte
	if args[1] == "handshake" {
		resp, err := answerHandshake(id, data)
		if err != nil {
			log.printf("adapter: handshake refused: %v", errMessageOf(err))
			return ExitFailure
		}
		out, err = wire.Canonical(resp)
		if err != nil {
			log.printf("adapter: handshake: %v", err)
			return ExitFailure
		}
	} else {
		if err := wire.CheckSyntax(data, "request"); err != nil {
			log.printf("adapter: invoke refused: %v", errMessageOf(err))
			return ExitFailure
		}
		reqID, ok := wire.PeekRequestID(data)
		if !ok {
			log.printf("adapter: invoke refused: request: no well-formed request_id")
			return ExitFailure
		}
		out = respond(ctx, env, id, idErr, h, reqID, data, log)
	}
	if _, err := stdout.Write(out); err != nil {
		log.printf("adapter: write response: %v", err)
		return ExitFailure
	}
	return ExitOK
}

// errMessageOf is err's message without the "<code>: " prefix of an *Error.
func errMessageOf(err error) string {
	if ae, ok := err.(*Error); ok {
		return ae.Message()
	}
	return err.Error()
}

// AnswerHandshake returns the handshake response id gives to req, or an error
// when it cannot answer truthfully: the request's extension id or version is
// not id's, or it enables an adapter id does not declare. The response's
// adapter_names is exactly the requested subset, in request order.
func AnswerHandshake(id Identity, req *wire.HandshakeRequest) (*wire.HandshakeResponse, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if req.ExtensionID != id.ExtensionID || req.ExtensionVersion != id.ExtensionVersion {
		return nil, Errorf(Incompatible, false, "handshake request: extension %s@%s is not this package (%s@%s)",
			req.ExtensionID, req.ExtensionVersion, id.ExtensionID, id.ExtensionVersion)
	}
	for _, n := range req.Capability.AdapterNames {
		if !slices.Contains(id.AdapterNames, n) {
			return nil, Errorf(Incompatible, false, "handshake request: adapter %q is not provided by this package", n)
		}
	}
	return &wire.HandshakeResponse{
		Schema:            wire.HandshakeResponseSchema,
		RequestID:         req.RequestID,
		ExtensionID:       id.ExtensionID,
		ExtensionVersion:  id.ExtensionVersion,
		HostProtocol:      wire.HostProtocol,
		Capability:        wire.CapabilityName,
		CapabilityVersion: wire.CapabilityVersion,
		AdapterNames:      slices.Clone(req.Capability.AdapterNames),
	}, nil
}

func answerHandshake(id Identity, data []byte) (*wire.HandshakeResponse, error) {
	req, err := wire.DecodeHandshakeRequest(data)
	if err != nil {
		return nil, err
	}
	return AnswerHandshake(id, req)
}

// identityOf returns h's identity, or why it has none: no handler, an
// Identity method that panics (a nil pointer handler, say) or an invalid
// identity.
func identityOf(h Handler) (id Identity, err error) {
	if h == nil {
		return id, errors.New("no handler")
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler Identity panicked: %s", panicText(p))
		}
	}()
	id = h.Identity()
	if err := id.Validate(); err != nil {
		return id, fmt.Errorf("handler %v", err)
	}
	return id, nil
}

// respond builds the canonical response document for an invoke whose request
// id is known. It never returns a document larger than wire.MaxEnvelopeBytes.
// idErr is why the handler has no identity: the invoke is answered internal.
func respond(ctx context.Context, env Env, id Identity, idErr error, h Handler, reqID string, data []byte, log *logWriter) []byte {
	var resp wire.Response
	if idErr != nil {
		resp = failure(reqID, ErrorBody{Code: Internal, Diagnostic: Diagnostic(idErr.Error(), Internal)})
	} else if result, body := guarded(log, func() ([]byte, error) { return invoke(ctx, env, id, h, data, log) }); body == nil {
		resp = wire.Response{Schema: wire.ResponseSchema, RequestID: reqID, OK: true, Result: result}
	} else {
		resp = failure(reqID, *body)
	}
	out, err := wire.Canonical(resp)
	if err == nil && len(out) > wire.MaxEnvelopeBytes {
		err = fmt.Errorf("response would be %d bytes, more than %d", len(out), wire.MaxEnvelopeBytes)
	}
	if err != nil {
		out, err = wire.Canonical(failure(reqID, ErrorBody{Code: Internal, Diagnostic: Diagnostic(err.Error(), Internal)}))
		if err != nil { // cannot happen: every field is ASCII and bounded
			panic(err)
		}
	}
	return out
}

// guarded runs f, the handler's part of one invoke, on a goroutine of its
// own and returns its result, or the error body it ends with, however it
// ends: an error (ErrorBodyOf, which never panics), a panic of any value
// (panic(nil) included), or runtime.Goexit, which would otherwise end the
// goroutine without an answer. A panic in a goroutine the handler started
// itself ends the process, as in any Go program: recover there.
func guarded(log *logWriter, f func() ([]byte, error)) ([]byte, *ErrorBody) {
	type outcome struct {
		result []byte
		body   *ErrorBody
	}
	done := make(chan outcome, 1)
	go func() {
		finished := false
		defer func() {
			if finished {
				return
			}
			msg := "handler called runtime.Goexit"
			if p := recover(); p != nil {
				msg = "handler panicked: " + panicText(p)
			}
			log.printf("adapter: %s", msg)
			done <- outcome{body: &ErrorBody{Code: Internal, Diagnostic: Diagnostic(msg, Internal)}}
		}()
		var o outcome
		if r, err := f(); err != nil {
			b := ErrorBodyOf(err)
			o.body = &b
		} else {
			o.result = r
		}
		finished = true
		done <- o
	}()
	o := <-done
	return o.result, o.body
}

func failure(reqID string, body ErrorBody) wire.Response {
	return wire.Response{Schema: wire.ResponseSchema, RequestID: reqID, OK: false, Result: []byte("null"), Error: &body}
}

// invoke validates the request, runs the handler method and returns the
// encoded, validated result object.
func invoke(ctx context.Context, env Env, id Identity, h Handler, data []byte, log *logWriter) (result []byte, err error) {
	req, err := wire.DecodeRequest(data)
	if err != nil {
		return nil, err
	}
	if req.ExtensionID != id.ExtensionID || req.ExtensionVersion != id.ExtensionVersion {
		return nil, Errorf(Incompatible, false, "request: extension %s@%s is not this package (%s@%s)",
			req.ExtensionID, req.ExtensionVersion, id.ExtensionID, id.ExtensionVersion)
	}
	if !slices.Contains(id.AdapterNames, req.Adapter) {
		return nil, Errorf(Incompatible, false, "request: adapter %q is not provided by this package", req.Adapter)
	}
	call := &Call{
		RequestID:        req.RequestID,
		Adapter:          req.Adapter,
		Operation:        req.Operation,
		ExtensionID:      req.ExtensionID,
		ExtensionVersion: req.ExtensionVersion,
		PackageDigest:    req.PackageDigest,
		Env:              env,
		log:              log,
	}
	defer func() {
		if p := recover(); p != nil {
			msg := panicText(p)
			log.printf("adapter: %s panicked: %s", req.Operation, msg)
			result, err = nil, Errorf(Internal, false, "%s: handler panicked: %s", req.Operation, msg)
		}
	}()
	var v interface{ validate() error }
	switch req.Operation {
	case wire.OpPoll:
		in, err := req.PollInput()
		if err != nil {
			return nil, err
		}
		r, err := h.Poll(ctx, call, in)
		if err != nil {
			return nil, err
		}
		v = pollV(r)
	default:
		in, err := req.ResultInput()
		if err != nil {
			return nil, err
		}
		switch req.Operation {
		case wire.OpClassify:
			r, err := h.Classify(ctx, call, in)
			if err != nil {
				return nil, err
			}
			v = classifyV(r)
		case wire.OpTerminal:
			r, err := h.Terminal(ctx, call, in)
			if err != nil {
				return nil, err
			}
			v = boolV(r)
		case wire.OpSilent:
			r, err := h.Silent(ctx, call, in)
			if err != nil {
				return nil, err
			}
			v = boolV(r)
		}
	}
	if err := v.validate(); err != nil {
		return nil, Errorf(Internal, false, "%s: handler returned an invalid result: %s", req.Operation, errMessageOf(err))
	}
	out, err := wire.Canonical(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", req.Operation, err)
	}
	return out, nil
}

type pollV PollResult

func (p pollV) validate() error { return PollResult(p).Validate() }

type classifyV ClassifyResult

func (c classifyV) validate() error { return ClassifyResult(c).Validate() }

type boolV BoolResult

func (boolV) validate() error { return nil }
