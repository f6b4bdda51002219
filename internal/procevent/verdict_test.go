package procevent_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// [CAP-4] [RUN-1]: silent true marks the result handled and sends no wake.
func TestSilentMarksHandled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.mode("silent", "true")
	f.ok("procevent", "start", "s1")
	marker := filepath.Join(f.h.Inbox(), "s1.1.handled")
	if got := f.read(marker); got != `{"by":"silent","schema":"firstmate.procevent-handled.v1"}` {
		t.Fatalf("handled marker holds %q", got)
	}
	if ws := f.wakes(); len(ws) != 0 {
		t.Fatalf("a silent result was announced: %+v", ws)
	}
	if out := f.ok("procevent", "handled", "s1", "1"); out != "already-handled: s1 1\n" {
		t.Fatalf("handled printed %q", out)
	}
}

// [CAP-4] [REG-4]: terminal true retires exactly the polled generation; a
// later retire --if-owner with that (old) token succeeds without action while
// nothing is registered, and is refused (owner-token-mismatch) without
// touching a newer generation once one is registered.
func TestTerminalRetiresGeneration(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	old := f.registerExt("s1")
	f.mode("terminal", "true")
	out := f.ok("procevent", "start", "s1")
	if want := "captured: " + filepath.Join(f.h.Inbox(), "s1.1.result") + "\nretired: s1 (terminal)\n"; out != want {
		t.Fatalf("start printed %q, want %q", out, want)
	}
	if len(f.wakes()) != 1 {
		t.Fatal("a terminal result must still be announced")
	}
	if _, err := os.Lstat(filepath.Join(f.h.Registrations(), "s1.source")); !os.IsNotExist(err) {
		t.Fatalf("registration still there: %v", err)
	}
	if out := f.ok("procevent", "retire", "s1", "--if-owner", old); out != "retired: s1\n" {
		t.Fatalf("retire printed %q", out)
	}
	f.mode("terminal", "false")
	f.registerExt("s1")
	f.fails("owner-token-mismatch", "procevent", "retire", "s1", "--if-owner", old)
	if out := f.ok("procevent", "list"); !strings.Contains(out, "\ns1 ") {
		t.Fatalf("an old token retired the replacement: %q", out)
	}
	f.fails("source-missing", "procevent", "start", "nope")
}

// [OP-4]: a verdict that fails takes the false path: announced, unhandled,
// still registered.
func TestFailedVerdictsAreFalse(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.mode("silent", "crash")
	f.mode("terminal", "crash")
	out := f.ok("procevent", "start", "s1")
	if strings.Contains(out, "retired") || len(f.wakes()) != 1 {
		t.Fatalf("start printed %q with wakes %+v", out, f.wakes())
	}
	if contains(f.inbox(), "s1.1.handled") {
		t.Fatal("a failed silent verdict marked the result handled")
	}
}

// [CAP-7]: forged environment variables and inherited descriptors cannot
// produce a silent or terminal verdict; the direct call prints a verdict but
// acts on nothing.
func TestForgedVerdicts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	cmd := f.fmCmd("procevent", "start", "s1")
	for _, kv := range []string{"FM_PROCEVENT_SILENT=true", "FM_PROCEVENT_TERMINAL=true", "FIRSTMATE_VERDICT=true", "FM_VERDICT_FD=3", "FIRSTMATE_HANDOFF=3", "FM_CAPABILITY=silent"} {
		cmd.Env = append(cmd.Env, kv)
	}
	for range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		w.WriteString(`true {"value":true} silent terminal`)
		w.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, r)
	}
	if out, err := cmd.Output(); err != nil || strings.Contains(string(out), "retired") {
		t.Fatalf("start: %v %q", err, out)
	}
	if contains(f.inbox(), "s1.1.handled") || len(f.wakes()) != 1 {
		t.Fatalf("forged input changed a verdict: inbox %v wakes %+v", f.inbox(), f.wakes())
	}
	if !strings.Contains(f.ok("procevent", "list"), "\ns1 ") {
		t.Fatal("forged input retired the source")
	}

	// The direct call asks the owner and prints its answer, and that is all.
	f.mode("silent", "true")
	f.mode("terminal", "true")
	result := filepath.Join(f.h.Inbox(), "s1.1.result")
	for _, op := range []string{"result.silent", "result.terminal"} {
		if out := f.ok("extension", "process-event", "sig", op, "--result-file", result); out != "true\n" {
			t.Fatalf("%s printed %q", op, out)
		}
	}
	if contains(f.inbox(), "s1.1.handled") || !strings.Contains(f.ok("procevent", "list"), "\ns1 ") {
		t.Fatal("a direct verdict call changed state")
	}
}

// [CAP-4] [CAP-5]: a built-in installed later under the same adapter name
// never reinterprets an external result, nor takes over the registration.
func TestLaterBuiltinDoesNotReclassify(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.ok("procevent", "start", "s1")
	f.write(filepath.Join(f.h.Root, "bin", "fm-procevent-sig.sh"), "#!/bin/sh\ncat >/dev/null\ncase $1 in classify) echo builtin-class;; *) echo true;; esac\n", 0o755)
	result := filepath.Join(f.h.Inbox(), "s1.1.result")
	if out := f.ok("procevent", "classify", result); out != "fake-class\n" {
		t.Fatalf("classify printed %q", out)
	}
	if out := f.ok("extension", "process-event", "sig", "result.classify", "--result-file", result); out != "fake-class\n" {
		t.Fatalf("direct classify printed %q", out)
	}
	f.ok("procevent", "start", "s1")
	if len(f.log("poll")) != 2 || contains(f.inbox(), "s1.2.handled") {
		t.Fatalf("the built-in took over the registration: log %v inbox %v", f.log("poll"), f.inbox())
	}
	// The owner is exact: with its binding retired (moved away), the result
	// cannot be classified by anyone else.
	if err := os.Rename(f.b.Path, filepath.Join(f.work, "moved.json")); err != nil {
		t.Fatal(err)
	}
	f.fails("binding-missing", "procevent", "classify", result)
}

// [CAP-4] [CAP-2]: while the capturing runner is still asking the silent
// verdict (here a verdict that takes 4 s to answer true), a reconcile with
// --reannounce-after 0 does not announce the result: it ends handled by
// silent with no wake at all. A runner that dies while asking leaves its
// result to be announced by the next reconcile (its claim is free then).
func TestSilentVerdictInFlightIsNotAnnounced(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("src1")
	f.mode("silent", "slow-true")

	run, runOut, runErr := f.background("procevent", "start", "src1")
	waitFor(t, 10*time.Second, "the silent verdict to be asked", func() bool { return len(f.log("silent")) == 1 })
	out := f.ok("procevent", "reconcile", "--reannounce-after", "0")
	if !strings.Contains(out, "already owned: src1\n") || !strings.Contains(out, " reannounced=0\n") {
		t.Fatalf("reconcile during the silent verdict printed %q", out)
	}
	if code := waitExit(t, run, 20*time.Second); code != 0 {
		t.Fatalf("start: exit %d %s %s", code, runOut, runErr)
	}
	handled := filepath.Join(f.h.Inbox(), "src1.1.handled")
	if !strings.Contains(f.read(handled), `"by":"silent"`) {
		t.Fatalf("handled marker %q", f.read(handled))
	}
	if ws := f.wakes(); len(ws) != 0 {
		t.Fatalf("a silent result was announced: %+v", ws)
	}
	if contains(f.inbox(), "src1.1.pending") {
		t.Fatal("the pending marker outlived the decision")
	}

	// The runner dies while it asks: nothing decides, the claim is free, and
	// the next reconcile announces the result.
	run, _, _ = f.background("procevent", "start", "src1")
	waitFor(t, 10*time.Second, "the second silent verdict to be asked", func() bool { return len(f.log("silent")) == 2 })
	run.Process.Signal(syscall.SIGKILL)
	run.Wait()
	f.mode("silent", "false")
	f.mode("poll", "no-result")
	out = f.ok("procevent", "reconcile", "--reannounce-after", "0")
	if !strings.Contains(out, " reannounced=1\n") {
		t.Fatalf("reconcile after the runner died printed %q", out)
	}
	if ws := f.wakes(); len(ws) != 1 || ws[0].Key != "procevent:src1:2" {
		t.Fatalf("wakes %+v", ws)
	}
	if contains(f.inbox(), "src1.2.pending") {
		t.Fatal("the next runner left the dead runner's pending marker")
	}
}
