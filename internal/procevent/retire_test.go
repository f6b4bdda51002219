package procevent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/procstat"
	"firstmate.dev/fm/internal/retire"
	"firstmate.dev/fm/internal/strictjson"
)

// [REG-1] [RUN-1] [CAP-4] [CAP-5] [HOME-1]: the real built-in file-watch adapter:
// argv stored exactly and run without a shell, no-result, capture,
// classification, silent and terminal verdicts by the adapter script.
func TestBuiltinFileWatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	script := filepath.Join(f.h.Root, "bin", "fm-procevent-file-watch.sh")
	sig := filepath.Join(f.work, "sig nal; $(touch pwned)")
	argv := []string{script, "poll", sig, "0"}
	if out := f.ok(append([]string{"procevent", "register", "file-watch", "w1", "--"}, argv...)...); out != "registered: w1 (file-watch)\n" {
		t.Fatalf("register printed %q", out)
	}
	var rec struct {
		Argv []string `json:"argv"`
		Kind string   `json:"kind"`
	}
	if err := json.Unmarshal([]byte(f.read(filepath.Join(f.h.Registrations(), "w1.source"))), &rec); err != nil || !slices.Equal(rec.Argv, argv) || rec.Kind != "builtin" {
		t.Fatalf("stored registration: %v %+v", err, rec)
	}
	if out := f.ok("procevent", "start", "w1"); out != "no-result: w1\n" {
		t.Fatalf("start printed %q", out)
	}
	f.write(sig, "hello\n", 0o600)
	result := filepath.Join(f.h.Inbox(), "w1.1.result")
	if out := f.ok("procevent", "start", "w1"); out != "captured: "+result+"\n" {
		t.Fatalf("start printed %q", out)
	}
	if f.read(result) != "hello\n" || len(f.wakes()) != 1 || f.wakes()[0].Payload != "check: procevent file-watch w1 1" {
		t.Fatalf("result %q wakes %+v", f.read(result), f.wakes())
	}
	if _, err := os.Stat(filepath.Join(f.work, "pwned")); err == nil {
		t.Fatal("argv went through a shell")
	}
	if out := f.ok("procevent", "classify", result); out != "file-watch\n" {
		t.Fatalf("classify printed %q", out)
	}
	f.write(sig, " \n", 0o600)
	f.ok("procevent", "start", "w1")
	if !contains(f.inbox(), "w1.2.handled") || len(f.wakes()) != 1 {
		t.Fatalf("blank signal: inbox %v wakes %+v", f.inbox(), f.wakes())
	}
	f.write(sig, "done\n", 0o600)
	if out := f.ok("procevent", "start", "w1"); !strings.HasSuffix(out, "\nretired: w1 (terminal)\n") {
		t.Fatalf("start printed %q", out)
	}
	// [BIND-2]: the shipped built-in's name cannot be bound by a package.
	pkg := filepath.Join(f.work, "pkg-file-watch")
	if err := makePackage(pkg, "file-watch"); err != nil {
		t.Fatal(err)
	}
	if _, err := host.Bind(context.Background(), f.h, host.BindOptions{Dir: pkg, Adapters: []string{"file-watch"}, Trust: true}); !errcode.Is(err, errcode.AdapterConflict) {
		t.Fatalf("binding the built-in's name: %v", err)
	}

	// A failing built-in poll is reported, not captured.
	f.ok("procevent", "register", "file-watch", "w2", "--", script, "poll", "relative", "0")
	f.fails("process-failed", "procevent", "start", "w2")

	f.fails("adapter-unbound", "procevent", "register", "nope", "w3", "--", "/bin/true")
	for _, args := range [][]string{{"w3", "--", "bin/relative"}, {"w3"}, {".w3", "--", "/bin/true"}} {
		if _, errs, code := f.fm(append([]string{"procevent", "register", "file-watch"}, args...)...); code != 2 || !strings.HasPrefix(errs, "error[usage]: ") {
			t.Fatalf("register %v: exit %d %q, want a usage error", args, code, errs)
		}
	}
}

// [REG-4]: the retire forms.
func TestRetireForms(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	script := filepath.Join(f.h.Root, "bin", "fm-procevent-file-watch.sh")
	reg := func(id string) {
		f.ok("procevent", "register", "file-watch", id, "--", script, "poll", "/nonexistent", "0")
	}

	reg("b1")
	if out := f.ok("procevent", "retire", "b1"); out != "retired: b1\n" {
		t.Fatalf("bare retire printed %q", out)
	}
	f.fails("source-missing", "procevent", "retire", "b1")

	reg("b2")
	f.fails("owner-token-mismatch", "procevent", "retire", "b2", "--if-matches", "file-watch", "--", script, "poll", "/other", "0")
	f.fails("source-active", "procevent", "retire", "b2", "--if-absent")
	f.ok("procevent", "retire", "b2", "--if-matches", "file-watch", "--", script, "poll", "/nonexistent", "0")
	f.ok("procevent", "retire", "b2", "--if-absent")
	f.ok("procevent", "retire", "b2", "--if-matches", "file-watch", "--", script)

	tok := f.registerExt("e1")
	f.fails("owner-token-mismatch", "procevent", "retire", "e1")
	f.fails("owner-token-mismatch", "procevent", "retire", "e1", "--if-matches", "sig", "--", "/x")
	f.fails("owner-token-mismatch", "procevent", "retire", "e1", "--if-owner", "sha256:"+strings.Repeat("0", 64))
	if !strings.Contains(f.ok("procevent", "list"), "\ne1 ") {
		t.Fatal("a foreign token retired e1")
	}
	f.ok("procevent", "retire", "e1", "--if-owner", tok)
	if out := f.ok("procevent", "list"); out != "no process-event sources\n" {
		t.Fatalf("list printed %q", out)
	}
	if _, _, code := f.fm("procevent", "retire", "e1", "--if-owner", tok, "--if-absent"); code != 2 {
		t.Fatal("two retire forms must be a usage error")
	}
}

// [LIFE-2]: retire-binding's dependency preflight refuses while a
// registration or an unhandled result depends on the binding, and passes
// after `handled` and `retire --if-owner`.
func TestRetireBindingPreflight(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := f.bind()
	retireBinding := func() error {
		_, err := retire.Binding(context.Background(), f.h, extID, b.Digest)
		return err
	}
	tok := f.registerExt("s1")
	if err := retireBinding(); !errcode.Is(err, errcode.BindingInUse) || !strings.Contains(err.Error(), `registered source(s): s1;`) {
		t.Fatalf("with a registration: %v", err)
	}
	f.ok("procevent", "start", "s1")
	f.ok("procevent", "retire", "s1", "--if-owner", tok)
	if err := retireBinding(); !errcode.Is(err, errcode.BindingInUse) || !strings.Contains(err.Error(), "s1.1.result") {
		t.Fatalf("with an unhandled result: %v", err)
	}
	f.ok("procevent", "handled", "s1", "1")
	if err := retireBinding(); err != nil {
		t.Fatalf("after handled and retire: %v", err)
	}
}

// [LIFE-3]: sweep-home retires every registration with its stored identity
// and proves every invocation group gone; --preflight changes nothing.
func TestSweepHome(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if out := f.ok("procevent", "sweep-home", "--preflight"); out != "swept: attempted=0\n" {
		t.Fatalf("empty preflight printed %q", out)
	}
	if _, err := os.Lstat(f.h.State); !os.IsNotExist(err) {
		t.Fatal("a sweep preflight of an empty home created state")
	}
	f.bind()
	f.registerExt("e1")
	f.ok("procevent", "register", "file-watch", "b1", "--", "/bin/true")
	if out := f.ok("procevent", "sweep-home", "--preflight"); out != "swept: attempted=2\n" {
		t.Fatalf("preflight printed %q", out)
	}
	if n := strings.Count(f.ok("procevent", "list"), "\n"); n != 3 {
		t.Fatal("preflight retired something")
	}
	run := f.startGated("e1")
	pgid := f.lastPID()
	if out := f.ok("procevent", "sweep-home"); out != "swept: attempted=2\n" {
		t.Fatalf("sweep printed %q", out)
	}
	run.Wait()
	if out := f.ok("procevent", "list"); out != "no process-event sources\n" || !groupGone(pgid) {
		t.Fatalf("after the sweep: %q, group gone %v", out, groupGone(pgid))
	}
}

// [LIFE-2] [CAP-8]: the inbox is read independently of the registry: with
// state/procevent gone, `procevent inbox` still shows the unhandled result
// and retire-binding's preflight refuses; an inbox that cannot be read
// refuses as well.
func TestInboxWithoutRegistry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := f.bind()
	tok := f.registerExt("s1")
	f.ok("procevent", "start", "s1")
	f.ok("procevent", "retire", "s1", "--if-owner", tok)
	if err := os.RemoveAll(f.h.Registrations()); err != nil {
		t.Fatal(err)
	}
	if out := f.ok("procevent", "inbox"); !strings.Contains(out, "s1.1.result") || !strings.Contains(out, " unhandled ") {
		t.Fatalf("inbox without a registry printed %q", out)
	}
	st, err := procevent.ReadStatus(f.h)
	if err != nil || st.Unhandled != 1 {
		t.Fatalf("status without a registry: %v %+v", err, st)
	}
	f.fails("binding-in-use", "extension", "retire-binding", extID, "--if-binding-digest", b.Digest)

	// An inbox that cannot be read (here a symlink) refuses too.
	moved := filepath.Join(f.work, "inbox-elsewhere")
	if err := os.Rename(f.h.Inbox(), moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(moved, f.h.Inbox()); err != nil {
		t.Fatal(err)
	}
	if _, err := retire.Binding(context.Background(), f.h, extID, b.Digest); err == nil {
		t.Fatal("retire-binding passed with an unreadable inbox")
	}
	if _, err := os.Stat(filepath.Join(f.h.Dir, "config", "extensions.d", extID+".json")); err != nil {
		t.Fatalf("the binding was retired: %v", err)
	}
}

// writeRecord publishes an owner record for source id whose host is process
// pid (phase reserved: no group), as a host would.
func (f *fixture) writeRecord(pid int, id, op string) string {
	f.t.Helper()
	bootID, err := launch.BootID()
	if err != nil {
		f.t.Fatal(err)
	}
	st, err := procstat.Read(pid)
	if err != nil {
		f.t.Fatal(err)
	}
	start := st.Start
	rec := launch.Record{
		Schema: launch.RecordSchema, Phase: launch.PhaseReserved,
		Host:        launch.Identity{PID: pid, StartTime: start, BootID: bootID},
		ExtensionID: procevent.BuiltinOwner("file-watch"), BindingDigest: procevent.BuiltinOwner("file-watch"),
		RequestID: "sha256:" + strings.Repeat("e", 64), SourceID: id, Operation: op, CreatedAt: time.Now().Unix(),
	}
	data, err := strictjson.Canonical(rec)
	if err != nil {
		f.t.Fatal(err)
	}
	var rnd [16]byte
	rand.Read(rnd[:])
	if err := os.MkdirAll(f.h.Invocations(), 0o700); err != nil {
		f.t.Fatal(err)
	}
	path := filepath.Join(f.h.Invocations(), strings.ReplaceAll(bootID, "-", "")+hex.EncodeToString(rnd[:])+".owner.json")
	f.write(path, string(data), 0o600)
	return path
}

// [REG-4] [RUN-4]: a retire (and a runner) refuses while an owner record of
// the source remains whose group is unproven and whose host is alive (as a
// serve keeps the record of a poll whose group outlived TERM and KILL), even
// though no claim is held; once the host is gone and the record resolved, the
// retire proceeds.
func TestRetireRefusesWhileSourceRecordRemains(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ok("procevent", "register", "file-watch", "b1", "--", "/bin/true")
	host := exec.Command("sleep", "60")
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Process.Kill(); host.Wait() })
	f.writeRecord(host.Process.Pid, "b1", "source.poll")
	f.fails("process-cleanup-failed", "procevent", "start", "b1")
	f.fails("process-cleanup-failed", "procevent", "retire", "b1")
	if out := f.ok("procevent", "list"); !strings.Contains(out, "\nb1 ") {
		t.Fatalf("the refused retire removed the record: %q", out)
	}
	host.Process.Kill()
	host.Wait()
	if out := f.ok("procevent", "retire", "b1"); out != "retired: b1\n" {
		t.Fatalf("retire printed %q", out)
	}
	if recs, err := launch.List(f.h.Invocations()); err != nil || len(recs) != 0 {
		t.Fatalf("records left: %v %+v", err, recs)
	}
}
