package procevent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/procstat"
	"firstmate.dev/fm/internal/retire"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/internal/testpkg"
)

// Regression tests for defects found in review. Each runs real fm processes
// against real files.

// background starts fm in the background; its output is collected.
func (f *fixture) background(args ...string) (*exec.Cmd, *testpkg.SyncBuffer, *testpkg.SyncBuffer) {
	f.t.Helper()
	cmd := f.fmCmd(args...)
	out, errs := new(testpkg.SyncBuffer), new(testpkg.SyncBuffer)
	cmd.Stdout, cmd.Stderr = out, errs
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, out, errs
}

// waitExit waits up to d for cmd to exit and returns its exit status.
func waitExit(t *testing.T, cmd *exec.Cmd, d time.Duration) int {
	t.Helper()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
		return cmd.ProcessState.ExitCode()
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not exit within %s", cmd.Args, d)
		return -1
	}
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

// pidsIn reads the pids a shell appended to file.
func pidsIn(t *testing.T, file string) []int {
	data, _ := os.ReadFile(file)
	var out []int
	for _, s := range strings.Fields(string(data)) {
		p, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// [RUN-4] [REG-4] [GRP-3]: a built-in poll is supervised like an extension's:
// its group has an owner record before it runs, so when its runner dies the
// next start proves that group gone before it polls (never two polls at
// once), and a retire stops the running poll and the dead runner's group
// before it removes the record.
func TestBuiltinPollOutlivesNoRunner(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	pidFile := filepath.Join(f.work, "pids")
	argv := []string{"/bin/sh", "-c", `echo $$ >>"$0"; exec sleep 60`, pidFile}
	f.ok(append([]string{"procevent", "register", "file-watch", "b1", "--"}, argv...)...)

	run, _, _ := f.background("procevent", "start", "b1")
	waitFor(t, 10*time.Second, "the first poll", func() bool { return len(pidsIn(t, pidFile)) == 1 })
	first := pidsIn(t, pidFile)[0]
	recs, err := launch.List(f.h.Invocations())
	if err != nil || len(recs) != 1 || recs[0].SourceID != "b1" || recs[0].Operation != "source.poll" || recs[0].GroupPID == nil || *recs[0].GroupPID != first {
		t.Fatalf("owner records of the built-in poll: %v %+v", err, recs)
	}
	run.Process.Signal(syscall.SIGKILL)
	run.Wait()
	if groupGone(first) {
		t.Fatal("the poll died with its runner; the test needs it orphaned")
	}

	run, _, runErr := f.background("procevent", "start", "b1")
	waitFor(t, 10*time.Second, "the second poll", func() bool { return len(pidsIn(t, pidFile)) == 2 })
	if !groupGone(first) {
		t.Fatalf("the dead runner's poll (group %d) still runs beside the next one", first)
	}
	second := pidsIn(t, pidFile)[1]
	if out := f.ok("procevent", "retire", "b1"); out != "retired: b1\n" {
		t.Fatalf("retire printed %q", out)
	}
	if !groupGone(second) {
		t.Fatalf("the running poll (group %d) survived the retire", second)
	}
	if code := waitExit(t, run, 10*time.Second); code != 1 || !strings.HasPrefix(runErr.String(), "error[source-active]: ") {
		t.Fatalf("the stopped runner: exit %d %q", code, runErr)
	}
	if recs, err := launch.List(f.h.Invocations()); err != nil || len(recs) != 0 {
		t.Fatalf("records left: %v %+v", err, recs)
	}

	// A runner killed again leaves a record; the retire proves its group gone.
	f.ok(append([]string{"procevent", "register", "file-watch", "b1", "--"}, argv...)...)
	run, _, _ = f.background("procevent", "start", "b1")
	waitFor(t, 10*time.Second, "the third poll", func() bool { return len(pidsIn(t, pidFile)) == 3 })
	run.Process.Signal(syscall.SIGKILL)
	run.Wait()
	third := pidsIn(t, pidFile)[2]
	f.ok("procevent", "retire", "b1")
	if !groupGone(third) {
		t.Fatalf("a retire left the dead runner's poll (group %d) running", third)
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

// [CAP-6]: no lock file is created for a source that is not registered, nor
// before the boundary check of an external source; a retire removes the
// source's lock files.
func TestLockFilesOnlyForRegisteredSources(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.ok("procevent", "register", "file-watch", "b1", "--", "/bin/true")
	f.fails("source-missing", "procevent", "start", "nosuch")
	for _, n := range []string{"nosuch.claim", "nosuch.stop"} {
		if contains(f.registry(), n) {
			t.Fatalf("start of an unknown source created %s", n)
		}
	}
	f.ok("procevent", "start", "b1")
	f.ok("procevent", "retire", "b1")
	for _, n := range f.registry() {
		if strings.HasPrefix(n, "b1.") {
			t.Fatalf("a retire left %s", n)
		}
	}

	f.registerExt("e1")
	if err := os.Chmod(f.h.Registrations(), 0o750); err != nil {
		t.Fatal(err)
	}
	f.fails("mode-unsafe", "procevent", "start", "e1")
	if contains(f.registry(), "e1.stop") {
		t.Fatal("a start refused by the boundary created e1.stop")
	}
}

// registry lists the names in state/procevent.
func (f *fixture) registry() []string {
	f.t.Helper()
	ents, err := os.ReadDir(f.h.Registrations())
	if err != nil {
		f.t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// [WAKE-2]: a FIFO at <state>/.wake-queue makes `wake list` and the
// re-announcement refuse at once (not a regular file) instead of blocking.
func TestFIFOWakeQueueRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.ok("procevent", "start", "s1")
	queue := filepath.Join(f.h.State, ".wake-queue")
	if err := os.Remove(queue); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(queue, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // unblock a stuck reader, should there be one
		if w, err := os.OpenFile(queue, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	})
	for _, args := range [][]string{{"wake", "list"}, {"procevent", "reconcile", "--reannounce-after", "0"}} {
		cmd, _, errs := f.background(args...)
		if code := waitExit(t, cmd, 5*time.Second); code != 1 || !strings.HasPrefix(errs.String(), "error[path-unsafe]: ") {
			t.Fatalf("fm %v with a FIFO queue: exit %d %q", args, code, errs)
		}
	}
}

// [RID-1]: a capture whose meta was published but whose result write failed
// (here the file size limit stops it) captured nothing: the retry uses the
// same sequence, so its poll repeats the request id, and replaces the
// orphaned meta.
func TestFailedCaptureKeepsRequestID(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.mode("poll", "text:"+strings.Repeat("x", 3000))
	// 4 blocks of 512 bytes: the meta (~500 bytes) fits, the result does not.
	cmd := exec.Command("sh", "-c", `ulimit -f 4 && exec fm procevent start s1`)
	cmd.Env = f.env
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("the limited capture succeeded: %s", out)
	}
	if inbox := f.inbox(); !contains(inbox, "s1.1.meta.json") || contains(inbox, "s1.1.result") {
		t.Fatalf("after the failed capture the inbox holds %v", inbox)
	}
	want := filepath.Join(f.h.Inbox(), "s1.1.result")
	if out := f.ok("procevent", "start", "s1"); out != "captured: "+want+"\n" {
		t.Fatalf("the retry printed %q", out)
	}
	polls := f.log("poll")
	if len(polls) != 2 || strings.Fields(polls[0])[2] != strings.Fields(polls[1])[2] {
		t.Fatalf("the retry did not repeat the request id: %q", polls)
	}
	if len(f.wakes()) != 1 || f.wakes()[0].Key != "procevent:s1:1" {
		t.Fatalf("wakes %+v", f.wakes())
	}
}

// [HOME-5] [LIFE-1]: register-extension on a fresh home, where nothing binds
// the adapter, is refused with nothing created, not even the lifecycle lock.
func TestRegisterExtensionFreshHomeCreatesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.fails("adapter-unbound", "procevent", "register-extension", "sig", "s1", "--config-ref", "x")
	ents, err := os.ReadDir(f.h.Dir)
	if err != nil || len(ents) != 0 {
		t.Fatalf("a refused register-extension left %v in the home (%v)", ents, err)
	}
}

// [LIFE-1]: a command waiting for the lifecycle lock stops on SIGTERM: it
// exits promptly, changing nothing, while the holder keeps the lock.
func TestLifecycleWaitStopsOnTERM(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	hold(t, filepath.Join(f.h.Extensions(), "lifecycle.lock"))
	cmd, _, errs := f.background("procevent", "register-extension", "sig", "s1", "--config-ref", "x")
	time.Sleep(500 * time.Millisecond) // it is waiting for the lock now
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, cmd, 5*time.Second); code != 1 || !strings.HasPrefix(errs.String(), "error[process-failed]: ") {
		t.Fatalf("after SIGTERM: exit %d %q", code, errs)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("register-extension took %s to stop", d)
	}
	if out := f.ok("procevent", "list"); out != "no process-event sources\n" {
		t.Fatalf("list printed %q", out)
	}
}

// writeRecord publishes an owner record for source id whose host is process
// pid (phase reserved: no group), as a host would.
func (f *fixture) writeRecord(pid int, id, op string) string {
	f.t.Helper()
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		f.t.Fatal(err)
	}
	st, err := procstat.Read(pid)
	if err != nil {
		f.t.Fatal(err)
	}
	start := st.Start
	bootID := strings.TrimSpace(string(boot))
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

// zombieChildren counts the zombie children of process pid.
func zombieChildren(pid int) int {
	n := 0
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, c := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(c)
			if err != nil {
				continue
			}
			if st, err := procstat.Read(pid); err == nil && st.State == 'Z' {
				n++
			}
		}
	}
	return n
}

// [RUN-2] [GRP-5]: serve, a child subreaper, reaps the processes that left
// their poll's group and re-parented to it, so its zombies do not accumulate.
func TestServeReapsEscapedProcesses(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	countFile := filepath.Join(f.work, "polls")
	// Each poll leaves a process in a session of its own, which exits soon
	// after the poll: an orphan of serve. The poll ends only once that
	// process has left its group (it writes the flag after setsid).
	flag := filepath.Join(f.work, "escaped")
	f.ok("procevent", "register", "file-watch", "z1", "--", "/bin/sh", "-c",
		`echo . >>"$0"; rm -f "$1"; setsid sh -c 'echo x >"$0"; exec sleep 0.1' "$1" </dev/null >/dev/null 2>&1 & while [ ! -s "$1" ]; do sleep 0.01; done; exit 75`, countFile, flag)
	serve, log := f.serve()
	waitFor(t, 30*time.Second, "twenty polls", func() bool {
		data, _ := os.ReadFile(countFile)
		return strings.Count(string(data), ".") >= 20
	})
	time.Sleep(time.Second)
	if n := zombieChildren(serve.Process.Pid); n > 3 {
		t.Fatalf("serve has %d zombie children\n%s", n, log)
	}
	serve.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, serve, 15*time.Second); code != 0 {
		t.Fatalf("serve exited %d\n%s", code, log)
	}
}
