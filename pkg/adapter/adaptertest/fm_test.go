package adaptertest_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/pkg/adapter/adaptertest"
	"firstmate.dev/fm/pkg/adapter/wire"
	"firstmate.dev/fm/pkg/fmjson"
)

// fakeFM is a shell script standing in for fm: it answers `version` as fm
// does, and any other command with the canned stdout, stderr and exit status
// of answer, recording its arguments and the three FM_* variables it got.
type fakeFM struct {
	t    *testing.T
	dir  string
	path string
}

const fakeScript = `#!/bin/sh
d='%DIR%'
if [ "$1" = version ]; then printf 'fm 9.9.9-test\n'; exit 0; fi
: > "$d/args"
for a in "$@"; do printf '%s\n' "$a" >> "$d/args"; done
printf 'FM_HOME=%s\nFM_ROOT_OVERRIDE=%s\nFM_STATE_OVERRIDE=%s\n' "${FM_HOME-(unset)}" "${FM_ROOT_OVERRIDE-(unset)}" "${FM_STATE_OVERRIDE-(unset)}" > "$d/env"
if [ -e "$d/sleep" ]; then exec sleep 30; fi
cat "$d/stdout"
cat "$d/stderr" >&2
exit "$(cat "$d/code")"
`

func newFake(t *testing.T) *fakeFM {
	t.Helper()
	dir := t.TempDir()
	f := &fakeFM{t: t, dir: dir, path: filepath.Join(dir, "bin", "fm")}
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.path, []byte(strings.ReplaceAll(fakeScript, "%DIR%", dir)), 0o755); err != nil {
		t.Fatal(err)
	}
	f.answer("", "", 0)
	return f
}

// answer sets what the next commands print and their exit status.
func (f *fakeFM) answer(stdout, stderr string, code int) {
	f.t.Helper()
	for name, data := range map[string]string{"stdout": stdout, "stderr": stderr, "code": string(rune('0' + code))} {
		if err := os.WriteFile(filepath.Join(f.dir, name), []byte(data), 0o600); err != nil {
			f.t.Fatal(err)
		}
	}
}

// args returns the arguments of the last command.
func (f *fakeFM) args() []string {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join(f.dir, "args"))
	if err != nil {
		f.t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

// env returns FM_HOME, FM_ROOT_OVERRIDE and FM_STATE_OVERRIDE of the last
// command ("(unset)" when absent).
func (f *fakeFM) env() map[string]string {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join(f.dir, "env"))
	if err != nil {
		f.t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		k, v, _ := strings.Cut(l, "=")
		m[k] = v
	}
	return m
}

const (
	digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// [EX-2] the real-fm test helpers run fm with a private home: FM_HOME set,
// FM_STATE_OVERRIDE and the caller's FM_HOME never passed on, an empty code
// root by default.
func TestHomeEnvironment(t *testing.T) {
	f := newFake(t)
	t.Setenv("FM_HOME", "/elsewhere")
	t.Setenv("FM_STATE_OVERRIDE", "/elsewhere/state")
	t.Setenv("FM_ROOT_OVERRIDE", "/elsewhere/root")
	h := adaptertest.NewHome(t, f.path)
	if h.Version != "9.9.9-test" || h.FM != f.path {
		t.Fatalf("version %q, fm %q", h.Version, h.FM)
	}
	fi, err := os.Lstat(h.Dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("home %s: %v %v", h.Dir, fi, err)
	}
	if c, _ := filepath.EvalSymlinks(h.Dir); c != h.Dir {
		t.Fatalf("home %s is not canonical (%s)", h.Dir, c)
	}
	if ents, err := os.ReadDir(filepath.Join(h.CodeRoot, "bin")); err != nil || len(ents) != 0 {
		t.Fatalf("code root bin: %v %v", ents, err)
	}
	h.Run("procevent", "list")
	want := map[string]string{"FM_HOME": h.Dir, "FM_ROOT_OVERRIDE": h.CodeRoot, "FM_STATE_OVERRIDE": "(unset)"}
	if got := f.env(); !mapsEqual(got, want) {
		t.Fatalf("env %v, want %v", got, want)
	}
	h.CodeRoot = ""
	h.Env = []string{"FM_HOME=/x", "FM_STATE_OVERRIDE=/y"}
	h.Run("procevent", "list")
	want = map[string]string{"FM_HOME": h.Dir, "FM_ROOT_OVERRIDE": "(unset)", "FM_STATE_OVERRIDE": "(unset)"}
	if got := f.env(); !mapsEqual(got, want) {
		t.Fatalf("env %v, want %v", got, want)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// [EX-2] NewHome finds fm through FM_BIN or PATH, and skips with a reason
// when there is none.
func TestHomeFindsFM(t *testing.T) {
	f := newFake(t)
	t.Setenv("FM_BIN", f.path)
	t.Setenv("PATH", t.TempDir())
	if h := adaptertest.NewHome(t, ""); h.FM != f.path {
		t.Errorf("FM_BIN: ran %s", h.FM)
	}
	t.Setenv("FM_BIN", "")
	t.Setenv("PATH", filepath.Dir(f.path))
	if h := adaptertest.NewHome(t, ""); h.FM != f.path {
		t.Errorf("PATH: ran %s", h.FM)
	}
	t.Setenv("PATH", t.TempDir())
	var sub *testing.T
	t.Run("none", func(st *testing.T) {
		sub = st
		adaptertest.NewHome(st, "")
		st.Error("NewHome did not skip without an fm")
	})
	if !sub.Skipped() {
		t.Error("not skipped")
	}

	notFM := filepath.Join(t.TempDir(), "fm")
	os.WriteFile(notFM, []byte("#!/bin/sh\necho hello\n"), 0o755)
	if msg := fails(t, func(tb testing.TB) { adaptertest.NewHome(tb, notFM) }); !strings.Contains(msg, "not the Firstmate fm") {
		t.Errorf("a program that is not fm: %q", msg)
	}
	if msg := fails(t, func(tb testing.TB) { adaptertest.NewHome(tb, filepath.Join(t.TempDir(), "missing")) }); msg == "" {
		t.Error("a missing fm did not fail the test")
	}
}

// [EX-2] Bind passes the options on exactly and reads the six bind lines,
// refusing any other form.
func TestHomeBind(t *testing.T) {
	f := newFake(t)
	h := adaptertest.NewHome(t, f.path)
	good := "bound: org.example.tiny@1.2.3\n" +
		"binding: /h/config/extensions.d/org.example.tiny.json\n" +
		"binding-digest: " + digestA + "\n" +
		"package: /h/data/extensions/packages/org.example.tiny/1.2.3/bbbb\n" +
		"package-digest: " + digestB + "\n" +
		"verified: process-event-adapter/1 (tiny,tiny-2)\n"
	f.answer(good, "", 0)
	b := h.Bind("/p/tiny", []string{"tiny", "tiny-2"}, []string{"network"}, "--timeout-ms", "1000")
	want := adaptertest.Binding{ExtensionID: "org.example.tiny", ExtensionVersion: "1.2.3",
		Path: "/h/config/extensions.d/org.example.tiny.json", Digest: digestA,
		PackageRoot: "/h/data/extensions/packages/org.example.tiny/1.2.3/bbbb", PackageDigest: digestB,
		Capability: "process-event-adapter/1", Adapters: []string{"tiny", "tiny-2"}}
	if !bindingEqual(b, want) {
		t.Fatalf("%+v", b)
	}
	wantArgs := []string{"extension", "bind", "/p/tiny", "--adapter", "tiny", "--adapter", "tiny-2",
		"--trust-same-user-code", "--consent", "network", "--timeout-ms", "1000"}
	if got := f.args(); !slices.Equal(got, wantArgs) {
		t.Fatalf("args %q", got)
	}
	for name, out := range map[string]string{
		"five lines":      good[:strings.Index(good, "verified")],
		"no final eol":    strings.TrimSuffix(good, "\n"),
		"bad digest":      strings.Replace(good, digestA, "sha256:abc", 1),
		"lines swapped":   strings.Replace(strings.Replace(good, "binding-digest: ", "X", 1), "package-digest: ", "binding-digest: ", 1),
		"relative path":   strings.Replace(good, "binding: /h", "binding: h", 1),
		"no version":      strings.Replace(good, "@1.2.3", "", 1),
		"bad adapter":     strings.Replace(good, "(tiny,tiny-2)", "(tiny,Tiny)", 1),
		"no adapter list": strings.Replace(good, " (tiny,tiny-2)", "", 1),
		"extra line":      good + "note: hi\n",
	} {
		f.answer(out, "", 0)
		if msg := fails(t, func(tb testing.TB) { h.T = tb; h.Bind("/p/tiny", []string{"tiny"}, nil) }); msg == "" {
			t.Errorf("%s: accepted %q", name, out)
		}
	}
	h.T = t
	f.answer("", "error[consent-missing]: the manifest requires network: add --consent network\n", 1)
	msg := fails(t, func(tb testing.TB) { h.T = tb; h.Bind("/p/tiny", []string{"tiny"}, nil) })
	if !strings.Contains(msg, "error[consent-missing]: the manifest requires network") || !strings.Contains(msg, "exit status 1") {
		t.Errorf("a failed bind did not quote fm's stderr: %q", msg)
	}
}

func bindingEqual(a, b adaptertest.Binding) bool {
	return a.ExtensionID == b.ExtensionID && a.ExtensionVersion == b.ExtensionVersion && a.Path == b.Path &&
		a.Digest == b.Digest && a.PackageRoot == b.PackageRoot && a.PackageDigest == b.PackageDigest &&
		a.Capability == b.Capability && slices.Equal(a.Adapters, b.Adapters)
}

// [EX-2] Register, Retire, Start, Classify and Handled read exactly the
// lines fm documents.
func TestHomeSourceCommands(t *testing.T) {
	f := newFake(t)
	h := adaptertest.NewHome(t, f.path)
	check := func(name string, ok bool, out string, fn func(tb testing.TB)) {
		t.Helper()
		f.answer(out, "", 0)
		msg := fails(t, func(tb testing.TB) { h.T = tb; fn(tb) })
		h.T = t
		if ok && msg != "" {
			t.Errorf("%s: %s", name, msg)
		}
		if !ok && msg == "" {
			t.Errorf("%s: accepted %q", name, out)
		}
	}

	reg := "registered: src (tiny from org.example.tiny@1.2.3)\nowner-token: " + digestA +
		"\nretire: bin/fm-procevent.sh retire src --if-owner " + digestA + "\n"
	f.answer(reg, "", 0)
	if tok := h.Register("tiny", "src", "dir:/x y"); tok != digestA {
		t.Errorf("token %q", tok)
	}
	if got := f.args(); !slices.Equal(got, []string{"procevent", "register-extension", "tiny", "src", "--config-ref", "dir:/x y"}) {
		t.Errorf("args %q", got)
	}
	check("register: other source", false, strings.ReplaceAll(reg, "src", "other"), func(testing.TB) { h.Register("tiny", "src", "r") })
	check("register: bad token", false, strings.Replace(reg, "owner-token: "+digestA, "owner-token: x", 1), func(testing.TB) { h.Register("tiny", "src", "r") })
	check("register: two lines", false, reg[:strings.Index(reg, "retire:")], func(testing.TB) { h.Register("tiny", "src", "r") })

	check("retire", true, "retired: src\n", func(testing.TB) { h.Retire("src", digestA) })
	if got := f.args(); !slices.Equal(got, []string{"procevent", "retire", "src", "--if-owner", digestA}) {
		t.Errorf("args %q", got)
	}
	check("retire: other", false, "retired: other\n", func(testing.TB) { h.Retire("src", digestA) })

	for _, c := range []struct {
		out  string
		want adaptertest.StartResult
	}{
		{"captured: /h/state/procevent-inbox/src.1.result\n", adaptertest.StartResult{Status: adaptertest.Captured, Path: "/h/state/procevent-inbox/src.1.result"}},
		{"captured: /h/r\nretired: src (terminal)\n", adaptertest.StartResult{Status: adaptertest.Captured, Path: "/h/r", Retired: true}},
		{"no-result: src\n", adaptertest.StartResult{Status: adaptertest.NoResult}},
		{"already owned: src\n", adaptertest.StartResult{Status: adaptertest.AlreadyOwned}},
		{"captured: /h/src.2.result (evidence: response-invalid)\n", adaptertest.StartResult{Status: adaptertest.Captured, Path: "/h/src.2.result", Evidence: "response-invalid"}},
		{"captured: /h/src.3.result\nsilenced: src 3\n", adaptertest.StartResult{Status: adaptertest.Captured, Path: "/h/src.3.result", Silenced: true}},
		{"captured: /h/src.3.result\nsilenced: src 3\nretired: src (terminal)\n", adaptertest.StartResult{Status: adaptertest.Captured, Path: "/h/src.3.result", Silenced: true, Retired: true}},
	} {
		f.answer(c.out, "", 0)
		if got := h.Start("src"); got != c.want {
			t.Errorf("start %q: %+v", c.out, got)
		}
	}
	if got := f.args(); !slices.Equal(got, []string{"procevent", "start", "src"}) {
		t.Errorf("args %q", got)
	}
	for _, out := range []string{"", "captured: relative\n", "no-result: other\n", "captured: /h/r\nretired: other (terminal)\n",
		"captured: /h/r\nretired: src (terminal)\nmore\n", "captured: /h/r", "already-owned: src\n",
		"captured: relative (evidence: timeout)\n", "captured: /h/r (evidence: )\n", "captured: /h/r (evidence: timeout\n",
		"captured: /h/src.3.result\nsilenced: src 4\n", "captured: /h/src.3.result (evidence: timeout)\nsilenced: src 3\n",
		"captured: /h/src.3.result\nretired: src (terminal)\nsilenced: src 3\n"} {
		check("start", false, out, func(testing.TB) { h.Start("src") })
	}

	f.answer("tiny.event\n", "", 0)
	if c := h.Classify("/h/r"); c != "tiny.event" {
		t.Errorf("classify %q", c)
	}
	for _, out := range []string{"", "Tiny\n", "tiny\nmore\n", "tiny"} {
		check("classify", false, out, func(testing.TB) { h.Classify("/h/r") })
	}

	f.answer("handled: src 7\n", "", 0)
	if h.Handled("src", 7) {
		t.Error("handled reported already")
	}
	if got := f.args(); !slices.Equal(got, []string{"procevent", "handled", "src", "7"}) {
		t.Errorf("args %q", got)
	}
	f.answer("already-handled: src 7\n", "", 0)
	if !h.Handled("src", 7) {
		t.Error("already-handled not reported")
	}
	check("handled: other seq", false, "handled: src 8\n", func(testing.TB) { h.Handled("src", 7) })
}

const inboxDoc = `{
  "results": [
    {
      "adapter": "tiny",
      "binding_digest": "` + digestA + `",
      "capability_version": 1,
      "captured_at": 1796029525,
      "evidence": false,
      "extension_id": "org.example.tiny",
      "extension_version": "1.2.3",
      "handled": false,
      "kind": "extension",
      "package_digest": "` + digestB + `",
      "path": "/h/state/procevent-inbox/src.1.result",
      "schema": "firstmate.procevent-result-meta.v1",
      "sequence": 1,
      "source_id": "src"
    },
    {
      "adapter": "file-watch",
      "captured_at": 1796029526,
      "evidence": false,
      "handled": true,
      "kind": "builtin",
      "path": "/h/state/procevent-inbox/w.3.result",
      "schema": "firstmate.procevent-result-meta.v1",
      "sequence": 3,
      "source_id": "w"
    }
  ]
}
`

// [EX-2] the --json listings are parsed strictly: one document, no
// duplicate, unknown or missing member, no null, integers where due.
func TestHomeJSONListings(t *testing.T) {
	f := newFake(t)
	h := adaptertest.NewHome(t, f.path)
	f.answer(inboxDoc, "", 0)
	got := h.Inbox()
	want := []fmjson.Result{
		{Meta: fmjson.Meta{Schema: "firstmate.procevent-result-meta.v1", Kind: "extension", Adapter: "tiny", SourceID: "src", Sequence: 1,
			CapturedAt: 1796029525, ExtensionID: "org.example.tiny", ExtensionVersion: "1.2.3", CapabilityVersion: 1,
			PackageDigest: digestB, BindingDigest: digestA}, Path: "/h/state/procevent-inbox/src.1.result"},
		{Meta: fmjson.Meta{Schema: "firstmate.procevent-result-meta.v1", Kind: "builtin", Adapter: "file-watch", SourceID: "w", Sequence: 3,
			CapturedAt: 1796029526}, Path: "/h/state/procevent-inbox/w.3.result", Handled: true},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("inbox %+v", got)
	}
	if got := f.args(); !slices.Equal(got, []string{"procevent", "inbox", "--json"}) {
		t.Errorf("args %q", got)
	}
	f.answer("{\n  \"results\": []\n}\n", "", 0)
	if got := h.Inbox(); len(got) != 0 {
		t.Errorf("empty inbox: %+v", got)
	}
	for name, doc := range map[string]string{
		"unknown member":   strings.Replace(inboxDoc, `"handled": false,`, `"handled": false, "note": "x",`, 1),
		"missing member":   strings.Replace(inboxDoc, `"handled": false,`, ``, 1),
		"duplicate member": strings.Replace(inboxDoc, `"handled": false,`, `"handled": false, "handled": false,`, 1),
		"null":             strings.Replace(inboxDoc, `"path": "/h/state/procevent-inbox/src.1.result"`, `"path": null`, 1),
		"fraction":         strings.Replace(inboxDoc, `"sequence": 1,`, `"sequence": 1.5,`, 1),
		"string for int":   strings.Replace(inboxDoc, `"sequence": 1,`, `"sequence": "1",`, 1),
		"two documents":    inboxDoc + "{}\n",
		"null list":        `{"results": null}`,
		"no list":          `{}`,
		"builtin owner":    strings.Replace(inboxDoc, `"kind": "builtin",`, `"kind": "builtin", "extension_id": "org.example.tiny",`, 1),
		"extension owner":  strings.Replace(inboxDoc, `"extension_id": "org.example.tiny",`, ``, 1),
		"unknown kind":     strings.Replace(inboxDoc, `"kind": "builtin",`, `"kind": "other",`, 1),
		"not json":         "no captured results\n",
	} {
		f.answer(doc, "", 0)
		if msg := fails(t, func(tb testing.TB) { h.T = tb; h.Inbox() }); msg == "" {
			t.Errorf("%s: accepted", name)
		}
	}
	h.T = t

	f.answer(`{"wakes":[{"key":"procevent:src:1","kind":"check","payload":"check: procevent tiny src 1","seq":1,"time":1796029525}]}`, "", 0)
	if ws := h.Wakes(); len(ws) != 1 || ws[0] != (fmjson.Wake{Time: 1796029525, Seq: 1, Kind: "check", Key: "procevent:src:1", Payload: "check: procevent tiny src 1"}) {
		t.Errorf("wakes %+v", ws)
	}
	if got := f.args(); !slices.Equal(got, []string{"wake", "list", "--json"}) {
		t.Errorf("args %q", got)
	}
	f.answer(`{"wakes":[{"key":"k","kind":"check","payload":"p","seq":1}]}`, "", 0)
	if msg := fails(t, func(tb testing.TB) { h.T = tb; h.Wakes() }); msg == "" {
		t.Error("a wake without time was accepted")
	}
	h.T = t

	f.answer(`{"bindings":[{"adapter_names":["tiny"],"binding":"/h/b.json","binding_digest":"`+digestA+`","capability":"process-event-adapter","capability_version":1,"extension_id":"org.example.tiny","extension_version":"1.2.3","handshake_timeout_ms":5000,"package_digest":"`+digestB+`"}]}`, "", 0)
	if es := h.Extensions(); len(es) != 1 || es[0].BindingDigest != digestA || !slices.Equal(es[0].AdapterNames, []string{"tiny"}) || es[0].Binding != "/h/b.json" {
		t.Errorf("extensions %+v", es)
	}
	if got := f.args(); !slices.Equal(got, []string{"extension", "list", "--json"}) {
		t.Errorf("args %q", got)
	}
	f.answer(`{"sources":[{"adapter":"tiny","kind":"extension","owner":"org.example.tiny@1.2.3","pending":2,"source_id":"src"}]}`, "", 0)
	if ss := h.Sources(); len(ss) != 1 || ss[0] != (fmjson.Source{SourceID: "src", Adapter: "tiny", Kind: "extension", Owner: "org.example.tiny@1.2.3", Pending: 2}) {
		t.Errorf("sources %+v", ss)
	}
}

// [EX-2] a failing fm fails the test with its stderr; Run and Refused hand
// the outcome to the test.
func TestHomeRunAndRefused(t *testing.T) {
	f := newFake(t)
	h := adaptertest.NewHome(t, f.path)
	f.answer("", "error[source-missing]: no source \"gone\" is registered; see fm procevent list\n", 1)
	stdout, stderr, code := h.Run("procevent", "start", "gone")
	if stdout != "" || code != 1 || !strings.HasPrefix(stderr, "error[source-missing]") {
		t.Fatalf("run: %q %q %d", stdout, stderr, code)
	}
	if code, msg := h.Refused("procevent", "start", "gone"); code != "source-missing" || msg != `no source "gone" is registered; see fm procevent list` {
		t.Errorf("refused: %q %q", code, msg)
	}
	msg := fails(t, func(tb testing.TB) { h.T = tb; h.Start("gone") })
	h.T = t
	if !strings.Contains(msg, `fm procevent start gone: exit status 1`) || !strings.Contains(msg, `error[source-missing]: no source "gone"`) {
		t.Errorf("start failure message %q", msg)
	}

	f.answer("", "error[usage]: expected one source id\nusage: fm procevent start <source-id>\n", 2)
	if code, _ := h.Refused("procevent", "start"); code != "usage" {
		t.Errorf("usage refusal: %q", code)
	}
	for name, a := range map[string]struct {
		stdout, stderr string
		code           int
	}{
		"success":         {"no-result: x\n", "", 0},
		"stdout":          {"partial\n", "error[internal]: x\n", 1},
		"two lines":       {"", "error[internal]: x\nmore\n", 1},
		"no code":         {"", "something broke\n", 1},
		"usage not exit2": {"", "error[internal]: x\nusage: fm\n", 2},
		"exit 3":          {"", "error[internal]: x\n", 3},
	} {
		f.answer(a.stdout, a.stderr, a.code)
		if msg := fails(t, func(tb testing.TB) { h.T = tb; h.Refused("procevent", "start", "x") }); msg == "" {
			t.Errorf("refused accepted %s", name)
		}
	}
	h.T = t

	os.WriteFile(filepath.Join(f.dir, "sleep"), nil, 0o600)
	h.Timeout = 300 * time.Millisecond
	start := time.Now()
	msg = fails(t, func(tb testing.TB) { h.T = tb; h.Run("procevent", "start", "x") })
	h.T = t
	if !strings.Contains(msg, "did not finish within") || time.Since(start) > 5*time.Second {
		t.Errorf("timeout: %q after %v", msg, time.Since(start))
	}
}

// [EX-2] Package and EntrypointPackage lay a package out with the modes fm
// accepts, whatever the umask.
func TestHomePackage(t *testing.T) {
	f := newFake(t)
	h := adaptertest.NewHome(t, f.path)
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	src := filepath.Join(t.TempDir(), "entry")
	os.WriteFile(src, []byte("#!/bin/sh\n"), 0o700)
	dir := h.Package("tiny", map[string]adaptertest.File{
		"firstmate-extension.json": {Data: []byte("{}")},
		"bin/firstmate-extension":  {From: src, Exec: true},
		"share/doc/a/readme":       {Data: []byte{}},
	})
	if !filepath.IsAbs(dir) || filepath.Base(dir) != "tiny" || strings.HasPrefix(dir, h.Dir+"/") {
		t.Fatalf("package dir %s", dir)
	}
	if c, _ := filepath.EvalSymlinks(dir); c != dir {
		t.Fatalf("package dir %s is not canonical", dir)
	}
	want := map[string]os.FileMode{
		".": 0o755 | os.ModeDir, "bin": 0o755 | os.ModeDir, "share": 0o755 | os.ModeDir, "share/doc": 0o755 | os.ModeDir,
		"share/doc/a": 0o755 | os.ModeDir, "firstmate-extension.json": 0o644, "bin/firstmate-extension": 0o755, "share/doc/a/readme": 0o644,
	}
	got := map[string]os.FileMode{}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, p)
		got[rel] = fi.Mode()
		return nil
	})
	if len(got) != len(want) {
		t.Errorf("entries %v", got)
	}
	for p, m := range want {
		if got[p] != m {
			t.Errorf("%s: mode %v, want %v", p, got[p], m)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "bin", "firstmate-extension")); string(data) != "#!/bin/sh\n" {
		t.Errorf("copied %q", data)
	}
	if again := h.Package("tiny", map[string]adaptertest.File{"x": {Data: []byte("x")}}); again == dir {
		t.Error("the same directory was laid out twice")
	}
	for _, rel := range []string{"/abs", "../up", "a/../b", "a//b", "", "."} {
		if msg := fails(t, func(tb testing.TB) { h.T = tb; h.Package("p", map[string]adaptertest.File{rel: {Data: []byte("x")}}) }); msg == "" {
			t.Errorf("path %q accepted", rel)
		}
	}
	h.T = t

	manifest := filepath.Join(t.TempDir(), "firstmate-extension.json")
	os.WriteFile(manifest, []byte(`{"schema":"firstmate.extension-manifest.v1","id":"org.example.tiny","version":"0.0.1","host_protocols":[1],"entrypoint":"libexec/tiny","capabilities":[{"name":"process-event-adapter","versions":[1],"adapter_names":["tiny"]}],"required_consents":[]}`), 0o600)
	dir = h.EntrypointPackage(manifest, src)
	if filepath.Base(dir) != "org.example.tiny" {
		t.Errorf("named %s", dir)
	}
	for rel, m := range map[string]os.FileMode{"firstmate-extension.json": 0o644, "libexec/tiny": 0o755, "libexec": 0o755 | os.ModeDir} {
		if fi, err := os.Lstat(filepath.Join(dir, rel)); err != nil || fi.Mode() != m {
			t.Errorf("%s: %v %v", rel, fi, err)
		}
	}
	os.WriteFile(manifest, []byte(`{"schema":"firstmate.extension-manifest.v1"}`), 0o600)
	if msg := fails(t, func(tb testing.TB) { h.T = tb; h.EntrypointPackage(manifest, src) }); msg == "" {
		t.Error("an invalid manifest was accepted")
	}
	h.T = t
}

// [EX-2] the home is removed after the test even with read-only store
// directories in it (which root could remove anyway; run as uid 65534 this
// proves the cleanup restores the write bits).
func TestHomeCleanupUnlocks(t *testing.T) {
	f := newFake(t)
	var dir string
	t.Run("home", func(st *testing.T) {
		h := adaptertest.NewHome(st, f.path)
		dir = h.Dir
		store := filepath.Join(h.Dir, "data", "extensions", "packages", "p", "1", "x")
		if err := os.MkdirAll(filepath.Join(store, "bin"), 0o755); err != nil {
			st.Fatal(err)
		}
		os.WriteFile(filepath.Join(store, "bin", "e"), []byte("x"), 0o555)
		for _, d := range []string{filepath.Join(store, "bin"), store, filepath.Dir(store)} {
			os.Chmod(d, 0o555)
		}
	})
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("home %s left behind: %v", dir, err)
	}
}

// [EX-2] Evidence reads the one-line failure document fm captures.
func TestHomeEvidence(t *testing.T) {
	f := newFake(t)
	h := adaptertest.NewHome(t, f.path)
	p := filepath.Join(t.TempDir(), "src.1.result")
	os.WriteFile(p, []byte(`{"code":"extension-unavailable","extension_id":"org.example.tiny","operation":"source.poll","schema":"firstmate.process-event-extension-error.v1"}`), 0o600)
	if e := h.Evidence(p); e != (wire.Evidence{Code: "extension-unavailable", ExtensionID: "org.example.tiny", Operation: "source.poll", Schema: wire.EvidenceSchema}) {
		t.Errorf("%+v", e)
	}
	os.WriteFile(p, []byte("deploy finished\n"), 0o600)
	if msg := fails(t, func(tb testing.TB) { h.T = tb; h.Evidence(p) }); msg == "" {
		t.Error("an output was read as evidence")
	}
	h.T = t
	if want := filepath.Join(h.Dir, "state", "extensions", "org.example.tiny"); h.ExtensionState("org.example.tiny") != want {
		t.Errorf("state dir %s", h.ExtensionState("org.example.tiny"))
	}
}
