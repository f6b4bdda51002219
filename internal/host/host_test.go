package host_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/procstat"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/pkg/adapter/wire"
)

func TestMain(m *testing.M) {
	launch.MaybeBarrier()
	os.Exit(m.Run())
}

type fixture struct {
	h     *home.Home
	b     *binding.Binding
	state string // the fake package's state dir
}

func bound(t *testing.T, timeoutMS int64, consents ...string) *fixture {
	t.Helper()
	h, pkg := testpkg.Home(t)
	b, err := host.Bind(context.Background(), h, host.BindOptions{Dir: pkg, Adapters: []string{"fake"}, Trust: true, Consents: consents, TimeoutMS: timeoutMS})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{h: h, b: b, state: h.ExtensionState("org.example.fake")}
}

func (f *fixture) poll(t *testing.T, mode string) (*wire.PollResult, error) {
	t.Helper()
	if err := testpkg.SetMode(f.state, "invoke", mode); err != nil {
		t.Fatal(err)
	}
	return host.Invoke(context.Background(), f.h, f.b, host.Poll,
		wire.PollInput{SourceID: "src", ConfigRef: "main"}, host.Call{Adapter: "fake"})
}

// [PROTO-3],[PROTO-4],[INV-4],[GRP-2] every hostile response is refused with
// its code, promptly (stream bounds stop at once, not at the timeout), and
// its process group is gone afterwards.
func TestInvokeHostileResponses(t *testing.T) {
	f := bound(t, 20000)
	res, err := f.poll(t, "good")
	if err != nil || res.Output != "hello from fake" {
		t.Fatalf("good poll: %v %v", res, err)
	}
	cases := []struct {
		mode string
		code errcode.Code
	}{
		{"bom", errcode.ResponseInvalid},
		{"bad-utf8", errcode.ResponseInvalid},
		{"control", errcode.ResponseInvalid},
		{"two-documents", errcode.ResponseInvalid},
		{"unknown-field", errcode.ResponseInvalid},
		{"flood-stdout", errcode.ResponseOversized},
		{"flood-stderr", errcode.StderrOversized},
		{"exit7", errcode.ProcessFailed},
		{"self-kill", errcode.ProcessFailed},
		{"ok-false", errcode.ExtUnavailable},
		{"no-result", ""},
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			start := time.Now()
			_, err := f.poll(t, c.mode)
			if c.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if errcode.Of(err) != c.code {
				t.Fatalf("got %v, want %s", err, c.code)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("took %v: a bound must stop the invocation at once", d)
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Fatalf("package text leaked: %v", err)
			}
		})
	}
	assertNoRecords(t, f.h)
	assertSecretNowhere(t, f.h.Dir, f.state, f.h.Packages())
}

// [INV-5] the binding's timeout bounds invoke.
func TestInvokeTimeout(t *testing.T) {
	f := bound(t, 300)
	start := time.Now()
	_, err := f.poll(t, "hang")
	if errcode.Of(err) != errcode.Timeout {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	assertNoRecords(t, f.h)
}

// [GRP-2] a successful answer that leaves a (TERM-ignoring) child alive is a
// process leak, and the child is killed.
func TestInvokeLeakedChild(t *testing.T) {
	f := bound(t, 20000)
	_, err := f.poll(t, "leak-child")
	if errcode.Of(err) != errcode.ProcessLeak {
		t.Fatalf("got %v", err)
	}
	data, err := os.ReadFile(filepath.Join(f.state, "child"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	if alive(pid) {
		t.Fatalf("leaked child %d survives", pid)
	}
	assertNoRecords(t, f.h)
}

// [INV-4] a request over 65,536 bytes is refused before anything runs.
func TestRequestOversized(t *testing.T) {
	f := bound(t, 20000)
	before, _ := os.ReadFile(filepath.Join(f.state, "requests"))
	_, err := host.Invoke(context.Background(), f.h, f.b, host.Classify,
		wire.ResultInput{SourceID: "src", Sequence: 1, Content: strings.Repeat("\x01", wire.MaxContentBytes)}, host.Call{Adapter: "fake"})
	if errcode.Of(err) != errcode.RequestOversized {
		t.Fatalf("got %v", err)
	}
	after, _ := os.ReadFile(filepath.Join(f.state, "requests"))
	// The handshake ran (it precedes every invoke); the invoke did not.
	if strings.Count(string(after), "firstmate.extension-request.v1") != strings.Count(string(before), "firstmate.extension-request.v1") {
		t.Fatal("an oversized request reached the package")
	}
}

// [INV-3] credential-store consent passes HOME and the XDG/SSH variables
// where set; without it nothing of the caller's environment passes.
func TestCredentialEnvironment(t *testing.T) {
	t.Setenv("HOME", "/home/operator")
	t.Setenv("SSH_AUTH_SOCK", "/run/agent.sock")
	t.Setenv("SECRET_TOKEN", "nope")
	plain := bound(t, 20000)
	if _, err := plain.poll(t, "good"); err != nil {
		t.Fatal(err)
	}
	env, _ := os.ReadFile(filepath.Join(plain.state, "env-invoke"))
	if strings.Contains(string(env), "HOME=") || strings.Contains(string(env), "SECRET_TOKEN") || strings.Contains(string(env), "SSH_AUTH_SOCK") {
		t.Fatalf("caller environment leaked:\n%s", env)
	}
	cred := bound(t, 20000, "credential-store")
	if _, err := cred.poll(t, "good"); err != nil {
		t.Fatal(err)
	}
	env, _ = os.ReadFile(filepath.Join(cred.state, "env-invoke"))
	for _, want := range []string{"HOME=/home/operator\n", "SSH_AUTH_SOCK=/run/agent.sock\n"} {
		if !strings.Contains(string(env), want) {
			t.Fatalf("missing %q in\n%s", want, env)
		}
	}
	if strings.Contains(string(env), "SECRET_TOKEN") || strings.Contains(string(env), "XDG_DATA_HOME") {
		t.Fatalf("unexpected variable in\n%s", env)
	}
}

// [INV-1] a binding replaced after resolution is not invoked.
func TestInvokeStaleBinding(t *testing.T) {
	f := bound(t, 20000)
	stale := *f.b
	stale.Digest = "sha256:" + strings.Repeat("0", 64)
	_, err := host.Invoke(context.Background(), f.h, &stale, host.Silent,
		wire.ResultInput{SourceID: "s", Sequence: 1, Content: "x"}, host.Call{Adapter: "fake"})
	if errcode.Of(err) != errcode.IntegrityMismatch {
		t.Fatalf("got %v", err)
	}
}

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	st, err := procstat.Read(pid)
	return err == nil && st.State != 'Z'
}

func assertNoRecords(t *testing.T, h *home.Home) {
	t.Helper()
	entries, _ := os.ReadDir(h.Invocations())
	if len(entries) != 0 {
		t.Fatalf("invocation records left behind: %v", entries)
	}
}

// assertSecretNowhere checks that the ok:false diagnostic was never stored
// anywhere in the home outside the package's own files (its state dir and
// its store copy, whose script holds the text).
func assertSecretNowhere(t *testing.T, dir string, skip ...string) {
	t.Helper()
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		if slices.Contains(skip, p) {
			return filepath.SkipDir
		}
		if fi.Mode().IsRegular() {
			if data, _ := os.ReadFile(p); strings.Contains(string(data), "SECRET-DIAGNOSTIC") {
				t.Errorf("diagnostic stored in %s", p)
			}
		}
		return nil
	})
}

// [PROTO-2] [GRP-1] [GRP-2]: Invoke prepares the invoke's launch (record and
// barrier, no package code) while the handshake runs; a failed handshake
// gives it up unreleased: the invoke request never reaches the package, and
// no record, barrier or zombie is left behind.
func TestFailedHandshakeAbortsPreparedInvoke(t *testing.T) {
	f := bound(t, 20000)
	invokes := func() int {
		b, _ := os.ReadFile(filepath.Join(f.state, "requests"))
		return strings.Count(string(b), "firstmate.extension-request.v1")
	}
	for _, c := range []struct {
		mode string
		code errcode.Code
	}{
		{"wrong-id", errcode.RequestIDMismatch},
		{"exit9", errcode.ProcessFailed},
	} {
		if err := testpkg.SetMode(f.state, "handshake", c.mode); err != nil {
			t.Fatal(err)
		}
		before := invokes()
		_, err := f.poll(t, "good")
		if errcode.Of(err) != c.code {
			t.Fatalf("%s: got %v, want %s", c.mode, err, c.code)
		}
		if invokes() != before {
			t.Fatalf("%s: the invoke reached the package after a failed handshake", c.mode)
		}
		assertNoRecords(t, f.h)
		tasks, _ := filepath.Glob("/proc/self/task/*/children")
		for _, task := range tasks {
			if b, _ := os.ReadFile(task); len(strings.TrimSpace(string(b))) != 0 {
				t.Fatalf("%s: children left behind: %s", c.mode, b)
			}
		}
	}
	if err := testpkg.SetMode(f.state, "handshake", "good"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.poll(t, "good"); err != nil {
		t.Fatal(err)
	}
}

// [INV-1] a handshake that changes the installed package (modes restored)
// stops the invoke that follows before any of its code runs.
func TestHandshakeTamperStopsInvoke(t *testing.T) {
	f := bound(t, 20000)
	if err := testpkg.SetMode(f.state, "handshake", "tamper"); err != nil {
		t.Fatal(err)
	}
	_, err := f.poll(t, "good")
	if errcode.Of(err) != errcode.IntegrityMismatch {
		t.Fatalf("got %v", err)
	}
	log, _ := os.ReadFile(filepath.Join(f.state, "requests"))
	if strings.Contains(string(log), wire.RequestSchema) {
		t.Fatal("the invoke ran after the package changed itself")
	}
	assertNoRecords(t, f.h)
}

// [INV-1] An installed package whose root is gone is refused before anything
// runs, package-missing with the operator's words (rebind), by Revalidate and
// by Invoke alike; put back, it runs again.
func TestMissingPackageRoot(t *testing.T) {
	f := bound(t, 20000)
	root := f.b.PackageRoot
	if err := os.Rename(root, root+".away"); err != nil {
		t.Fatal(err)
	}
	for _, how := range []string{"Revalidate", "Invoke"} {
		var err error
		if how == "Revalidate" {
			err = host.Revalidate(&f.b.Record)
		} else {
			_, err = f.poll(t, "good")
		}
		if !errcode.Is(err, errcode.PackageMissing) || !strings.Contains(err.Error(), "is missing; rebind org.example.fake") {
			t.Errorf("%s of a package whose root is gone: %v, want package-missing naming the rebind", how, err)
		}
	}
	if err := os.Rename(root+".away", root); err != nil {
		t.Fatal(err)
	}
	if res, err := f.poll(t, "good"); err != nil || res.Output != "hello from fake" {
		t.Fatalf("the package put back: %v %v", res, err)
	}
}
