package launch

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/procstat"
	"firstmate.dev/fm/internal/testpkg"
)

// fixture is one test's state directory, records directory and report
// directory (which is also the entrypoint's working directory).
type fixture struct {
	records, reports string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	state := t.TempDir()
	reports := filepath.Join(state, "reports")
	if err := os.Mkdir(reports, 0o700); err != nil {
		t.Fatal(err)
	}
	return fixture{records: filepath.Join(state, "extension-invocations"), reports: reports}
}

func (f fixture) spec(mode string) Spec {
	return Spec{
		Path: exe(), Verb: "invoke", Dir: f.reports,
		Env:         entryEnv(mode, f.reports, f.records),
		StdoutLimit: 65536, StderrLimit: 8192,
		Timeout: 30 * time.Second,
		Records: f.records, Owner: testOwner,
	}
}

// reported waits for a helper's identity report.
func (f fixture) reported(t *testing.T, role string) Identity {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(f.reports, role))
		if err == nil {
			var id Identity
			if _, err := fmt.Sscanf(string(b), "%d %d", &id.PID, &id.StartTime); err != nil {
				t.Fatalf("report %s: %v", role, err)
			}
			id.BootID, _ = BootID()
			return id
		}
		if time.Now().After(deadline) {
			t.Fatalf("no report from %s", role)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (f fixture) hasReport(role string) bool {
	_, err := os.Stat(filepath.Join(f.reports, role))
	return err == nil
}

// assertGone fails unless the exact process is no longer running (absent, or
// a zombie nobody reaps).
func assertGone(t *testing.T, what string, id Identity) {
	t.Helper()
	if live, err := alive(id); err != nil || live {
		t.Errorf("%s (pid %d) is still alive (%v)", what, id.PID, err)
	}
}

// assertReaped fails unless the process no longer exists at all: the host
// reaped it.
func assertReaped(t *testing.T, what string, id Identity) {
	t.Helper()
	if st, err := procstat.Read(id.PID); err == nil && st.Start == id.StartTime {
		t.Errorf("%s (pid %d) was not reaped (state %c)", what, id.PID, st.State)
	}
}

// assertGroupGone fails if any live process has process group pgid.
func assertGroupGone(t *testing.T, pgid int) {
	t.Helper()
	ms, err := members(pgid)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if !m.Dead() {
			t.Errorf("process %d of group %d is alive (state %c)", m.pid, pgid, m.State)
		}
	}
}

// reapOrphans waits for each exact process to end and, if it re-parented to
// this test process, reaps it, so that no zombie outlives the test.
func reapOrphans(t *testing.T, ids ...Identity) {
	t.Helper()
	for _, id := range ids {
		deadline := time.Now().Add(5 * time.Second)
		for {
			st, err := procstat.Read(id.PID)
			if err != nil || st.Start != id.StartTime {
				break
			}
			if st.Dead() {
				if st.PPID == os.Getpid() {
					unix.Wait4(id.PID, nil, unix.WNOHANG|unix.WALL, nil)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("process %d still alive", id.PID)
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}

// reapGroup reaps the members of a proved-gone group that re-parented to this
// test process: first the members, then the leader, whose unreaped zombie
// pins the group's number meanwhile.
func reapGroup(t *testing.T, leader Identity) {
	t.Helper()
	ms, err := members(leader.PID)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.pid != leader.PID {
			reapOrphans(t, Identity{PID: m.pid, StartTime: m.Start})
		}
	}
	reapOrphans(t, leader)
}

// hostChildren reads the identities a crashed helper host reported.
func (f fixture) hostChildren(t *testing.T) []Identity {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.reports, "host-children"))
	if err != nil {
		return nil
	}
	var ids []Identity
	for _, line := range strings.Fields(strings.ReplaceAll(string(b), " ", ":")) {
		var id Identity
		if _, err := fmt.Sscanf(line, "%d:%d", &id.PID, &id.StartTime); err != nil {
			t.Fatalf("host-children: %v", err)
		}
		ids = append(ids, id)
	}
	return ids
}

func assertNoRecords(t *testing.T, records string) {
	t.Helper()
	entries, err := os.ReadDir(records)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left in records directory: %s", e.Name())
	}
}

func assertCode(t *testing.T, err error, want errcode.Code) {
	t.Helper()
	if got := errcode.Of(err); err == nil || got != want {
		t.Fatalf("error = %v (code %s), want code %s", err, got, want)
	}
}

// startUnrelated starts a same-user process outside any invocation group and
// returns its identity; it is killed at the end of the test.
func startUnrelated(t *testing.T, f fixture, role string) Identity {
	t.Helper()
	cmd := exec.Command(exe())
	cmd.Env = []string{envMode + "=child", envReport + "=" + f.reports, envRole + "=" + role, noRaceExitSleep}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return f.reported(t, role)
}

// [INV-2] [INV-3] [GRP-1] [GRP-2]: argv is [entrypoint, verb], the working
// directory and the environment are exactly the spec's, stdout comes back, the
// record is removed and the group is gone (its leader reaped).
func TestGoodEntrypoint(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.spec("good")
	s.Stdin = []byte("hello")
	res, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("ok:hello|%s invoke|%s|%s", exe(), f.reports, strings.Join(s.Env, ","))
	if string(res.Stdout) != want {
		t.Errorf("stdout = %q\nwant     %q", res.Stdout, want)
	}
	leader := f.reported(t, "leader")
	assertReaped(t, "leader", leader)
	assertGroupGone(t, leader.PID)
	assertNoRecords(t, f.records)
	if fi, err := os.Lstat(f.records); err != nil || fi.Mode() != os.ModeDir|0o700 {
		t.Errorf("records directory: %v %v", fi.Mode(), err)
	}
}

// [INV-2]: the request reaches the entrypoint's stdin through a pipe, whole,
// then end of file: a small one (it fits the pipe before the fork, and the
// host keeps no writer) and one bigger than a pipe holds (the rest is written
// while the package reads).
func TestStdinIsThePipedRequest(t *testing.T) {
	t.Parallel()
	for _, size := range []int{0, 1, 4096, 65536, 200000} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			s := f.spec("stdin")
			s.Stdin = make([]byte, size)
			rand.Read(s.Stdin)
			res, err := Run(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("fifo=true n=%d sha256=%x err=<nil>", size, sha256.Sum256(s.Stdin))
			if string(res.Stdout) != want {
				t.Errorf("stdin: %s\nwant   %s", res.Stdout, want)
			}
			assertNoRecords(t, f.records)
		})
	}
}

// [INV-2]: a package that never reads its stdin, given more than a pipe
// holds, ends like any other: the host's writer of the rest is cut off once
// the group is gone, and nothing waits for it.
func TestStdinNeverRead(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.spec("quick")
	s.Stdin = bytes.Repeat([]byte("x"), 200000)
	if _, err := Run(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	assertNoRecords(t, f.records)
}

// fillStdin writes what an empty pipe takes and closes it; what a smaller
// pipe cannot take comes back to be written later, in order.
func TestFillStdin(t *testing.T) {
	for _, c := range []struct{ pipe, req int }{{0, 65536}, {4096, 10000}} {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		r := os.NewFile(uintptr(p[0]), "r")
		if c.pipe > 0 {
			if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, c.pipe); err != nil {
				t.Fatal(err)
			}
		}
		if err := unix.SetNonblock(p[1], true); err != nil {
			t.Fatal(err)
		}
		req := make([]byte, c.req)
		rand.Read(req)
		w, rest, err := fillStdin(p[1], req)
		if err != nil {
			t.Fatal(err)
		}
		if c.pipe == 0 && (w != nil || rest != nil) {
			t.Fatalf("%+v: a request that fits left a writer: %v, %d bytes", c, w, len(rest))
		}
		if c.pipe > 0 {
			if w == nil || len(rest) != c.req-c.pipe {
				t.Fatalf("%+v: rest %d bytes, writer %v", c, len(rest), w)
			}
			go func() { w.Write(rest); w.Close() }()
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, req) {
			t.Fatalf("%+v: read %d bytes (%v), want the request's %d", c, len(got), err, len(req))
		}
	}
}

// [GRP-1]: the entrypoint itself finds its durable owner record, in phase
// group, naming its own exact identity as leader and group, and its parent as
// host; canonical JSON, 0600, in a 0700 directory.
func TestRecordPublishedBeforePackageCode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	res, err := Run(context.Background(), f.spec("record"))
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "record-ok" {
		t.Fatalf("entrypoint's check: %s", res.Stdout)
	}
	assertNoRecords(t, f.records)
}

// [INV-5] [GRP-2]: an entrypoint and a descendant that both ignore TERM time
// out, and the whole group is gone within 3 s of the timeout.
func TestTimeoutKillsWholeGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.spec("hang")
	s.Timeout = 300 * time.Millisecond
	begin := time.Now()
	_, err := Run(context.Background(), s)
	assertCode(t, err, errcode.Timeout)
	if d := time.Since(begin); d > s.Timeout+3*time.Second {
		t.Errorf("Run took %v", d)
	}
	leader, child := f.reported(t, "leader"), f.reported(t, "child")
	assertReaped(t, "leader", leader)
	assertReaped(t, "TERM-ignoring child", child)
	assertGroupGone(t, leader.PID)
	assertNoRecords(t, f.records)
}

// [GRP-2]: a successful answer whose group still has a live (TERM-ignoring)
// child is process-leak, and the child is killed and reaped.
func TestLingeringChildIsLeak(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, err := Run(context.Background(), f.spec("leak"))
	assertCode(t, err, errcode.ProcessLeak)
	leader, child := f.reported(t, "leader"), f.reported(t, "child")
	assertReaped(t, "lingering child", child)
	assertGroupGone(t, leader.PID)
	assertNoRecords(t, f.records)
}

// [INV-4] [GRP-2]: crossing a stream bound stops the invocation at once, long
// before its timeout; stderr is never returned.
func TestStreamBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode string
		want errcode.Code
	}{
		{"flood-out", errcode.ResponseOversized}, // 70,000 bytes > 65,536
		{"flood-err", errcode.StderrOversized},   // 9,000 bytes > 8,192
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			s := f.spec(tc.mode)
			s.Timeout = time.Minute
			begin := time.Now()
			_, err := Run(context.Background(), s)
			assertCode(t, err, tc.want)
			if d := time.Since(begin); d > 5*time.Second {
				t.Errorf("stopped after %v, not at once", d)
			}
			if strings.Contains(err.Error(), "xxx") || strings.Contains(err.Error(), "eee") {
				t.Errorf("error shows package output: %v", err)
			}
			leader := f.reported(t, "leader")
			assertReaped(t, "leader", leader)
			assertGroupGone(t, leader.PID)
			assertNoRecords(t, f.records)
		})
	}
}

// [GRP-2]: a non-zero exit or death by signal is process-failed, described by
// status or signal only.
func TestFailedEntrypoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ mode, msg string }{
		{"exit7", "exit status 7"},
		{"selfkill", "signal 9"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			_, err := Run(context.Background(), f.spec(tc.mode))
			assertCode(t, err, errcode.ProcessFailed)
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("message %q lacks %q", err, tc.msg)
			}
			assertNoRecords(t, f.records)
		})
	}
}

// [GRP-2] [GRP-4]: a child that already exited but was never waited for is
// no leak; the host (subreaper) reaps it.
func TestExitedOrphanIsReaped(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := Run(context.Background(), f.spec("zombie-orphan")); err != nil {
		t.Fatal(err)
	}
	leader := f.reported(t, "leader")
	assertReaped(t, "leader", leader)
	assertGroupGone(t, leader.PID)
	if ms, _ := members(leader.PID); len(ms) != 0 {
		t.Errorf("group %d still has %d zombie(s)", leader.PID, len(ms))
	}
}

// [GRP-2]: many concurrent Runs in one host each reap exactly their own group.
func TestConcurrentRuns(t *testing.T) {
	t.Parallel()
	const n = 20
	f := newFixture(t)
	var wg sync.WaitGroup
	errs := make([]error, n)
	dirs := make([]string, n)
	for i := range n {
		dirs[i] = filepath.Join(f.reports, fmt.Sprint(i))
		if err := os.Mkdir(dirs[i], 0o700); err != nil {
			t.Fatal(err)
		}
		s := f.spec([]string{"tidy", "zombie-orphan"}[i%2])
		s.Dir, s.Env = dirs[i], entryEnv([]string{"tidy", "zombie-orphan"}[i%2], dirs[i], f.records)
		wg.Go(func() {
			res, err := Run(context.Background(), s)
			if err == nil && string(res.Stdout) != "ok" {
				err = fmt.Errorf("stdout %q", res.Stdout)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Errorf("run %d: %v", i, errs[i])
			continue
		}
		leader := fixture{reports: dirs[i]}.reported(t, "leader")
		assertReaped(t, "leader", leader)
		if ms, _ := members(leader.PID); len(ms) != 0 {
			t.Errorf("run %d: group %d still has %d process(es)", i, leader.PID, len(ms))
		}
	}
	assertNoRecords(t, f.records)
}

// startHost runs the test binary as a tiny fm host (helper mode "host").
func startHost(t *testing.T, f fixture, entry, crash string, timeoutMS int) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(exe())
	cmd.Env = []string{
		envMode + "=host", envEntry + "=" + entry, envReport + "=" + f.reports,
		envRecords + "=" + f.records, envCrash + "=" + crash, envTimeout + "=" + fmt.Sprint(timeoutMS),
		noRaceExitSleep,
	}
	out := new(strings.Builder)
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, out
}

// onlyRecord waits until records holds exactly one record in phase group.
func onlyRecord(t *testing.T, records string) Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs, err := List(records)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 1 && recs[0].Phase == PhaseGroup {
			return recs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("records: %+v", recs)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// [GRP-2]: on SIGTERM the host stops the exact group and exits non-zero only
// once the group is gone; no record remains.
func TestHostSIGTERM(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	host, out := startHost(t, f, "slow", "", 60000)
	rec := onlyRecord(t, f.records)
	leader, child := f.reported(t, "leader"), f.reported(t, "child")
	if *rec.GroupPID != leader.PID || *rec.Leader != leader {
		t.Fatalf("record leader %+v, entrypoint %+v", *rec.Leader, leader)
	}
	if err := host.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := host.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || out.String() != string(errcode.ProcessFailed) {
		t.Fatalf("host: %v, output %q", err, out)
	}
	// The host reaped the group before it exited.
	assertReaped(t, "leader", leader)
	assertReaped(t, "child", child)
	assertGroupGone(t, leader.PID)
	assertNoRecords(t, f.records)
}

// [GRP-2] [GRP-4]: a process of the same session that is no descendant of
// the entrypoint joins its group and outlives it. The host's only child is
// the leader, so the group proof takes its fast path (reap the leader, then
// the kernel's group probe), which must still find the joiner: process-leak,
// the joiner stopped, the record removed.
func TestForeignJoinerIsLeak(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	host, out := startHost(t, f, "await-joiner", "", 60000)
	joiner := exec.Command(exe())
	joiner.Env = []string{envMode + "=joiner", envReport + "=" + f.reports, noRaceExitSleep}
	if err := joiner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { joiner.Process.Kill(); joiner.Wait() })
	err := host.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || out.String() != string(errcode.ProcessLeak) {
		t.Fatalf("host: %v, output %q", err, out)
	}
	leader, joined := f.reported(t, "leader"), f.reported(t, "joiner")
	if st := joiner.Wait(); st == nil || joiner.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Errorf("joiner: %v %v, want killed by TERM", st, joiner.ProcessState)
	}
	assertGone(t, "joiner", joined)
	assertGroupGone(t, leader.PID)
	assertNoRecords(t, f.records)
}

// [GRP-3] [LIFE-2]: a SIGKILLed host leaves the group running and its record
// in place; Pins reports it; Cleanup proves the exact recorded identity,
// stops that group, clears the record; Pins then reports nothing.
func TestHostSIGKILLThenCleanup(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	host, _ := startHost(t, f, "slow", "", 60000)
	rec := onlyRecord(t, f.records)
	leader, child := f.reported(t, "leader"), f.reported(t, "child")
	host.Process.Kill()
	host.Wait()

	recs, err := List(f.records)
	if err != nil || len(recs) != 1 || recs[0].HostLive || *recs[0].Leader != *rec.Leader {
		t.Fatalf("after host death: %+v %v", recs, err)
	}
	for what, id := range map[string]Identity{"leader": leader, "child": child} {
		if live, _ := alive(id); !live {
			t.Fatalf("%s died with the host", what)
		}
	}
	pins, err := Pins(f.records, testOwner.BindingDigest)
	if err != nil || len(pins) != 1 {
		t.Fatalf("Pins before cleanup: %v %v", pins, err)
	}
	if other, err := Pins(f.records, "sha256:"+strings.Repeat("0", 64)); err != nil || len(other) != 0 {
		t.Fatalf("Pins of another binding: %v %v", other, err)
	}
	n, err := Cleanup(f.records, func(r Record) bool { return r.BindingDigest == testOwner.BindingDigest })
	if err != nil || n != 1 {
		t.Fatalf("Cleanup = %d, %v", n, err)
	}
	assertGone(t, "leader", leader)
	assertGone(t, "child", child)
	assertGroupGone(t, leader.PID)
	reapGroup(t, leader)
	if pins, err := Pins(f.records, testOwner.BindingDigest); err != nil || len(pins) != 0 {
		t.Fatalf("Pins after cleanup: %v %v", pins, err)
	}
	assertNoRecords(t, f.records)
}

// fabricate writes a record as a host would.
func fabricate(t *testing.T, records string, rec Record) string {
	t.Helper()
	d, err := openRecordDir(records, true)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	name, err := newRecordName(rec.SourceID)
	if err != nil {
		t.Fatal(err)
	}
	rec.Schema, rec.CreatedAt = RecordSchema, time.Now().Unix()
	rec.ExtensionID, rec.BindingDigest, rec.RequestID, rec.Operation = testOwner.ExtensionID, testOwner.BindingDigest, testOwner.RequestID, testOwner.Operation
	if rec.Phase == "" {
		rec.Phase = PhaseGroup
	}
	if rec.Leader != nil {
		pid := rec.Leader.PID
		rec.GroupPID = &pid
	}
	if err := d.write(name, &rec); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(records, name)
}

// deadIdentity is the identity of a process that has exited and been reaped.
func deadIdentity(t *testing.T) Identity {
	t.Helper()
	cmd := exec.Command(exe())
	cmd.Env = []string{envMode + "=quick", noRaceExitSleep}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	st, err := procstat.Read(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	boot, _ := BootID()
	return Identity{PID: cmd.Process.Pid, StartTime: st.Start, BootID: boot}
}

// [GRP-3] [GRP-4]: a record whose leader pid now belongs to a different,
// unrelated process (another start time) is uncertain: Cleanup refuses and
// never signals that process.
func TestCleanupRefusesReusedLeader(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	victim := startUnrelated(t, f, "unrelated")
	wrong := victim
	wrong.StartTime--
	path := fabricate(t, f.records, Record{Host: deadIdentity(t), Leader: &wrong})
	n, err := Cleanup(f.records, func(Record) bool { return true })
	assertCode(t, err, errcode.ProcessCleanupFailed)
	if n != 0 {
		t.Errorf("cleaned %d", n)
	}
	time.Sleep(50 * time.Millisecond) // a stray signal would have landed by now
	if live, _ := alive(victim); !live {
		t.Fatal("the unrelated process was harmed")
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("uncertain record removed: %v", err)
	}
}

// [GRP-3] [GRP-4]: the rest of the recovery decision table, on fabricated
// records.
func TestCleanupDecisionTable(t *testing.T) {
	t.Parallel()
	dead := deadIdentity(t)
	self, _ := selfIdentity()
	otherBoot := dead
	otherBoot.BootID = strings.Map(func(r rune) rune {
		if r == '-' {
			return r
		}
		return map[bool]rune{true: '1', false: '0'}[r == '0']
	}, dead.BootID)
	all := func(Record) bool { return true }

	t.Run("reserved-dead-host-cleared", func(t *testing.T) {
		f := newFixture(t)
		fabricate(t, f.records, Record{Phase: PhaseReserved, Host: dead})
		if n, err := Cleanup(f.records, all); n != 1 || err != nil {
			t.Fatalf("Cleanup = %d, %v", n, err)
		}
		assertNoRecords(t, f.records)
	})
	t.Run("other-boot-cleared", func(t *testing.T) {
		f := newFixture(t)
		fabricate(t, f.records, Record{Host: otherBoot, Leader: &otherBoot})
		if n, err := Cleanup(f.records, all); n != 1 || err != nil {
			t.Fatalf("Cleanup = %d, %v", n, err)
		}
	})
	t.Run("leader-and-group-gone-cleared", func(t *testing.T) {
		f := newFixture(t)
		fabricate(t, f.records, Record{Host: dead, Leader: &dead})
		if n, err := Cleanup(f.records, all); n != 1 || err != nil {
			t.Fatalf("Cleanup = %d, %v", n, err)
		}
	})
	t.Run("leader-gone-live-member-kept", func(t *testing.T) {
		// A group whose leader exited and was reaped while a member lives:
		// the member cannot be proved to be the recorded group's.
		f := newFixture(t)
		cmd := exec.Command(exe())
		cmd.Env = entryEnv("spawn-and-exit", f.reports, f.records)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		leader := f.reported(t, "leader")
		member := f.reported(t, "child")
		t.Cleanup(func() {
			syscall.Kill(member.PID, syscall.SIGKILL)
			reapOrphans(t, member)
		})
		cmd.Wait()
		fabricate(t, f.records, Record{Host: dead, Leader: &leader})
		_, err := Cleanup(f.records, all)
		assertCode(t, err, errcode.ProcessCleanupFailed)
		time.Sleep(50 * time.Millisecond)
		if live, _ := alive(member); !live {
			t.Fatal("a member of an unprovable group was signalled")
		}
	})
	t.Run("live-host-untouched", func(t *testing.T) {
		f := newFixture(t)
		path := fabricate(t, f.records, Record{Host: self, Leader: &dead})
		recs, err := List(f.records)
		if err != nil || len(recs) != 1 || !recs[0].HostLive || recs[0].Path != path {
			t.Fatalf("List: %+v %v", recs, err)
		}
		// Selected: counted as unresolved. Not selected: ignored.
		_, err = Cleanup(f.records, all)
		assertCode(t, err, errcode.ProcessCleanupFailed)
		if n, err := Cleanup(f.records, func(r Record) bool { return !r.HostLive }); n != 0 || err != nil {
			t.Fatalf("Cleanup(dead hosts only) = %d, %v", n, err)
		}
		if _, err := os.Stat(path); err != nil {
			t.Fatal("live invocation's record touched")
		}
	})
	t.Run("malformed-record-refused", func(t *testing.T) {
		f := newFixture(t)
		path := fabricate(t, f.records, Record{Phase: PhaseReserved, Host: dead})
		if err := os.WriteFile(path, []byte(`{"schema":"x","schema":"y"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := List(f.records)
		assertCode(t, err, errcode.JSONInvalid)
		_, err = Cleanup(f.records, all)
		assertCode(t, err, errcode.JSONInvalid)
		_, err = Pins(f.records, testOwner.BindingDigest)
		assertCode(t, err, errcode.JSONInvalid)
		if err := os.WriteFile(path, []byte(`{"schema":"x"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = List(f.records)
		assertCode(t, err, errcode.SchemaInvalid)
	})
	t.Run("torn-record-of-earlier-boot-cleared", func(t *testing.T) {
		// Records are not fsynced: a machine crash can leave one empty or
		// torn. Its name carries the boot it was written in, and nothing of
		// that boot runs, so it is skipped by readers and removed by
		// Cleanup; a torn record of this boot is still refused.
		f := newFixture(t)
		path := fabricate(t, f.records, Record{Host: dead, Leader: &dead})
		name := filepath.Base(path)
		if name[16:48] != strings.ReplaceAll(dead.BootID, "-", "") {
			t.Fatalf("record name %s does not carry the boot id %s after its source key", name, dead.BootID)
		}
		other := strings.ReplaceAll(otherBoot.BootID, "-", "")
		// Both name forms: with a source key, and without (fm before the
		// source index), which starts with the boot id.
		earlier := []string{filepath.Join(f.records, name[:16]+other+name[48:]), filepath.Join(f.records, other+name[48:])}
		for _, torn := range []string{"", `{"schema":"firstmate.ext`} {
			for _, e := range earlier {
				if err := os.WriteFile(e, []byte(torn), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			recs, err := List(f.records)
			if err != nil || len(recs) != 1 || recs[0].Path != path {
				t.Fatalf("List: %+v %v", recs, err)
			}
			if pins, err := Pins(f.records, testOwner.BindingDigest); err != nil || len(pins) != 1 {
				t.Fatalf("Pins: %+v %v", pins, err)
			}
		}
		if n, err := Cleanup(f.records, func(r Record) bool { return false }); n != 0 || err != nil {
			t.Fatalf("Cleanup = %d, %v", n, err)
		}
		for _, e := range earlier {
			if _, err := os.Stat(e); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("torn record of an earlier boot kept: %s", e)
			}
		}
		if _, err := os.Stat(path); err != nil {
			t.Error("unselected record removed")
		}
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := List(f.records)
		assertCode(t, err, errcode.JSONInvalid)
		_, err = Cleanup(f.records, all)
		assertCode(t, err, errcode.JSONInvalid)
	})
	t.Run("dead-writer-temp-removed", func(t *testing.T) {
		f := newFixture(t)
		path := fabricate(t, f.records, Record{Phase: PhaseReserved, Host: dead})
		tmp := filepath.Join(f.records, tempName(filepath.Base(path), dead))
		if err := os.WriteFile(tmp, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
		liveTmp := filepath.Join(f.records, tempName(filepath.Base(path), self))
		if err := os.WriteFile(liveTmp, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
		if n, err := Cleanup(f.records, all); n != 1 || err != nil {
			t.Fatalf("Cleanup = %d, %v", n, err)
		}
		if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
			t.Error("dead writer's temporary file kept")
		}
		if _, err := os.Stat(liveTmp); err != nil {
			t.Error("live writer's temporary file removed")
		}
	})
}

// [GRP-3] [HOME-4]: reading never creates; an absent directory has no
// records; a non-private or linked directory is refused before any launch.
func TestRecordsDirectory(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if recs, err := List(f.records); recs != nil || err != nil {
		t.Fatalf("List = %v, %v", recs, err)
	}
	if n, err := Cleanup(f.records, func(Record) bool { return true }); n != 0 || err != nil {
		t.Fatalf("Cleanup = %d, %v", n, err)
	}
	if _, err := os.Lstat(f.records); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a read created the records directory")
	}
	if err := os.Mkdir(f.records, 0o750); err != nil {
		t.Fatal(err)
	}
	_, err := Run(context.Background(), f.spec("good"))
	assertCode(t, err, errcode.ModeUnsafe)
	os.Remove(f.records)
	if err := os.Symlink(f.reports, f.records); err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), f.spec("good"))
	assertCode(t, err, errcode.LinkUnsafe)
	if f.hasReport("leader") {
		t.Fatal("package code ran")
	}
}

// [GRP-5]: an entrypoint whose child escapes with setsid (keeping stdout) is
// outside the contract: the escaped process is neither signalled nor claimed
// killed, and no unrelated process is harmed.
func TestSetsidEscape(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	unrelated := startUnrelated(t, f, "unrelated")
	_, err := Run(context.Background(), f.spec("setsid"))
	escaped := f.reported(t, "escaped")
	t.Cleanup(func() {
		syscall.Kill(escaped.PID, syscall.SIGKILL)
		reapOrphans(t, escaped)
	})
	assertCode(t, err, errcode.ProcessLeak)
	if strings.Contains(err.Error(), "killed") {
		t.Errorf("claims a kill: %v", err)
	}
	if live, _ := alive(unrelated); !live {
		t.Error("unrelated process harmed")
	}
	if live, _ := alive(escaped); !live {
		t.Error("escaped process was signalled")
	}
	assertGroupGone(t, f.reported(t, "leader").PID)
	assertNoRecords(t, f.records)
}

// [GRP-1] [GRP-3] crash injection: the host is SIGKILLed at every step of a
// launch and of its cleanup. Afterwards Cleanup resolves every record, no
// group member lives on, package code never ran before the release, and no
// file is left behind.
func TestCrashInjection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		step, entry string
		timeoutMS   int
		released    bool
	}{
		{"reserve", "slow", 60000, false},
		{"reserved", "slow", 60000, false},
		{"started", "slow", 60000, false},
		{"grouped", "slow", 60000, false},
		{"released", "slow", 60000, true},
		{"reading", "slow", 60000, true},
		{"terminating", "hang", 200, true},
		{"proved", "hang", 200, true},
	} {
		t.Run(tc.step, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			host, _ := startHost(t, f, tc.entry, tc.step, tc.timeoutMS)
			err := host.Wait()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("host did not die at step %s: %v", tc.step, err)
			}
			recs, err := List(f.records)
			if err != nil {
				t.Fatal(err)
			}
			var groups []Identity
			for _, r := range recs {
				if r.HostLive {
					t.Fatalf("dead host's record marked live: %+v", r)
				}
				if r.Phase == PhaseGroup {
					groups = append(groups, *r.Leader)
				}
			}
			if n, err := Cleanup(f.records, func(Record) bool { return true }); err != nil || n != len(recs) {
				t.Fatalf("Cleanup = %d, %v (records %d)", n, err, len(recs))
			}
			for _, leader := range groups {
				assertGroupGone(t, leader.PID)
				reapGroup(t, leader)
			}
			orphans := f.hostChildren(t)
			for _, role := range []string{"leader", "child"} {
				if !f.hasReport(role) {
					continue
				}
				if !tc.released {
					t.Fatalf("package code ran before the release (%s)", role)
				}
				id := f.reported(t, role)
				assertGone(t, role, id)
				orphans = append(orphans, id)
			}
			reapOrphans(t, orphans...)
			assertNoRecords(t, f.records)
		})
	}
}

// [GRP-1] [GRP-2]: a prepared invocation has its record in phase group and a
// barrier waiting in its own group, and no package code has run; Abort stops
// that barrier, proves the group gone and removes the record; Run of another
// prepared one behaves as Run; a context done before the release refuses
// without running package code.
func TestPrepareAbortRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p, err := Prepare(context.Background(), f.spec("good"))
	if err != nil {
		t.Fatal(err)
	}
	rec := onlyRecord(t, f.records)
	barrier := *rec.Leader
	if live, err := alive(barrier); err != nil || !live {
		t.Fatalf("barrier %+v not alive: %v", barrier, err)
	}
	time.Sleep(20 * time.Millisecond)
	if f.hasReport("leader") {
		t.Fatal("package code ran before the release")
	}
	if err := p.Abort(); err != nil {
		t.Fatal(err)
	}
	assertReaped(t, "barrier", barrier)
	assertGroupGone(t, barrier.PID)
	assertNoRecords(t, f.records)
	if f.hasReport("leader") {
		t.Fatal("package code ran after Abort")
	}
	if _, err := p.Run(context.Background()); err == nil {
		t.Fatal("Run after Abort succeeded")
	}

	s := f.spec("good")
	s.Stdin = []byte("again")
	p, err = Prepare(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Run(context.Background())
	if err != nil || !strings.HasPrefix(string(res.Stdout), "ok:again|") {
		t.Fatalf("Run: %q %v", res.Stdout, err)
	}
	if err := p.Abort(); err != nil {
		t.Fatalf("Abort after Run: %v", err)
	}
	assertNoRecords(t, f.records)

	g := newFixture(t)
	p, err = Prepare(context.Background(), g.spec("good"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = p.Run(ctx)
	assertCode(t, err, errcode.ProcessFailed)
	assertNoRecords(t, g.records)
	if g.hasReport("leader") {
		t.Fatal("package code ran despite the cancelled context")
	}
}

// [INV-4] [GRP-2]: the stream bounds are exact whatever the writes' and
// reads' sizes (streams read pooled 32 KiB chunks): exactly 65,536 bytes of
// stdout and 8,192 of stderr are accepted, with stdout returned byte for
// byte; one more byte of either is over its bound.
func TestStreamBoundsExact(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		out, err int
		want     errcode.Code
	}{
		{65536, 8192, ""},
		{65537, 0, errcode.ResponseOversized},
		{0, 8193, errcode.StderrOversized},
		{32768, 8192, ""},
		{1, 1, ""},
	} {
		t.Run(fmt.Sprintf("%d-%d", tc.out, tc.err), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			s := f.spec("emit")
			s.Env = append(s.Env, fmt.Sprintf("FM_LAUNCH_TEST_OUT=%d", tc.out), fmt.Sprintf("FM_LAUNCH_TEST_ERR=%d", tc.err))
			var errN int64
			var errKept []byte
			s.Stderr = func(b []byte, n int64) { errKept, errN = bytes.Clone(b), n }
			res, err := Run(context.Background(), s)
			if tc.want != "" {
				assertCode(t, err, tc.want)
			} else if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" && !bytes.Equal(res.Stdout, pattern(0, tc.out)) {
				t.Errorf("stdout: %d bytes, not the %d written", len(res.Stdout), tc.out)
			}
			if errN != int64(tc.err) || !bytes.Equal(errKept, pattern(0, min(tc.err, s.StderrLimit))) {
				t.Errorf("stderr: %d bytes counted, %d kept; wrote %d", errN, len(errKept), tc.err)
			}
			assertNoRecords(t, f.records)
		})
	}
}

// [GRP-2]: a package that closes stdout at once and exits 0 later answers
// nothing: an empty stdout, no leak, nothing left.
func TestStdoutClosedEarly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	res, err := Run(context.Background(), f.spec("close-stdout"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Stdout) != 0 {
		t.Errorf("stdout %q", res.Stdout)
	}
	leader := f.reported(t, "leader")
	assertReaped(t, "leader", leader)
	assertGroupGone(t, leader.PID)
	assertNoRecords(t, f.records)
}

// [GRP-2] [GRP-4]: when the invocation is stopped (its context cancelled),
// a leader that obeys TERM exits at once, and stop, which now waits for the
// leader before anything else, must still find its TERM-ignoring child,
// KILL it and prove the group gone.
func TestStopKillsTermIgnoringMember(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		f.reported(t, "leader")
		cancel()
	}()
	_, err := Run(ctx, f.spec("term-child"))
	assertCode(t, err, errcode.ProcessFailed)
	leader, child := f.reported(t, "leader"), f.reported(t, "child")
	assertReaped(t, "leader", leader)
	assertReaped(t, "TERM-ignoring child", child)
	assertGroupGone(t, leader.PID)
	assertNoRecords(t, f.records)
}

// [OP-3] [GRP-2]: a launch whose descriptors sit at the top of the file limit
// is a host fault, not the package's failure: syscall.ForkExec's child moves
// its error pipe just above the highest descriptor it is handed, which the
// limit forbids, and the fork reports EBADF. Under serve with a small
// ulimit -n that EBADF was captured as process-failed evidence against a
// valid package (TestServeUnderFileLimit, 1 run in 2). Not parallel: it
// lowers this process's file limit.
func TestForkAtFileLimitIsHostFault(t *testing.T) {
	f := newFixture(t)
	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	limit := testpkg.TopFD(t) + 32
	file, err := os.Open(exe())
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Dup3(int(file.Fd()), limit-1, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	file.Close()
	entry := os.NewFile(uintptr(limit-1), exe())
	defer entry.Close()
	lim := orig
	lim.Cur = uint64(limit)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	s := f.spec("good")
	s.Exec = entry
	_, err = Run(context.Background(), s)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	if err == nil || !errcode.HostFault(err) {
		t.Fatalf("launch at the file limit: %v (host fault %v), want a host fault", err, errcode.HostFault(err))
	}
	assertNoRecords(t, f.records)
}

// [OP-3]: the owner record is a file, so the file size limit (RLIMIT_FSIZE,
// ulimit -f) of the operator who started fm bounds it: under a limit smaller
// than a record nothing starts, and that failure (EFBIG) is the host's, never
// the package's, so it must be a host fault (a poll is then not captured as
// evidence against a valid package, and serve backs off). Not parallel: it
// lowers this process's file size limit.
func TestRecordOverFileSizeLimitIsHostFault(t *testing.T) {
	f := newFixture(t)
	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &orig); err != nil {
		t.Fatal(err)
	}
	s := f.spec("good")
	lim := orig
	lim.Cur = 100
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	_, err := Run(context.Background(), s)
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &orig); err != nil {
		t.Fatal(err)
	}
	if err == nil || !errcode.HostFault(err) || !errors.Is(err, unix.EFBIG) {
		t.Fatalf("record over the file size limit: %v (host fault %v), want a host fault from EFBIG", err, errcode.HostFault(err))
	}
	assertNoRecords(t, f.records)
}
