package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/examples/go-adapter/dirsignal"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/pkg/adapter/adaptertest"
)

// [EX-2] the SDK-built adapter under a real fm binary, driven only through
// the public adaptertest.Home (os/exec, no internal package): bind with a
// live handshake, register, an attached poll captures a signal byte for
// byte, classify by the captured owner, the check wake, handled, a failing
// poll captured as evidence, retire, and retire-binding. The package's
// entrypoint is this test binary (TestMain serves when run as
// bin/firstmate-extension), so nothing but fm is built.
func TestRealFMEndToEnd(t *testing.T) {
	h := adaptertest.NewHome(t, testpkg.FM(t))
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pkg := h.EntrypointPackage("firstmate-extension.json", exe)
	b := h.Bind(pkg, []string{dirsignal.AdapterName}, []string{"artifact-references"})
	if b.ExtensionID != dirsignal.ExtensionID || b.ExtensionVersion != dirsignal.Version ||
		b.Capability != "process-event-adapter/1" || len(b.Adapters) != 1 || b.Adapters[0] != dirsignal.AdapterName ||
		!strings.HasPrefix(b.PackageRoot, h.Dir+"/") {
		t.Fatalf("bound %+v", b)
	}
	if es := h.Extensions(); len(es) != 1 || es[0].BindingDigest != b.Digest || es[0].PackageDigest != b.PackageDigest {
		t.Fatalf("extension list %+v, bound %+v", es, b)
	}

	signals := t.TempDir()
	token := h.Register(dirsignal.AdapterName, "e2e", "dir:"+signals)
	want := "deploy finished: \"ok\" ✓\n"
	if err := os.WriteFile(filepath.Join(signals, ".001.tmp"), []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(signals, ".001.tmp"), filepath.Join(signals, "001")); err != nil {
		t.Fatal(err)
	}
	r := h.Start("e2e")
	if r.Status != adaptertest.Captured || r.Retired {
		t.Fatalf("start: %+v", r)
	}
	if got, err := os.ReadFile(r.Path); err != nil || string(got) != want {
		t.Fatalf("captured %q, %v; want %q", got, err, want)
	}
	if c := h.Classify(r.Path); c != dirsignal.Classification {
		t.Fatalf("classify: %q", c)
	}
	if _, err := os.Stat(h.ExtensionState(dirsignal.ExtensionID)); err != nil {
		t.Fatalf("the package's state directory: %v", err)
	}
	in := h.Inbox()
	if len(in) != 1 || in[0].SourceID != "e2e" || in[0].Sequence != 1 || in[0].Path != r.Path || in[0].Evidence || in[0].Handled ||
		in[0].Kind != "extension" || in[0].BindingDigest != b.Digest || in[0].PackageDigest != b.PackageDigest {
		t.Fatalf("inbox %+v", in)
	}
	ws := h.Wakes()
	if len(ws) != 1 || ws[0].Kind != "check" || ws[0].Key != "procevent:e2e:1" || ws[0].Payload != "check: procevent dir-signal e2e 1" {
		t.Fatalf("wakes %+v", ws)
	}
	if h.Handled("e2e", 1) || !h.Handled("e2e", 1) {
		t.Fatal("handled, then already-handled")
	}

	// A directory that does not exist: Poll answers unavailable, and fm
	// captures that as evidence instead of an output.
	h.Register(dirsignal.AdapterName, "broken", "dir:"+filepath.Join(signals, "missing"))
	r = h.Start("broken")
	if r.Status != adaptertest.Captured {
		t.Fatalf("start broken: %+v", r)
	}
	if e := h.Evidence(r.Path); e.Code != "extension-unavailable" || e.ExtensionID != dirsignal.ExtensionID || e.Operation != "source.poll" {
		t.Fatalf("evidence %+v", e)
	}
	if in := h.Inbox(); len(in) != 2 || in[0].SourceID != "broken" || !in[0].Evidence || in[0].Handled || !in[1].Handled {
		t.Fatalf("inbox %+v", in)
	}
	if ss := h.Sources(); len(ss) != 2 || ss[0].SourceID != "broken" || ss[0].Pending != 1 || ss[1].Pending != 0 {
		t.Fatalf("sources %+v", ss)
	}

	// Retirement: the binding is in use while a source or an unhandled result
	// depends on it.
	h.Retire("e2e", token)
	if code, _ := h.Refused("procevent", "start", "e2e"); code != "source-missing" {
		t.Fatalf("start after retire: %s", code)
	}
	if code, _ := h.Refused("extension", "retire-binding", b.ExtensionID, "--if-binding-digest", b.Digest); code != "binding-in-use" {
		t.Fatalf("retire-binding in use: %s", code)
	}
	if _, stderr, code := h.Run("procevent", "sweep-home"); code != 0 {
		t.Fatalf("sweep-home: %d %s", code, stderr)
	}
	h.Handled("broken", 1)
	stdout, stderr, code := h.Run("extension", "retire-binding", b.ExtensionID, "--if-binding-digest", b.Digest)
	if code != 0 || !strings.HasPrefix(stdout, "retired-binding: "+b.ExtensionID+" "+b.Digest+"\n") {
		t.Fatalf("retire-binding: exit %d\n%s%s", code, stdout, stderr)
	}
	if es := h.Extensions(); len(es) != 0 {
		t.Fatalf("extension list after retire-binding: %+v", es)
	}
}
