package procevent_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/internal/wake"
)

// [OP-2] [OP-3] [OP-4]: the direct call of every operation and its exit
// statuses.
func TestDirectProcessEvent(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	poll := []string{"extension", "process-event", "sig", "source.poll", "--source-id", "d1", "--config-ref", "ref"}
	f.mode("poll", "text:direct output")
	if out := f.ok(poll...); out != "direct output" {
		t.Fatalf("poll printed %q", out)
	}
	rid := "sha256:" + strings.Repeat("ab", 32)
	f.ok(append(poll, "--request-id", rid)...)
	if got := ids(f.log("poll")); got[1] != rid {
		t.Fatalf("--request-id was not sent: %v", got)
	}
	f.mode("poll", "no-result")
	if out, errs, code := f.fm(poll...); out != "" || errs != "" || code != 75 {
		t.Fatalf("no-result: exit %d %q %q", code, out, errs)
	}
	f.mode("poll", "ok-false")
	out, errs, code := f.fm(poll...)
	if code != 70 || errs != "" || out != `{"code":"extension-unavailable","detail":"`+confinedNote()+`","extension_id":"org.example.sig","operation":"source.poll","schema":"firstmate.process-event-extension-error.v1"}`+"\n" {
		t.Fatalf("failure: exit %d %q %q", code, out, errs)
	}
	out, _, code = f.fm("extension", "process-event", "nope", "source.poll", "--source-id", "d1", "--config-ref", "ref")
	if code != 70 || !strings.Contains(out, `"code":"adapter-unbound","extension_id":"unknown"`) {
		t.Fatalf("unbound adapter: exit %d %q", code, out)
	}
	if f.inbox() != nil || len(f.wakes()) != 0 {
		t.Fatal("a direct call captured or announced")
	}

	// Result operations read a result directly inside the canonical inbox.
	f.registerExt("s1")
	f.mode("poll", "result")
	f.ok("procevent", "start", "s1")
	result := filepath.Join(f.h.Inbox(), "s1.1.result")
	call := func(op string, extra ...string) []string {
		return append([]string{"extension", "process-event", "sig", op, "--result-file", result}, extra...)
	}
	if out := f.ok(call("result.classify")...); out != "fake-class\n" {
		t.Fatalf("classify printed %q", out)
	}
	if out := f.ok(call("result.terminal")...); out != "false\n" {
		t.Fatalf("terminal printed %q", out)
	}
	f.mode("silent", "crash")
	f.fails("process-failed", call("result.silent")...)
	outside := filepath.Join(f.work, "s1.1.result")
	f.write(outside, "x", 0o600)
	f.fails("path-unsafe", "extension", "process-event", "sig", "result.classify", "--result-file", outside)
	f.fails("path-unsafe", "procevent", "classify", outside)
	f.fails("path-unsafe", "procevent", "classify", filepath.Join(f.h.Inbox(), "s1.1.meta.json"))
	f.fails("capability-mismatch", "extension", "process-event", "other", "result.classify", "--result-file", result)
	for _, args := range [][]string{
		{"extension", "process-event", "sig", "source.poll"},
		{"extension", "process-event", "sig", "result.classify"},
		{"extension", "process-event", "sig", "bogus.op"},
		{"extension", "process-event", "sig", "source.poll", "--source-id", ".bad", "--config-ref", "r"},
		{"extension", "process-event", "sig", "result.classify", "--result-file", result, "--uncaptured"},
	} {
		if _, _, code := f.fm(args...); code != 2 {
			t.Fatalf("%v: exit %d, want usage", args, code)
		}
	}
}

// [CAP-2] [RUN-2]: reconcile re-announces an unhandled result only under the
// re-announce rule, never a handled one, and polls every source once.
func TestReconcileReannounces(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.ok("procevent", "start", "s1")
	f.mode("poll", "no-result")
	out := f.ok("procevent", "reconcile")
	if out != "no-result: s1\nreconciled: sources=1 failed=0 cleaned-invocations=0 reannounced=0\n" || len(f.wakes()) != 1 {
		t.Fatalf("reconcile printed %q, wakes %+v", out, f.wakes())
	}
	out = f.ok("procevent", "reconcile", "--reannounce-after", "0")
	ws := f.wakes()
	if !strings.HasSuffix(out, "reannounced=1\n") || len(ws) != 2 || ws[1].Key != "procevent:s1:1" || ws[1].Seq != 2 {
		t.Fatalf("reconcile printed %q, wakes %+v", out, ws)
	}
	f.ok("procevent", "handled", "s1", "1")
	f.ok("procevent", "reconcile", "--reannounce-after", "0")
	if len(f.wakes()) != 2 {
		t.Fatal("a handled result was re-announced")
	}
}

// [HOME-4] [CAP-8] [CLI-4] [WAKE-2] [STAT-2]: the read-only verbs create nothing in a
// fresh home, say so when they list nothing ("no wakes" too, like every
// other listing), and speak JSON on request.
func TestReadOnlyVerbsCreateNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for args, want := range map[string]string{
		"procevent list":                 "no process-event sources\n",
		"procevent inbox":                "no captured results\n",
		"procevent list --json":          "{\n  \"sources\": []\n}\n",
		"procevent inbox --json":         "{\n  \"results\": []\n}\n",
		"procevent status":               "no process-event sources\n",
		"procevent status --json":        "{\n  \"serving\": false,\n  \"sources\": []\n}\n",
		"wake list":                      "no wakes\n",
		"wake list --json":               "{\n  \"wakes\": []\n}\n",
		"procevent reconcile":            "reconciled: sources=0 failed=0 cleaned-invocations=0 reannounced=0\n",
		"procevent retire x --if-absent": "retired: x\n",
	} {
		if out := f.ok(strings.Fields(args)...); out != want {
			t.Fatalf("%s printed %q, want %q", args, out, want)
		}
	}
	if _, err := os.Lstat(f.h.State); !os.IsNotExist(err) {
		t.Fatalf("a read-only verb created %s", f.h.State)
	}
}

// [WAKE-1] [WAKE-2]: wake list --after and wake watch, which follows new
// wakes and exits cleanly on SIGTERM.
func TestWakeVerbs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.ok("procevent", "start", "s1")
	watch := f.fmCmd("wake", "watch", "--after", "1")
	var out testpkg.SyncBuffer
	watch.Stdout = &out
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	f.ok("procevent", "start", "s1")
	f.ok("procevent", "start", "s1")
	waitFor(t, 5*time.Second, "watch to print two wakes", func() bool { return strings.Count(out.String(), "\n") == 2 })
	watch.Process.Signal(os.Interrupt)
	if err := watch.Wait(); err != nil {
		t.Fatalf("watch did not exit cleanly: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if w, ok := wake.Parse(lines[0]); !ok || w.Seq != 2 || w.Key != "procevent:s1:2" {
		t.Fatalf("watch printed %q", out.String())
	}
	if got := f.ok("wake", "list", "--after", "2"); got != lines[1]+"\n" {
		t.Fatalf("wake list --after 2 printed %q", got)
	}
	var doc struct {
		Wakes []wake.Wake `json:"wakes"`
	}
	if err := json.Unmarshal([]byte(f.ok("wake", "list", "--json")), &doc); err != nil || len(doc.Wakes) != 3 {
		t.Fatalf("wake list --json: %v %+v", err, doc)
	}
	if _, _, code := f.fm("wake", "list", "--after", "-1"); code != 2 {
		t.Fatal("--after -1 must be a usage error")
	}
}

// [OP-2] [INV-4] [OP-3]: --show-stderr on a direct call shows the package's
// stderr to the operator who asked, on fm's stderr only: each line prefixed
// stderr[<verb>]:, control bytes escaped, at most 8,192 bytes with a note of
// the rest. Without the flag nothing is shown; the evidence on stdout and a
// captured result never carry it.
func TestDirectShowStderr(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	poll := []string{"extension", "process-event", "sig", "source.poll", "--source-id", "d1", "--config-ref", "ref"}
	evidence := `{"code":"process-failed","detail":"` + confinedNote() + `","extension_id":"org.example.sig","operation":"source.poll","schema":"firstmate.process-event-extension-error.v1"}` + "\n"
	f.mode("poll", "noisy-fail")
	out, errs, code := f.fm(poll...)
	if code != 70 || out != evidence || errs != "" {
		t.Fatalf("without the flag: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	out, errs, code = f.fm(append(poll, "--show-stderr")...)
	want := "stderr[invoke]: traceback: boom\nstderr[invoke]: \\u{001b}[2Jbad\\tline\n"
	if code != 70 || out != evidence || errs != want {
		t.Fatalf("with the flag: exit %d, stdout %q, stderr %q; want stderr %q", code, out, errs, want)
	}

	f.mode("poll", "stderr-flood")
	out, errs, code = f.fm(append(poll, "--show-stderr")...)
	lines := strings.Split(strings.TrimSuffix(errs, "\n"), "\n")
	if code != 70 || !strings.Contains(out, `"code":"stderr-oversized"`) || len(lines) != 2 ||
		lines[0] != "stderr[invoke]: "+strings.Repeat("e", 8192) || !strings.HasPrefix(lines[1], "stderr[invoke] cut: ") || !strings.HasSuffix(lines[1], " bytes written, the first 8192 shown") {
		t.Fatalf("flood: exit %d, stdout %q, stderr %d bytes %.200q", code, out, len(errs), errs)
	}

	// A capture by the runner never holds it.
	f.registerExt("s1")
	f.mode("poll", "noisy-fail")
	f.ok("procevent", "start", "s1")
	for _, n := range f.inbox() {
		if strings.Contains(f.read(filepath.Join(f.h.Inbox(), n)), "traceback") {
			t.Fatalf("%s holds the package's stderr", n)
		}
	}

	// A failed invoke of a direct result operation says how to see the
	// stderr [HINT-1].
	f.mode("poll", "result")
	f.ok("procevent", "start", "s1")
	f.mode("terminal", "crash")
	errs = f.fails("process-failed", "extension", "process-event", "sig", "result.terminal", "--result-file", filepath.Join(f.h.Inbox(), "s1.2.result"))
	if !strings.Contains(errs, "entrypoint exit status 7; its stderr is never stored: --show-stderr of fm extension bind, upgrade or process-event shows it") ||
		!strings.HasSuffix(errs, "a direct call with --confinement off checks whether they are the cause\n") {
		t.Fatalf("terminal failure: %q", errs)
	}
}

// [RUN-4] [OP-2]: a direct source.poll of a registered source would consume
// its event outside capture, so it is refused (source-registered) and runs
// nothing, unless the operator passes --uncaptured. With it, the poll takes
// the source's claim: while its runner polls, it is refused (source-active)
// and runs nothing; once the runner is done it polls. An unregistered source
// id is polled without a claim and gets no lock file.
func TestDirectPollHonoursClaim(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	direct := []string{"extension", "process-event", "sig", "source.poll", "--source-id", "s1", "--config-ref", "x"}
	errs := f.fails("source-registered", direct...)
	if !strings.Contains(errs, `"s1"`) || !strings.Contains(errs, "--uncaptured") || !strings.Contains(errs, "fm procevent start s1") {
		t.Fatalf("refusal %q", errs)
	}
	if n := len(f.log("poll")); n != 0 {
		t.Fatalf("%d polls ran; the refused direct poll ran", n)
	}
	direct = append(direct, "--uncaptured")
	run := f.startGated("s1")
	errs = f.fails("source-active", direct...)
	if !strings.Contains(errs, "s1") {
		t.Fatalf("refusal %q", errs)
	}
	if n := len(f.log("poll")); n != 1 {
		t.Fatalf("%d polls ran; the direct poll ran beside the runner", n)
	}
	f.release()
	run.Wait()
	f.mode("poll", "text:direct")
	if out := f.ok(direct...); out != "direct" {
		t.Fatalf("direct poll printed %q", out)
	}
	if out := f.ok("extension", "process-event", "sig", "source.poll", "--source-id", "zz", "--config-ref", "x"); out != "direct" {
		t.Fatalf("direct poll of an unregistered id printed %q", out)
	}
	if _, err := os.Lstat(filepath.Join(f.h.Registrations(), "zz.claim")); !os.IsNotExist(err) {
		t.Fatal("a direct poll of an unregistered id created a claim file")
	}
}
