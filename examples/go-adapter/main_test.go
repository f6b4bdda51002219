package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/examples/go-adapter/dirsignal"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/pkg/adapter"
	"firstmate.dev/fm/pkg/adapter/adaptertest"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// The test binary doubles as the entrypoint: run with this variable set, it
// is main() with the host's argv [entrypoint, verb]. (The real host passes no
// such variable; see TestMain.)
const asEntrypoint = "DIRSIGNAL_TEST_AS_ENTRYPOINT"

func TestMain(m *testing.M) {
	// The end-to-end test binds a copy of this binary as the package
	// entrypoint and runs it through the real host, whose launch barrier
	// re-executes this binary first.
	launch.MaybeBarrier()
	if filepath.Base(os.Args[0]) == noisyName {
		adapter.Serve(noisy{dirsignal.New()})
	}
	if os.Getenv(asEntrypoint) == "1" || filepath.Base(os.Args[0]) == "firstmate-extension" {
		main()
		return
	}
	code := m.Run()
	testpkg.RemoveBuiltFM() // the fm that testpkg.FM may have built
	os.Exit(code)
}

// entrypoint returns a command that runs main() as the host does: argv
// [entrypoint, verb], working directory = a package root, and the exact
// minimal environment of spec [INV-3] (plus the re-exec switch).
func entrypoint(t *testing.T, verb string, stdin []byte, state string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, verb)
	cmd.Args[0] = "bin/firstmate-extension"
	cmd.Dir = t.TempDir()
	cmd.Env = []string{
		"PATH=/usr/bin:/bin",
		"LANG=C",
		"LC_ALL=C",
		"FIRSTMATE_EXTENSION_ID=" + dirsignal.ExtensionID,
		"FIRSTMATE_EXTENSION_VERSION=" + dirsignal.Version,
		"FIRSTMATE_EXTENSION_STATE=" + state,
		asEntrypoint + "=1",
	}
	cmd.Stdin = bytes.NewReader(stdin)
	return cmd
}

func run(t *testing.T, cmd *exec.Cmd) (int, []byte, []byte) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		t.Fatal(err)
	}
	return code, stdout.Bytes(), stderr.Bytes()
}

func TestEntrypointHandshakeAndPoll(t *testing.T) {
	state := t.TempDir()
	h := adaptertest.New(t, dirsignal.New())
	hreq := h.HandshakeRequest()
	data, _ := wire.Canonical(hreq)
	code, stdout, stderr := run(t, entrypoint(t, "handshake", data, state))
	if code != 0 || len(stderr) != 0 {
		t.Fatalf("handshake: exit %d, stderr %q", code, stderr)
	}
	_, err := adaptertest.DecodeHandshakeResponse(hreq, stdout)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "signal"), []byte("hello from a file\n"), 0o600)
	req := h.Request(dirsignal.AdapterName, wire.OpPoll, adapter.PollInput{SourceID: "src", ConfigRef: "dir:" + dir})
	data, _ = wire.Canonical(req)
	code, stdout, stderr = run(t, entrypoint(t, "invoke", data, state))
	if code != 0 || len(stderr) != 0 {
		t.Fatalf("invoke: exit %d, stderr %q", code, stderr)
	}
	resp, err := adaptertest.DecodeResponse(req.RequestID, stdout)
	if err != nil || !resp.OK || resp.RequestID != req.RequestID {
		t.Fatalf("invoke: %v %+v", err, resp)
	}
	res, err := adaptertest.DecodePollResult(resp.Result)
	if err != nil || res != adapter.Output("hello from a file\n") {
		t.Fatalf("poll result %+v %v", res, err)
	}
}

func TestEntrypointRefusals(t *testing.T) {
	state := t.TempDir()
	code, stdout, stderr := run(t, entrypoint(t, "help", nil, state))
	if code != 2 || len(stdout) != 0 || !bytes.Contains(stderr, []byte("usage:")) {
		t.Fatalf("bad verb: exit %d stdout %q stderr %q", code, stdout, stderr)
	}
	h := adaptertest.New(t, dirsignal.New())
	hreq := h.HandshakeRequest()
	hreq.Capability.AdapterNames = []string{"file-signal"}
	data, _ := wire.Canonical(hreq)
	code, stdout, stderr = run(t, entrypoint(t, "handshake", data, state))
	if code != 1 || len(stdout) != 0 || len(stderr) == 0 || len(stderr) > wire.MaxStderrBytes {
		t.Fatalf("refused handshake: exit %d stdout %q stderr %q", code, stdout, stderr)
	}
	code, stdout, _ = run(t, entrypoint(t, "invoke", []byte("{"), state))
	if code != 1 || len(stdout) != 0 {
		t.Fatalf("broken invoke: exit %d stdout %q", code, stdout)
	}
}

// The host sends SIGTERM on its timeout: the poll answers promptly and the
// process exits.
func TestEntrypointStopsOnSIGTERM(t *testing.T) {
	h := adaptertest.New(t, dirsignal.New())
	req := h.Request(dirsignal.AdapterName, wire.OpPoll, adapter.PollInput{SourceID: "src", ConfigRef: "dir:" + t.TempDir()})
	data, _ := wire.Canonical(req)
	cmd := entrypoint(t, "invoke", data, t.TempDir())
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the entrypoint ignored SIGTERM")
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("took %v to stop", time.Since(start))
	}
	if stdout.Len() != 0 {
		if _, err := adaptertest.DecodeResponse(req.RequestID, stdout.Bytes()); err != nil {
			t.Fatalf("partial or invalid answer after SIGTERM: %v", err)
		}
	}
}
