package procevent_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
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

// deadHost starts and reaps a process and returns its pid once f's record
// of it is written by write: the record's host is then a dead fm.
func deadHost(t *testing.T, write func(pid int) string) string {
	t.Helper()
	host := exec.Command("sleep", "60")
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	path := write(host.Process.Pid)
	host.Process.Kill()
	host.Wait()
	return path
}

// [GRP-3] Homes written by earlier versions of fm hold owner records named
// without the source index (<boot><random>.owner.json, 64 hex digits). Such
// a record of a dead host is still seen and resolved: by a poll of its
// source, by doctor, and by cleanup-invocations.
func TestOldRecordNamesStillCleaned(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ok("procevent", "register", "file-watch", "a1", "--", "/bin/true")
	old := deadHost(t, func(pid int) string { return f.writeRecord(pid, "a1", "source.poll") })
	if n := len(strings.TrimSuffix(filepath.Base(old), ".owner.json")); n != 64 {
		t.Fatalf("the fixture's record is not in the old name form: %s", old)
	}
	out, _, code := f.fm("doctor")
	if code == 0 || !strings.Contains(out, "belong to an fm that died") || !strings.Contains(out, filepath.Base(old)) {
		t.Fatalf("doctor exit %d did not report %s:\n%s", code, filepath.Base(old), out)
	}
	if out := f.ok("extension", "cleanup-invocations"); out != "cleaned-invocations: 1\n" {
		t.Fatalf("cleanup-invocations printed %q", out)
	}
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("cleanup-invocations kept the old-form record")
	}
	if out, _, code := f.fm("doctor"); !strings.Contains(out, "0 live, none stale") {
		t.Fatalf("doctor after cleanup, exit %d:\n%s", code, out)
	}
	// A poll of the source resolves one too before it starts.
	old = deadHost(t, func(pid int) string { return f.writeRecord(pid, "a1", "source.poll") })
	f.ok("procevent", "start", "a1")
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a poll of a1 kept a1's old-form record of a dead host")
	}
}

// [GRP-1] [RUN-4] A poll reads only its own source's owner records (and
// those in the old name form): a torn record of another source, which every
// listing of the whole home refuses, does not stop it; a torn one of its own
// source, or one in the old name form, does.
func TestPollReadsOnlyItsSourcesRecords(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ok("procevent", "register", "file-watch", "a1", "--", "/bin/true")
	f.ok("procevent", "register", "file-watch", "b1", "--", "/bin/true")
	boot, err := launch.BootID()
	if err != nil {
		t.Fatal(err)
	}
	bootHex := strings.ReplaceAll(boot, "-", "")
	key := func(id string) string { s := sha256.Sum256([]byte(id)); return hex.EncodeToString(s[:8]) }
	if err := os.MkdirAll(f.h.Invocations(), 0o700); err != nil {
		t.Fatal(err)
	}
	torn := filepath.Join(f.h.Invocations(), key("b1")+bootHex+strings.Repeat("1", 32)+".owner.json")
	f.write(torn, "", 0o600)
	f.ok("procevent", "start", "a1")
	f.fails("json-invalid", "procevent", "start", "b1")
	f.fails("json-invalid", "extension", "cleanup-invocations")
	if err := os.Rename(torn, filepath.Join(f.h.Invocations(), bootHex+strings.Repeat("1", 32)+".owner.json")); err != nil {
		t.Fatal(err)
	}
	f.fails("json-invalid", "procevent", "start", "a1")
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
