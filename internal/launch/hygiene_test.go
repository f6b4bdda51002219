package launch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/procstat"
)

// procState is what a test reads of a running process from outside it, so
// the process itself (here sleep) changes nothing of what is read.
type procState struct {
	fds                   []int
	sigIgn, sigBlk, umask string
	nofile                string // soft "Max open files"
	fd3                   string // readlink of descriptor 3, if open
}

func readProcState(t *testing.T, pid int) procState {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid)
	ents, err := os.ReadDir(dir + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	var ps procState
	for _, e := range ents {
		n, _ := strconv.Atoi(e.Name())
		ps.fds = append(ps.fds, n)
	}
	slices.Sort(ps.fds)
	ps.fd3, _ = os.Readlink(dir + "/fd/3")
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "SigIgn":
			ps.sigIgn = v
		case "SigBlk":
			ps.sigBlk = v
		case "Umask":
			ps.umask = v
		}
	}
	limits, err := os.ReadFile(dir + "/limits")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(limits), "\n") {
		if strings.HasPrefix(line, "Max open files") {
			ps.nofile = strings.Fields(strings.TrimPrefix(line, "Max open files"))[0]
		}
	}
	return ps
}

// awaitComm waits until process pid runs the program named comm (the barrier
// has become the entrypoint).
func awaitComm(t *testing.T, pid int, comm string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		if strings.TrimSpace(string(b)) == comm {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never became %s (comm %q)", pid, comm, b)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// [INV-2] [INV-3] [GRP-1]: nothing of the caller of fm reaches the package.
// A host started by a careless caller (descriptor 9 open without
// close-on-exec, SIGPIPE/SIGHUP/SIGUSR2 ignored, SIGUSR1/SIGWINCH blocked,
// umask 0, soft RLIMIT_NOFILE 200) launches sleep three ways: a compiled
// entrypoint through its verified descriptor, a script through its
// descriptor, and a built-in's argv by path. Read from outside, each starts
// with exactly descriptors 0, 1, 2 (a script also 3: its own file, which its
// interpreter reads), no signal ignored or blocked, umask 0077, and the
// caller's own soft RLIMIT_NOFILE (not the one Go raised for itself).
func TestEntrypointInheritsNothing(t *testing.T) {
	t.Parallel()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep program")
	}
	if sleep, err = filepath.EvalSymlinks(sleep); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, how string
		script    bool
		fds       []int
	}{
		{"binary-by-descriptor", "fd", false, []int{0, 1, 2}},
		{"script-by-descriptor", "fd", true, []int{0, 1, 2, 3}},
		{"builtin-argv-by-path", "argv", false, []int{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			prog := sleep
			if tc.script {
				prog = filepath.Join(f.reports, "ep")
				if err := os.WriteFile(prog, []byte("#!/bin/sh\nexec "+sleep+" \"$1\"\n"), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(exe())
			cmd.Env = []string{
				envMode + "=hostile-caller", envProgram + "=" + prog, envHow + "=" + tc.how,
				envReport + "=" + f.reports, envRecords + "=" + f.records, noRaceExitSleep,
			}
			out := new(strings.Builder)
			cmd.Stdout = out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			leader := onlyRecord(t, f.records).Leader.PID
			awaitComm(t, leader, "sleep")
			// The host itself did inherit the caller's state: the test is
			// about what the barrier cleans.
			host := readProcState(t, cmd.Process.Pid)
			if !slices.Contains(host.fds, 9) || host.umask != "0000" {
				t.Fatalf("the hostile caller's state did not reach the host: %+v", host)
			}
			// The kernel names the new program (comm) before it closes the
			// close-on-exec descriptors, so a look right after the name
			// changed can still see them: look again until the set is the
			// expected one (an inherited descriptor never goes away: sleep
			// closes nothing) or a deadline passes.
			ps := readProcState(t, leader)
			for deadline := time.Now().Add(5 * time.Second); !slices.Equal(ps.fds, tc.fds) && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
				ps = readProcState(t, leader)
			}
			if !slices.Equal(ps.fds, tc.fds) {
				t.Errorf("descriptors %v, want exactly %v", ps.fds, tc.fds)
			}
			if tc.script && ps.fd3 != prog {
				t.Errorf("descriptor 3 of a script is %q, want its own file %s", ps.fd3, prog)
			}
			zero := "0000000000000000"
			if ps.sigIgn != zero || ps.sigBlk != zero {
				t.Errorf("SigIgn %s SigBlk %s, want none", ps.sigIgn, ps.sigBlk)
			}
			if ps.umask != fmt.Sprintf("%04o", EntrypointUmask) {
				t.Errorf("umask %s, want %04o", ps.umask, EntrypointUmask)
			}
			if ps.nofile != "200" {
				t.Errorf("soft RLIMIT_NOFILE %s, want the caller's 200", ps.nofile)
			}
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
			if got := out.String(); got != string(errcode.ProcessFailed) {
				t.Errorf("host: %q", got)
			}
			assertGroupGone(t, leader)
			assertNoRecords(t, f.records)
		})
	}
}

// [INV-1]: with Exec, the barrier executes the open file, never the name: a
// different executable renamed over Path after the open does not run, for a
// compiled program and for a script, whose interpreter reads the open file
// through /dev/fd/3, which is also its $0.
func TestExecRunsOpenFile(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	trueProg, err1 := exec.LookPath("true")
	falseProg, err2 := exec.LookPath("false")
	if err1 != nil || err2 != nil {
		t.Skip("no true/false programs")
	}
	copyExec := func(src, dst string) {
		b, err := os.ReadFile(src)
		if err == nil {
			err = os.WriteFile(dst, b, 0o555)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	run := func(verified, replacement func(string)) (*Result, error) {
		path := filepath.Join(f.reports, "ep")
		os.Remove(path)
		verified(path)
		file, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		other := filepath.Join(f.reports, "other")
		replacement(other)
		if err := os.Rename(other, path); err != nil {
			t.Fatal(err)
		}
		s := f.spec("unused")
		s.Path, s.Exec, s.Env = path, file, []string{"PATH=/usr/bin:/bin"}
		return Run(context.Background(), s)
	}
	// A compiled program: true was verified, false renamed over it.
	if _, err := run(func(p string) { copyExec(trueProg, p) }, func(p string) { copyExec(falseProg, p) }); err != nil {
		t.Errorf("binary: the replacement ran: %v", err)
	}
	script := func(word string) func(string) {
		return func(p string) {
			if err := os.WriteFile(p, []byte("#!/bin/sh\necho \""+word+":$0:$1\"\n"), 0o555); err != nil {
				t.Fatal(err)
			}
		}
	}
	res, err := run(script("verified"), script("replacement"))
	if err != nil || string(res.Stdout) != "verified:/dev/fd/3:invoke\n" {
		t.Errorf("script: %q, %v", res.Stdout, err)
	}
}

// [GRP-3] [GRP-4]: fm makes every group inside its own session and never a
// session leader, so a record naming a session leader, a process of another
// session, or no session at all is never acted on: a forged record naming
// the exact pid, start time and boot id of a real `setsid sleep` leaves the
// sleep (and its whole session) alive and the record in place, and Cleanup
// reports process-cleanup-failed. A group leader of this session under a
// record naming another session is spared the same way; the same record with
// the right session is cleared (the group is stopped).
func TestCleanupSparesForeignSession(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid program")
	}
	all := func(Record) bool { return true }
	spared := func(t *testing.T, f fixture, victim Identity, sid *int) {
		t.Helper()
		path := fabricateSession(t, f.records, Record{Host: deadIdentity(t), Leader: &victim}, sid)
		n, err := Cleanup(f.records, all)
		assertCode(t, err, errcode.ProcessCleanupFailed)
		if n != 0 {
			t.Errorf("cleaned %d", n)
		}
		time.Sleep(50 * time.Millisecond) // a stray signal would have landed by now
		if live, _ := alive(victim); !live {
			t.Fatal("the unrelated process was signalled")
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("record removed: %v", err)
		}
		os.Remove(path)
	}

	f := newFixture(t)
	cmd := exec.Command("setsid", "sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	awaitComm(t, pid, "sleep")
	st, err := procstat.Read(pid)
	if err != nil || st.SID != pid {
		t.Fatalf("setsid sleep: %+v %v", st, err)
	}
	boot, _ := BootID()
	sleeper := Identity{PID: pid, StartTime: st.Start, BootID: boot}
	self, err := procstat.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	ownSession, sleepSession := self.SID, pid
	t.Run("session-leader-its-own-session", func(t *testing.T) { spared(t, f, sleeper, &sleepSession) })
	t.Run("session-leader-our-session", func(t *testing.T) { spared(t, f, sleeper, &ownSession) })
	t.Run("no-session-recorded", func(t *testing.T) { spared(t, f, sleeper, nil) })

	// A group leader in this session (as fm makes them).
	member := exec.Command(exe())
	member.Env = []string{envMode + "=child", envReport + "=" + f.reports, envRole + "=member", noRaceExitSleep}
	member.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := member.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { member.Process.Kill(); member.Wait() })
	leader := f.reported(t, "member")
	other := ownSession + 1
	t.Run("group-leader-other-session-recorded", func(t *testing.T) { spared(t, f, leader, &other) })
	t.Run("group-leader-right-session-cleared", func(t *testing.T) {
		fabricateSession(t, f.records, Record{Host: deadIdentity(t), Leader: &leader}, &ownSession)
		if n, err := Cleanup(f.records, all); n != 1 || err != nil {
			t.Fatalf("Cleanup = %d, %v", n, err)
		}
		member.Wait()
		assertGone(t, "group leader", leader)
	})
	if live, _ := alive(sleeper); !live {
		t.Fatal("setsid sleep died")
	}
}

// fabricateSession is fabricate with session id sid.
func fabricateSession(t *testing.T, records string, rec Record, sid *int) string {
	t.Helper()
	path := fabricate(t, records, rec)
	d, err := openRecordDir(records, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	r, err := d.read(filepath.Base(path))
	if err != nil {
		t.Fatal(err)
	}
	r.SessionID = sid
	if err := d.write(filepath.Base(path), &r); err != nil {
		t.Fatal(err)
	}
	return path
}

// [GRP-1] [GRP-3]: a record of a group in phase group names a session of 0 or
// more (0 when the session leader lives outside this PID namespace, as in a
// container); reserved records name none.
func TestRecordSessionValidated(t *testing.T) {
	t.Parallel()
	dead := deadIdentity(t)
	zero, negative := 0, -1
	for _, tc := range []struct {
		rec  Record
		want bool
	}{
		{Record{Phase: PhaseReserved, Host: dead, SessionID: &zero}, false},
		{Record{Phase: PhaseReserved, Host: dead, SessionID: new(int)}, false},
		{Record{Phase: PhaseGroup, Host: dead, Leader: &dead, SessionID: &zero}, true},
		{Record{Phase: PhaseGroup, Host: dead, Leader: &dead, SessionID: &negative}, false},
		{Record{Phase: PhaseGroup, Host: dead, Leader: &dead}, true}, // uncertain, but readable
	} {
		r := tc.rec
		r.Schema, r.CreatedAt = RecordSchema, 1
		r.ExtensionID, r.BindingDigest, r.RequestID, r.Operation = "a", "b", "c", "d"
		if r.Leader != nil {
			pid := r.Leader.PID
			r.GroupPID = &pid
		}
		if err := r.validate("r"); (err == nil) != tc.want {
			t.Errorf("%+v: validate = %v", tc.rec, err)
		}
	}
}

// [GRP-3] a forged record naming the process group of the very process that
// runs the cleanup (a leader in its session, recorded with its true session)
// signals nothing: fm never records its own group, and stopping it would stop
// the cleanup itself (and the operator's script that ran it).
func TestCleanupSparesItsOwnGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cmd := exec.Command(exe())
	cmd.Env = []string{envMode + "=cleaner", envReport + "=" + f.reports, envRecords + "=" + f.records, noRaceExitSleep}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	cleaner := f.reported(t, "cleaner")
	self, err := procstat.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	path := fabricateSession(t, f.records, Record{Host: deadIdentity(t), Leader: &cleaner}, &self.SID)
	if err := os.WriteFile(filepath.Join(f.reports, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the cleanup signalled its own group: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(f.reports, "result")); string(b) != string(errcode.ProcessCleanupFailed) {
		t.Errorf("Cleanup: %q, want %s", b, errcode.ProcessCleanupFailed)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("record removed: %v", err)
	}
}

// [GRP-1] [GRP-3]: inside a container, the session that fm inherits is often
// led by a process outside fm's PID namespace, and /proc names it session 0.
// The group records, the recovery and the cleanup must work there exactly as
// on a host: this re-runs the record, crash and cleanup tests in a new PID
// namespace (root only, the namespace needs CAP_SYS_ADMIN).
func TestSessionOutsidePIDNamespace(t *testing.T) {
	if os.Getenv("FM_TEST_IN_PIDNS") != "" {
		t.Skip("already inside the namespace")
	}
	if os.Geteuid() != 0 {
		t.Skip("a new PID namespace needs root")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("unshare(1) not installed")
	}
	// sh stays PID 1 of the namespace, so the tests run as an ordinary pid
	// whose session (sh's parent's) is outside the namespace.
	cmd := exec.Command(unshare, "--pid", "--fork", "--mount-proc", "sh", "-c",
		`grep -q '^[0-9]* ([^)]*) . [0-9]* [0-9]* 0 ' /proc/self/stat || { echo "session is not 0 here"; exit 3; }; "$0" -test.count=1 -test.run '^(TestHostSIGTERM|TestHostSIGKILLThenCleanup|TestCrashInjection|TestCleanupSparesItsOwnGroup|TestRecordPublishedBeforePackageCode)$'; exit $?`,
		os.Args[0])
	cmd.Env = append(os.Environ(), "FM_TEST_IN_PIDNS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tests in a new PID namespace: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "PASS") {
		t.Fatalf("tests in a new PID namespace did not pass:\n%s", out)
	}
}
