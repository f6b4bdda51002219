package adapter_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"

	"firstmate.dev/fm/pkg/adapter"
	"firstmate.dev/fm/pkg/adapter/adaptertest"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// panicky is an error whose Error method panics (with a value whose own
// String method panics too).
type panicky struct{}

func (*panicky) Error() string { panic(stringPanics{}) }

type stringPanics struct{}

func (stringPanics) String() string { panic("and again") }

// nilSafe is an error type a nil pointer of which still has a message.
type nilSafe struct{ msg string }

func (e *nilSafe) Error() string { return e.msg } // panics on nil

// wraps is an error whose Unwrap returns a typed-nil *adapter.Error.
type wraps struct{}

func (wraps) Error() string { return "wrapping a nil *Error" }
func (wraps) Unwrap() error { return (*adapter.Error)(nil) }

// panicAs is an error whose As method panics.
type panicAs struct{}

func (panicAs) Error() string   { return "as panics" }
func (panicAs) As(any) bool     { panic("As") }
func (panicAs) Is(error) bool   { panic("Is") }
func (panicAs) Unwrap() []error { return []error{nil, errors.New("x")} }

// [PROTO-4] Whatever a handler returns or does, an invoke is answered with
// exactly one valid response document and exit 0: a typed-nil *Error, a nil
// pointer of another error type, an error whose Error, Unwrap, As or Is
// panics, zero results, a panic with nil or with a value whose String
// panics, and runtime.Goexit.
func TestInvokeAlwaysAnswered(t *testing.T) {
	var nilErr *adapter.Error
	cases := map[string]func() (adapter.PollResult, error){
		"typed-nil *Error":         func() (adapter.PollResult, error) { return adapter.Output("x"), nilErr },
		"typed-nil other":          func() (adapter.PollResult, error) { return adapter.Output("x"), (*nilSafe)(nil) },
		"Error panics":             func() (adapter.PollResult, error) { return adapter.NoResult(), &panicky{} },
		"wrapped typed-nil *Error": func() (adapter.PollResult, error) { return adapter.NoResult(), wraps{} },
		"As panics":                func() (adapter.PollResult, error) { return adapter.NoResult(), panicAs{} },
		"*Error with nil Err":      func() (adapter.PollResult, error) { return adapter.NoResult(), &adapter.Error{Code: adapter.Conflict} },
		"*Error wrapping typed nil": func() (adapter.PollResult, error) {
			return adapter.NoResult(), &adapter.Error{Code: adapter.Conflict, Err: (*nilSafe)(nil)}
		},
		"zero result":         func() (adapter.PollResult, error) { return adapter.PollResult{}, nil },
		"panic(nil)":          func() (adapter.PollResult, error) { panic(nil) },
		"panic String panics": func() (adapter.PollResult, error) { panic(stringPanics{}) },
		"panic error panics":  func() (adapter.PollResult, error) { panic(&panicky{}) },
		"Goexit":              func() (adapter.PollResult, error) { runtime.Goexit(); return adapter.NoResult(), nil },
	}
	for name, poll := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFake()
			f.poll = func(context.Context, *adapter.Call, adapter.PollInput) (adapter.PollResult, error) { return poll() }
			h := adaptertest.New(t, f)
			resp, out := h.Invoke(h.Request("alpha", wire.OpPoll, pollIn))
			if out.Exit != adapter.ExitOK || resp == nil {
				t.Fatalf("exit %d, response %v\nstderr: %s", out.Exit, resp, out.Stderr)
			}
			if resp.OK || resp.Error == nil || !resp.Error.Code.Valid() || resp.Error.Diagnostic == "" {
				t.Fatalf("a surprising return answered %+v", resp)
			}
		})
	}
}

// [PROTO-4] ErrorBodyOf, called by a handler author directly, never panics
// and always gives a valid body.
func TestErrorBodyOfNeverPanics(t *testing.T) {
	var nilErr *adapter.Error
	for _, err := range []error{nilErr, (*nilSafe)(nil), &panicky{}, wraps{}, panicAs{}, &adapter.Error{Code: "bogus"}} {
		b := adapter.ErrorBodyOf(err)
		if !b.Code.Valid() || b.Diagnostic == "" || len(b.Diagnostic) > wire.MaxDiagnosticBytes {
			t.Errorf("ErrorBodyOf(%T) = %+v", err, b)
		}
	}
	if b := adapter.ErrorBodyOf(nilErr); !strings.Contains(b.Diagnostic, "nil *adapter.Error") {
		t.Errorf("a typed-nil *Error is not named: %+v", b)
	}
}

// A handler whose Identity panics, or a nil handler, still gets an invoke
// answered (internal) once the request id is readable; a handshake cannot be
// answered truthfully and fails.
func TestIdentityPanicsAnswered(t *testing.T) {
	var nilHandler *fake
	for name, h := range map[string]adapter.Handler{"nil pointer": nilHandler, "nil": nil} {
		t.Run(name, func(t *testing.T) {
			good := adaptertest.New(t, newFake())
			req := good.Request("alpha", wire.OpPoll, pollIn)
			data, err := wire.Canonical(req)
			if err != nil {
				t.Fatal(err)
			}
			var stdout, stderr strings.Builder
			code := adapter.RunContext(context.Background(), adapter.Env{}, []string{"p", "invoke"}, strings.NewReader(string(data)), &stdout, &stderr, h)
			resp, derr := adaptertest.DecodeResponse(req.RequestID, []byte(stdout.String()))
			if code != adapter.ExitOK || derr != nil || resp.OK || resp.Error.Code != adapter.Internal {
				t.Fatalf("exit %d, %v, %q\nstderr: %s", code, derr, stdout.String(), stderr.String())
			}
			stdout.Reset()
			code = adapter.RunContext(context.Background(), adapter.Env{}, []string{"p", "handshake"}, strings.NewReader(validHandshake), &stdout, &stderr, h)
			if code != adapter.ExitFailure || stdout.Len() != 0 {
				t.Fatalf("handshake: exit %d, stdout %q", code, stdout.String())
			}
		})
	}
}

// Call.Logf is safe for concurrent use: many goroutines logging at once
// (run under -race) never write past LogBudget in total, every line is
// whole, and the cut marker is written once.
func TestLogfConcurrent(t *testing.T) {
	f := newFake()
	f.poll = func(_ context.Context, call *adapter.Call, _ adapter.PollInput) (adapter.PollResult, error) {
		var wg sync.WaitGroup
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 200; i++ {
					call.Logf("goroutine %02d line %03d %s", g, i, strings.Repeat("y", 20))
				}
			}()
		}
		wg.Wait()
		return adapter.NoResult(), nil
	}
	h := adaptertest.New(t, f)
	_, out := h.Invoke(h.Request("alpha", wire.OpPoll, pollIn))
	if len(out.Stderr) > adapter.LogBudget {
		t.Fatalf("%d bytes of stderr, more than LogBudget %d", len(out.Stderr), adapter.LogBudget)
	}
	s := string(out.Stderr)
	if strings.Count(s, "[log truncated]\n") != 1 || !strings.HasSuffix(s, "[log truncated]\n") {
		t.Fatalf("cut marker not written exactly once at the end: %q", s[max(0, len(s)-200):])
	}
	for _, l := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		if !strings.HasPrefix(l, "goroutine ") && l != "[log truncated]" {
			t.Fatalf("interleaved line %q", l)
		}
	}
}
