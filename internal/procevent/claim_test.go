package procevent_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/launch"
)

// startGated starts `fm procevent start <id>` in the background against a
// gated poll and waits until the package is polling.
func (f *fixture) startGated(id string) *exec.Cmd {
	f.t.Helper()
	f.mode("poll", "gate")
	os.Remove(filepath.Join(f.extState, "release"))
	os.Remove(filepath.Join(f.extState, "started."+id))
	cmd := f.fmCmd("procevent", "start", id)
	cmd.Stdout, cmd.Stderr = new(strings.Builder), new(strings.Builder)
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitFor(f.t, 10*time.Second, "the poll to start", func() bool {
		_, err := os.Stat(filepath.Join(f.extState, "started."+id))
		return err == nil
	})
	return cmd
}

func (f *fixture) release() {
	f.write(filepath.Join(f.extState, "release"), "", 0o600)
}

// lastPID is the pid (= process group) of the fake's latest invoke.
func (f *fixture) lastPID() int {
	f.t.Helper()
	lines := strings.Fields(f.read(filepath.Join(f.extState, "pids")))
	pid, err := strconv.Atoi(lines[len(lines)-1])
	if err != nil {
		f.t.Fatal(err)
	}
	return pid
}

// [REG-3] [RUN-4]: while a poll runs, a re-registration is refused and a
// second runner reports "already owned"; afterwards both work.
func TestReregisterWhilePolling(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	run := f.startGated("s1")
	errs := f.fails("source-active", "procevent", "register-extension", "sig", "s1", "--config-ref", "x")
	if !strings.Contains(errs, "prior runner remains active") {
		t.Fatalf("refusal says %q", errs)
	}
	if out := f.ok("procevent", "start", "s1"); out != "already owned: s1\n" {
		t.Fatalf("second start printed %q", out)
	}
	f.release()
	if err := run.Wait(); err != nil || !strings.HasPrefix(run.Stdout.(*strings.Builder).String(), "captured: ") {
		t.Fatalf("gated start: %v %q", err, run.Stdout)
	}
	f.registerExt("s1")
}

// [RUN-4] [GRP-3]: a runner killed mid-poll releases its claim with its
// death; the next runner proves the dead runner's group gone (stopping it)
// before it polls, and never runs two polls of one source at once.
func TestDeadRunnerReleasesClaim(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	run := f.startGated("s1")
	pgid := f.lastPID()
	run.Process.Signal(syscall.SIGKILL)
	run.Wait()
	if groupGone(pgid) {
		t.Fatal("the poll's group died with its runner; the test needs it orphaned")
	}
	recs, err := launch.List(f.h.Invocations())
	if err != nil || len(recs) != 1 || recs[0].SourceID != "s1" || recs[0].HostLive {
		t.Fatalf("owner records: %v %+v", err, recs)
	}
	f.mode("poll", "result")
	if out := f.ok("procevent", "start", "s1"); !strings.HasPrefix(out, "captured: ") {
		t.Fatalf("start after the dead runner printed %q", out)
	}
	if !groupGone(pgid) {
		t.Fatalf("the dead runner's group %d is still alive", pgid)
	}
	if recs, _ := launch.List(f.h.Invocations()); len(recs) != 0 {
		t.Fatalf("records left: %+v", recs)
	}
}

// [REG-4]: a retire stops the running poll (its exact group) before it
// removes the record, and nothing is captured for the stopped poll.
func TestRetireStopsRunningPoll(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	tok := f.registerExt("s1")
	run := f.startGated("s1")
	pgid := f.lastPID()
	start := time.Now()
	if out := f.ok("procevent", "retire", "s1", "--if-owner", tok); out != "retired: s1\n" {
		t.Fatalf("retire printed %q", out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("retire took %s", d)
	}
	if !groupGone(pgid) {
		t.Fatalf("the poll's group %d survived the retire", pgid)
	}
	run.Wait()
	if errs := run.Stderr.(*strings.Builder).String(); !strings.HasPrefix(errs, "error[source-active]: ") {
		t.Fatalf("the stopped runner said %q", errs)
	}
	if len(f.inbox()) != 0 || len(f.wakes()) != 0 {
		t.Fatalf("a stopped poll captured something: %v", f.inbox())
	}
}
