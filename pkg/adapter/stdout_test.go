package adapter_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"firstmate.dev/fm/pkg/adapter"
	"firstmate.dev/fm/pkg/adapter/adaptertest"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// asEntrypoint makes the test binary serve one of the careless handlers
// below, by name, instead of running the tests: the stray-stdout tests run
// it as a package entrypoint.
const asEntrypoint = "ADAPTER_TEST_ENTRYPOINT"

func TestMain(m *testing.M) {
	switch os.Getenv(asEntrypoint) {
	case "noisy":
		adapter.Serve(noisy{})
	case "late-printer":
		adapter.Serve(latePrinter{})
	case "stdout-closer":
		adapter.Serve(stdoutCloser{})
	}
	os.Exit(m.Run())
}

// noisy is the careless author's handler: it writes to stdout in every way a
// Go program can — fmt.Println, os.Stdout, a raw write(2) to fd 1, a child
// process given os.Stdout, a child given a fresh *os.File for fd 1 — and its
// child tries every descriptor 3..9, where a leaked response channel would be.
type noisy struct{}

func (noisy) Identity() adapter.Identity {
	fmt.Println("identity: stray line")
	return adapter.Identity{ExtensionID: "org.example.noisy", ExtensionVersion: "1.0.0", AdapterNames: []string{"noisy"}}
}

func (noisy) Poll(ctx context.Context, call *adapter.Call, in adapter.PollInput) (adapter.PollResult, error) {
	fmt.Println("poll: fmt.Println")
	os.Stdout.WriteString("poll: os.Stdout\n")
	syscall.Write(1, []byte("poll: write(1)\n"))
	child := exec.Command("/bin/sh", "-c", `echo "poll: child"; for fd in 3 4 5 6 7 8 9; do (echo "leak on $fd" >&$fd) 2>/dev/null; done; true`)
	child.Stdout = os.Stdout
	if err := child.Run(); err != nil {
		return adapter.PollResult{}, err
	}
	child = exec.Command("/bin/sh", "-c", `echo "poll: child of fd 1"`)
	child.Stdout = os.NewFile(1, "fd1")
	if err := child.Run(); err != nil {
		return adapter.PollResult{}, err
	}
	return adapter.Output("the real output"), nil
}

func (noisy) Classify(context.Context, *adapter.Call, adapter.ResultInput) (adapter.ClassifyResult, error) {
	return adapter.ClassifyResult{Classification: "noisy"}, nil
}
func (noisy) Terminal(context.Context, *adapter.Call, adapter.ResultInput) (adapter.BoolResult, error) {
	return adapter.BoolResult{}, nil
}
func (noisy) Silent(context.Context, *adapter.Call, adapter.ResultInput) (adapter.BoolResult, error) {
	return adapter.BoolResult{}, nil
}

// runNoisy runs the test binary as noisy's entrypoint, as the host runs one:
// argv [entrypoint, verb], one request on stdin, the minimal environment.
func runNoisy(t *testing.T, verb string, req any) (stdout, stderr []byte) {
	t.Helper()
	return runAs(t, "noisy", verb, req)
}

// runAs runs the test binary as the entrypoint of the handler named, as
// runNoisy does.
func runAs(t *testing.T, handler, verb string, req any) (stdout, stderr []byte) {
	t.Helper()
	data, err := wire.Canonical(req)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, verb)
	cmd.Args[0] = "bin/firstmate-extension"
	cmd.Dir = t.TempDir()
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C", "LC_ALL=C",
		"FIRSTMATE_EXTENSION_ID=org.example.noisy", "FIRSTMATE_EXTENSION_VERSION=1.0.0",
		"FIRSTMATE_EXTENSION_STATE=" + t.TempDir(), asEntrypoint + "=" + handler}
	cmd.Stdin = bytes.NewReader(data)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout: %s\nstderr: %s", verb, err, out.Bytes(), errb.Bytes())
	}
	return out.Bytes(), errb.Bytes()
}

// [EX-2] [INV-4] Under Serve, fd 1 is not the response channel while the
// handler runs: whatever the handler (or a child of it) writes to stdout
// lands on stderr, the response on stdout is exactly the one document, and
// no child inherits the private response descriptor.
func TestStrayStdoutCannotCorruptTheResponse(t *testing.T) {
	h := adaptertest.New(t, quiet{})
	hreq := h.HandshakeRequest()
	stdout, stderr := runNoisy(t, "handshake", hreq)
	_, err := adaptertest.DecodeHandshakeResponse(hreq, stdout)
	if err != nil {
		t.Fatalf("handshake response: %v\nstdout: %q", err, stdout)
	}
	if !strings.Contains(string(stderr), "identity: stray line\n") {
		t.Errorf("the stray line did not reach stderr: %q", stderr)
	}

	req := h.Request("noisy", wire.OpPoll, adapter.PollInput{SourceID: "s1", ConfigRef: "x"})
	stdout, stderr = runNoisy(t, "invoke", req)
	r, err := adaptertest.DecodeResponse(req.RequestID, stdout)
	if err != nil {
		t.Fatalf("invoke response: %v\nstdout: %q", err, stdout)
	}
	if !r.OK || r.RequestID != req.RequestID {
		t.Fatalf("response %+v", r)
	}
	if res, err := adaptertest.DecodePollResult(r.Result); err != nil || res.Output != "the real output" {
		t.Fatalf("result %s: %v", r.Result, err)
	}
	for _, line := range []string{"poll: fmt.Println", "poll: os.Stdout", "poll: write(1)", "poll: child", "poll: child of fd 1"} {
		if !strings.Contains(string(stderr), line+"\n") {
			t.Errorf("%q did not reach stderr: %q", line, stderr)
		}
	}
	if strings.Contains(string(stdout)+string(stderr), "leak on") {
		t.Errorf("a child could write to an inherited descriptor:\nstdout: %q\nstderr: %q", stdout, stderr)
	}
}

// quiet is noisy's identity without the noise, for building requests.
type quiet struct{ noisy }

func (quiet) Identity() adapter.Identity {
	return adapter.Identity{ExtensionID: "org.example.noisy", ExtensionVersion: "1.0.0", AdapterNames: []string{"noisy"}}
}

// latePrinter's Poll leaves a goroutine printing to stdout in a loop and
// returns once it is under way: the careless author's progress ticker that
// was never stopped.
type latePrinter struct{ quiet }

func (latePrinter) Poll(context.Context, *adapter.Call, adapter.PollInput) (adapter.PollResult, error) {
	started := make(chan struct{})
	go func() {
		// One line before the handler returns, so stderr always shows the
		// ticker's lines whatever the scheduler does; every later one races
		// the response and the exit.
		fmt.Println("still printing")
		close(started)
		for {
			fmt.Println("still printing")
		}
	}()
	<-started
	return adapter.Output("the real output"), nil
}

// stdoutCloser's Poll closes os.Stdout (as a library "cleaning up" might),
// then logs.
type stdoutCloser struct{ quiet }

func (stdoutCloser) Poll(_ context.Context, call *adapter.Call, _ adapter.PollInput) (adapter.PollResult, error) {
	os.Stdout.Close()
	fmt.Fprintln(os.Stderr, "stderr after closing stdout")
	call.Logf("Logf after closing stdout")
	return adapter.Output("the real output"), nil
}

// checkPollResponse fails t unless stdout is exactly the one response to req
// with the output "the real output".
func checkPollResponse(t *testing.T, req *wire.Request, stdout []byte) {
	t.Helper()
	r, err := adaptertest.DecodeResponse(req.RequestID, stdout)
	if err != nil {
		t.Fatalf("invoke response: %v\nstdout: %.300q", err, stdout)
	}
	if !r.OK || r.RequestID != req.RequestID {
		t.Fatalf("response %+v", r)
	}
	if res, err := adaptertest.DecodePollResult(r.Result); err != nil || res.Output != "the real output" {
		t.Fatalf("result %s: %v", r.Result, err)
	}
}

// [EX-2] [INV-4] Under Serve, a goroutine of the handler that goes on
// printing to stdout after the handler returned (until the process exits)
// never reaches the response channel: fd 1 stays pointed at stderr until
// Serve exits. Run repeatedly, since the window is the few system calls
// between the response and the exit.
func TestStdoutAfterTheHandlerReturnsCannotCorruptTheResponse(t *testing.T) {
	h := adaptertest.New(t, quiet{})
	req := h.Request("noisy", wire.OpPoll, adapter.PollInput{SourceID: "s1", ConfigRef: "x"})
	for i := 0; i < 20; i++ {
		stdout, stderr := runAs(t, "late-printer", "invoke", req)
		checkPollResponse(t, req, stdout)
		if !strings.Contains(string(stderr), "still printing\n") {
			t.Fatalf("run %d: the late lines did not reach stderr: %.200q", i, stderr)
		}
	}
}

// [EX-2] A handler that closes os.Stdout closes only its own view of the
// diverted stdout: stderr stays open for the handler and for Call.Logf, and
// the response is whole.
func TestClosingStdoutInAHandlerKeepsStderr(t *testing.T) {
	h := adaptertest.New(t, quiet{})
	req := h.Request("noisy", wire.OpPoll, adapter.PollInput{SourceID: "s1", ConfigRef: "x"})
	stdout, stderr := runAs(t, "stdout-closer", "invoke", req)
	checkPollResponse(t, req, stdout)
	for _, line := range []string{"stderr after closing stdout\n", "Logf after closing stdout\n"} {
		if !strings.Contains(string(stderr), line) {
			t.Errorf("%q is missing from stderr: %q", line, stderr)
		}
	}
}
