package adaptertest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"firstmate.dev/fm/pkg/adapter"
	"firstmate.dev/fm/pkg/adapter/adaptertest"
	"firstmate.dev/fm/pkg/adapter/wire"
)

type tiny struct{}

func (tiny) Identity() adapter.Identity {
	return adapter.Identity{ExtensionID: "org.example.tiny", ExtensionVersion: "0.0.1", AdapterNames: []string{"tiny"}}
}
func (tiny) Poll(context.Context, *adapter.Call, adapter.PollInput) (adapter.PollResult, error) {
	return adapter.Output("x"), nil
}
func (tiny) Classify(context.Context, *adapter.Call, adapter.ResultInput) (adapter.ClassifyResult, error) {
	return adapter.ClassifyResult{Classification: "tiny"}, nil
}
func (tiny) Terminal(context.Context, *adapter.Call, adapter.ResultInput) (adapter.BoolResult, error) {
	return adapter.BoolResult{}, nil
}
func (tiny) Silent(context.Context, *adapter.Call, adapter.ResultInput) (adapter.BoolResult, error) {
	return adapter.BoolResult{}, nil
}

// recorder is a testing.TB whose Fatalf records the failure and stops the
// goroutine, so a test can assert that the harness fails.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fails runs fn with a recorder and returns the Fatalf message ("" if none).
func fails(t *testing.T, fn func(tb testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r.msg
}

func TestNewRequestID(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := adaptertest.NewRequestID()
		if !wire.ValidRequestID(id) || seen[id] {
			t.Fatalf("bad or repeated id %q", id)
		}
		seen[id] = true
	}
}

func TestHarnessDefaults(t *testing.T) {
	h := adaptertest.New(t, tiny{})
	if h.Env.ExtensionID != "org.example.tiny" || h.Env.ExtensionVersion != "0.0.1" || !wire.ValidRequestID(h.PackageDigest) {
		t.Fatalf("%+v", h)
	}
	if fi, err := os.Stat(h.Env.StateDir); err != nil || !fi.IsDir() {
		t.Fatalf("state dir: %v", err)
	}
	req := h.Request("tiny", wire.OpPoll, adapter.PollInput{SourceID: "s", ConfigRef: "r"})
	if err := req.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := req.PollInput(); err != nil {
		t.Fatal(err)
	}
	if _, err := adapter.AnswerHandshake(tiny{}.Identity(), h.HandshakeRequest()); err != nil {
		t.Fatal(err)
	}
}

// [EX-2] the in-process test harness for authors.
func TestHarnessFailsOnViolations(t *testing.T) {
	msg := fails(t, func(tb testing.TB) {
		adaptertest.New(tb, tiny{}).InvokeRaw(adaptertest.NewRequestID(), []byte("{"))
	})
	if msg == "" {
		t.Error("an unanswered invoke did not fail the test")
	}
	msg = fails(t, func(tb testing.TB) {
		h := adaptertest.New(tb, tiny{})
		req := h.Request("tiny", wire.OpPoll, adapter.PollInput{SourceID: "s", ConfigRef: "r"})
		data, _ := wire.Canonical(req)
		h.InvokeRaw(adaptertest.NewRequestID(), data) // expects another id
	})
	if msg == "" {
		t.Error("a request id mismatch did not fail the test")
	}
	msg = fails(t, func(tb testing.TB) {
		adaptertest.New(tb, adapter.Handler(badIdentity{}))
	})
	if msg == "" {
		t.Error("an invalid identity did not fail the test")
	}
	manifest := filepath.Join(t.TempDir(), "firstmate-extension.json")
	os.WriteFile(manifest, []byte(`{"schema":"firstmate.extension-manifest.v1","id":"org.example.tiny","version":"0.0.2","host_protocols":[1],"entrypoint":"bin/x","capabilities":[{"name":"process-event-adapter","versions":[1],"adapter_names":["tiny"]}],"required_consents":[]}`), 0o600)
	if msg := fails(t, func(tb testing.TB) { adaptertest.CheckManifest(tb, manifest, tiny{}) }); msg == "" {
		t.Error("a manifest version mismatch did not fail the test")
	}
}

type badIdentity struct{ tiny }

func (badIdentity) Identity() adapter.Identity {
	return adapter.Identity{ExtensionID: "BAD", ExtensionVersion: "1", AdapterNames: nil}
}

// printer is tiny with a debug line printed to stdout by Poll, and by
// Identity when loud is set.
type printer struct {
	tiny
	loud bool
}

func (p printer) Identity() adapter.Identity {
	if p.loud {
		fmt.Println("debug: identity")
	}
	return tiny{}.Identity()
}

func (printer) Poll(context.Context, *adapter.Call, adapter.PollInput) (adapter.PollResult, error) {
	fmt.Println("debug: polling")
	return adapter.Output("x"), nil
}

// closingPrinter's Poll prints to stdout, then closes os.Stdout.
type closingPrinter struct{ tiny }

func (closingPrinter) Poll(context.Context, *adapter.Call, adapter.PollInput) (adapter.PollResult, error) {
	fmt.Println("then closed")
	os.Stdout.Close()
	return adapter.Output("x"), nil
}

// childPrinter's Poll runs a child process whose stdout is os.Stdout.
type childPrinter struct{ tiny }

func (childPrinter) Poll(context.Context, *adapter.Call, adapter.PollInput) (adapter.PollResult, error) {
	cmd := exec.Command("/bin/sh", "-c", "echo from-a-child")
	cmd.Stdout = os.Stdout
	if err := cmd.Run(); err != nil {
		return adapter.PollResult{}, err
	}
	return adapter.Output("x"), nil
}

// [EX-2] A handler that writes to stdout beside the response fails the
// harness's test with a message naming the bytes, although the response
// itself is valid (the SDK keeps it on its own channel), for a poll, a
// handshake and a child process alike; a clean handler passes, and
// os.Stdout is the test's own again afterwards.
func TestHarnessCatchesStrayStdout(t *testing.T) {
	before := os.Stdout
	msg := fails(t, func(tb testing.TB) {
		adaptertest.New(tb, printer{}).Poll("tiny", adapter.PollInput{SourceID: "s", ConfigRef: "r"})
	})
	if !strings.Contains(msg, "wrote 15 bytes to stdout") || !strings.Contains(msg, `"debug: polling\n"`) || !strings.Contains(msg, "Call.Logf") {
		t.Errorf("a poll printing to stdout: %q", msg)
	}
	msg = fails(t, func(tb testing.TB) {
		h := adaptertest.New(tb, printer{})
		req := h.HandshakeRequest()
		h.Handler = printer{loud: true}
		h.Handshake(req)
	})
	if !strings.Contains(msg, `"debug: identity\n"`) {
		t.Errorf("a handshake printing to stdout: %q", msg)
	}
	msg = fails(t, func(tb testing.TB) {
		adaptertest.New(tb, childPrinter{}).Poll("tiny", adapter.PollInput{SourceID: "s", ConfigRef: "r"})
	})
	if !strings.Contains(msg, `"from-a-child\n"`) {
		t.Errorf("a child printing to stdout: %q", msg)
	}
	msg = fails(t, func(tb testing.TB) {
		adaptertest.New(tb, closingPrinter{}).Poll("tiny", adapter.PollInput{SourceID: "s", ConfigRef: "r"})
	})
	if !strings.Contains(msg, `"then closed\n"`) {
		t.Errorf("a poll printing to stdout and closing it: %q", msg)
	}
	out := adaptertest.New(t, printer{}).Raw("invoke", []byte("{"))
	if string(out.Stray) != "" || out.Exit != adapter.ExitFailure {
		t.Errorf("raw: %+v", out)
	}
	if res, fail := adaptertest.New(t, tiny{}).Poll("tiny", adapter.PollInput{SourceID: "s", ConfigRef: "r"}); fail != nil || res.Output != "x" {
		t.Errorf("a clean handler: %+v %+v", res, fail)
	}
	if os.Stdout != before {
		t.Error("os.Stdout was not restored")
	}
}
