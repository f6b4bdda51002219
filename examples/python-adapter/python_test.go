// Tests of the Python example package (py-spool): its own unittest suite, and
// the package bound and polled through the real fm.
package pythonadapter_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/pkg/adapter/adaptertest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testpkg.RemoveBuiltFM()
	os.Exit(code)
}

const (
	extID       = "org.firstmate.example.py-spool"
	adapterName = "py-spool"
)

// hostPython returns the python3 that the host's fixed PATH
// (/usr/local/bin:/usr/bin:/bin, [INV-3]) finds, as `#!/usr/bin/env python3`
// will under fm, or skips the test.
func hostPython(t *testing.T) string {
	t.Helper()
	for _, dir := range []string{"/usr/local/bin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, "python3")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	t.Skip("no python3 in /usr/local/bin:/usr/bin:/bin, the PATH fm gives an entrypoint")
	return ""
}

// [EX-1] [JSON-1] [PROTO-2] [PROTO-4] [OP-1] The package's own Python tests
// (strict reader, handshake, invoke dispatch, the four operations, request-id
// replay, the stdout guard, the entrypoint from a read-only copy in the exact
// environment) pass. They run with -B: no __pycache__ is left in the tree.
func TestPythonUnitTests(t *testing.T) {
	python := hostPython(t)
	cmd := exec.Command(python, "-B", "-m", "unittest", "discover", "-s", "tests", "-v")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "\nOK") {
		t.Fatalf("python3 -m unittest did not report OK:\n%s", out)
	}
	if err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "__pycache__" {
			t.Errorf("%s was left in the package tree", p)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// pythonPackage lays out the package as its README copies it: the manifest,
// bin/ and lib/, nothing else.
func pythonPackage(t *testing.T, h *adaptertest.Home) string {
	t.Helper()
	return h.Package(extID, map[string]adaptertest.File{
		"firstmate-extension.json": {From: "firstmate-extension.json"},
		"bin/firstmate-extension":  {From: "bin/firstmate-extension", Exec: true},
		"lib/fmadapter.py":         {From: "lib/fmadapter.py"},
	})
}

// [EX-1] [BIND-6] [RUN-1] [CAP-1] [CAP-2] [CAP-4] [OP-3] The Python package
// binds through the real fm (its handshake runs from the read-only store copy
// under the fixed PATH), a file in the spool is captured byte for byte and
// consumed, classify and the wake follow, a "#" result is silent, an "end"
// result retires the source, and a missing spool becomes evidence with the
// package's code and no package text.
func TestPythonAdapterEndToEnd(t *testing.T) {
	hostPython(t)
	h := adaptertest.NewHome(t, testpkg.FM(t))
	b := h.Bind(pythonPackage(t, h), []string{adapterName}, []string{"artifact-references"}, "--timeout-ms", "60000")
	if b.ExtensionID != extID || b.ExtensionVersion != "1.0.0" || b.Capability != "process-event-adapter/1" {
		t.Fatalf("bound %+v", b)
	}
	spool := t.TempDir()
	h.Register(adapterName, "inbox", "dir:"+spool)

	put := func(name, data string) {
		t.Helper()
		tmp := filepath.Join(spool, ".tmp-"+name)
		if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(spool, name)); err != nil {
			t.Fatal(err)
		}
	}
	want := "build 42 passed: \"ok\" \u2713\n\ttab and \\ backslash\n"
	put("001", want)
	r := h.Start("inbox")
	if r.Status != adaptertest.Captured || r.Retired {
		t.Fatalf("start: %+v", r)
	}
	if got, err := os.ReadFile(r.Path); err != nil || string(got) != want {
		t.Fatalf("captured %q, %v; want %q", got, err, want)
	}
	if _, err := os.Stat(filepath.Join(spool, "001")); !os.IsNotExist(err) {
		t.Fatalf("the spooled file was not consumed: %v", err)
	}
	if c := h.Classify(r.Path); c != "py-spool" {
		t.Fatalf("classify: %q", c)
	}
	if ws := h.Wakes(); len(ws) != 1 || ws[0].Key != "procevent:inbox:1" || ws[0].Payload != "check: procevent py-spool inbox 1" {
		t.Fatalf("wakes %+v", ws)
	}

	put("002", "# routine, nobody needs to look\n")
	if r := h.Start("inbox"); r.Status != adaptertest.Captured {
		t.Fatalf("start: %+v", r)
	}
	if in := h.Inbox(); len(in) != 2 || in[1].Sequence != 2 || !in[1].Handled {
		t.Fatalf("a silent result is handled at once: %+v", in)
	}
	if ws := h.Wakes(); len(ws) != 1 {
		t.Fatalf("a silent result was announced: %+v", ws)
	}

	put("003", "end\n")
	if r := h.Start("inbox"); r.Status != adaptertest.Captured || !r.Retired {
		t.Fatalf("an end result retires the source: %+v", r)
	}
	if code, _ := h.Refused("procevent", "start", "inbox"); code != "source-missing" {
		t.Fatalf("start after the terminal verdict: %s", code)
	}

	h.Register(adapterName, "broken", "dir:"+filepath.Join(spool, "missing"))
	r = h.Start("broken")
	if r.Status != adaptertest.Captured {
		t.Fatalf("start broken: %+v", r)
	}
	if e := h.Evidence(r.Path); e.Code != "extension-unavailable" || e.ExtensionID != extID || e.Operation != "source.poll" {
		t.Fatalf("evidence %+v", e)
	}
}
