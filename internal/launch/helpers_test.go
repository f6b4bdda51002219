package launch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/procstat"
	"firstmate.dev/fm/internal/strictjson"
)

// The test binary is its own fake entrypoint, descendant and host: the
// environment variable envMode selects a helper mode. The barrier execs the
// entrypoint with exactly Spec.Env, so every helper gets its settings from
// there.
const (
	envMode       = "FM_LAUNCH_TEST_MODE"
	envReport     = "FM_LAUNCH_TEST_REPORT"      // directory for pid reports
	envRole       = "FM_LAUNCH_TEST_ROLE"        // report name of a descendant
	envIgnoreTerm = "FM_LAUNCH_TEST_IGNORE_TERM" // "1": ignore SIGTERM
	envRecords    = "FM_LAUNCH_TEST_RECORDS"     // records directory (mode record, host)
	envEntry      = "FM_LAUNCH_TEST_ENTRY"       // host: the entrypoint's mode
	envCrash      = "FM_LAUNCH_TEST_CRASH"       // host: the step to SIGKILL itself at
	envTimeout    = "FM_LAUNCH_TEST_TIMEOUT_MS"  // host: Spec.Timeout
	envProgram    = "FM_LAUNCH_TEST_PROGRAM"     // host: run this program instead of a helper mode
	envHow        = "FM_LAUNCH_TEST_HOW"         // host: "fd" (Spec.Exec) or "argv" (by path)
	envSleep      = "FM_LAUNCH_TEST_SLEEP_MS"    // sleep-answer: how long
)

func TestMain(m *testing.M) {
	MaybeBarrier()
	if mode := os.Getenv(envMode); mode != "" {
		os.Exit(helper(mode))
	}
	// Orphans of the helper hosts the tests kill re-parent to this process
	// (not to PID 1, which never reaps here), so reapOrphans can reap them.
	if err := becomeSubreaper(); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

var testOwner = Owner{
	ExtensionID:   "org.example.test",
	BindingDigest: "sha256:" + strings.Repeat("ab", 32),
	RequestID:     "sha256:" + strings.Repeat("cd", 32),
	SourceID:      "src-1",
	Operation:     "source.poll",
}

// noRaceExitSleep stops a -race helper from sleeping 1 s at exit.
const noRaceExitSleep = "GORACE=atexit_sleep_ms=0"

// entryEnv is the exact environment of a helper entrypoint.
func entryEnv(mode, reportDir, records string) []string {
	return []string{envMode + "=" + mode, envReport + "=" + reportDir, envRecords + "=" + records, "LANG=C", "LC_ALL=C", noRaceExitSleep}
}

func helper(mode string) int {
	switch mode {
	case "good": // echo stdin, argv, cwd and environment
		in, _ := io.ReadAll(os.Stdin)
		report("leader")
		wd, _ := os.Getwd()
		fmt.Printf("ok:%s|%s|%s|%s", in, strings.Join(os.Args, " "), wd, strings.Join(os.Environ(), ","))
	case "stdin": // describe stdin and what it reads
		report("leader")
		fmt.Print(describeStdin())
	case "record": // check the owner record from inside the package's code
		report("leader")
		if err := checkOwnRecord(); err != nil {
			fmt.Print(err)
			return 1
		}
		fmt.Print("record-ok")
	case "tidy": // a well-behaved entrypoint: its child exits and is waited for
		c := exec.Command(exe())
		c.Env = []string{envMode + "=quick", noRaceExitSleep}
		if c.Run() != nil {
			return 1
		}
		report("leader")
		fmt.Print("ok")
	case "zombie-orphan": // leaves an exited, unreaped child behind
		pid := spawn("orphan", false, false, false, "quick")
		for st, err := procstat.Read(pid); err == nil && !st.Dead(); st, err = procstat.Read(pid) {
			time.Sleep(time.Millisecond)
		}
		report("leader")
		fmt.Print("ok")
	case "hang": // ignores TERM, and so does its child
		signal.Ignore(syscall.SIGTERM)
		spawn("child", true, false, false, "child")
		report("leader")
		time.Sleep(time.Hour)
	case "leak": // answers, exits 0, leaves a TERM-ignoring child holding stdout
		spawn("child", true, false, true, "child")
		report("leader")
		fmt.Print("ok")
	case "flood-out":
		report("leader")
		os.Stdout.Write(bytes.Repeat([]byte("x"), 70000))
		time.Sleep(time.Hour)
	case "flood-err":
		report("leader")
		os.Stderr.Write(bytes.Repeat([]byte("e"), 9000))
		time.Sleep(time.Hour)
	case "exit7":
		return 7
	case "sleep-answer": // answers "ok" after envSleep milliseconds
		ms, _ := strconv.Atoi(os.Getenv(envSleep))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		fmt.Print("ok")
	case "selfkill":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Hour)
	case "setsid": // a child escapes into a new session, keeping stdout
		spawn("escaped", false, true, true, "child")
		report("leader")
		fmt.Print("ok")
	case "setsid-stdin": // a child escapes into a new session with stdin only (unread), then exits 0
		env := []string{envMode + "=child", envReport + "=" + os.Getenv(envReport), envRole + "=escaped", noRaceExitSleep}
		if _, err := os.StartProcess(exe(), []string{exe()}, &os.ProcAttr{
			Env: env, Files: []*os.File{os.Stdin, nil, nil},
			Sys: &syscall.SysProcAttr{Setsid: true},
		}); err != nil {
			return 1
		}
		for {
			if _, err := os.Stat(filepath.Join(os.Getenv(envReport), "escaped")); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		report("leader")
	case "slow": // a child, some output, then waits
		spawn("child", false, false, false, "child")
		report("leader")
		fmt.Print("partial")
		time.Sleep(time.Hour)
	case "emit": // FM_LAUNCH_TEST_OUT bytes on stdout, FM_LAUNCH_TEST_ERR on stderr, in odd pieces, then exit 0
		report("leader")
		emit(os.Stdout, os.Getenv("FM_LAUNCH_TEST_OUT"))
		emit(os.Stderr, os.Getenv("FM_LAUNCH_TEST_ERR"))
	case "close-stdout": // closes stdout at once, then writes stderr and exits 0 a little later
		report("leader")
		os.Stdout.Close()
		time.Sleep(200 * time.Millisecond)
		os.Stderr.WriteString("bye")
	case "term-child": // obeys TERM itself, leaves a TERM-ignoring child, waits
		spawn("child", true, false, false, "child")
		report("leader")
		time.Sleep(time.Hour)
	case "spawn-and-exit": // leaves a live child in its group, exits
		spawn("child", false, false, false, "child")
		report("leader")
	case "child":
		if os.Getenv(envIgnoreTerm) == "1" {
			signal.Ignore(syscall.SIGTERM)
		}
		report(os.Getenv(envRole))
		time.Sleep(time.Hour)
	case "await-joiner": // reports, waits until a foreign process joined its group, exits
		report("leader")
		for {
			if _, err := os.Stat(filepath.Join(os.Getenv(envReport), "joiner")); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		fmt.Print("ok")
	case "joiner": // joins the group of the reported leader, then lingers
		leader := awaitReport("leader")
		if err := syscall.Setpgid(0, leader); err != nil {
			return 1
		}
		report("joiner")
		time.Sleep(time.Hour)
	case "cleaner": // leads a group; once <report>/go exists runs Cleanup of all records, writes its error code to <report>/result
		report("cleaner")
		for {
			if _, err := os.Stat(filepath.Join(os.Getenv(envReport), "go")); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		_, err := Cleanup(os.Getenv(envRecords), func(Record) bool { return true })
		if err := os.WriteFile(filepath.Join(os.Getenv(envReport), "result"), []byte(errcode.Of(err)), 0o600); err != nil {
			return 1
		}
	case "quick":
	case "one-byte": // reads one byte of stdin, then exits 0
		_, _ = os.Stdin.Read(make([]byte, 1))
	case "close-stdin": // closes stdin at once, then exits 0 a little later
		os.Stdin.Close()
		time.Sleep(50 * time.Millisecond)
	case "clone-parent": // starts a sibling (CLONE_PARENT) that sleeps, prints its pid
		c := exec.Command("sleep", "60")
		c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_PARENT}
		if c.Start() != nil {
			return 1
		}
		fmt.Print(c.Process.Pid)
	case "host":
		return hostMain()
	case "watch-limit":
		return watchLimitHost()
	case "hostile-caller":
		return hostileCaller()
	default:
		return 2
	}
	return 0
}

func exe() string {
	p, err := os.Executable()
	if err != nil {
		panic(err)
	}
	return p
}

// report publishes the calling process's exact identity as <report>/<role>.
func report(role string) {
	dir := os.Getenv(envReport)
	st, err := procstat.Read(os.Getpid())
	if err != nil {
		panic(err)
	}
	tmp := filepath.Join(dir, "."+role)
	data := fmt.Sprintf("%d %d", os.Getpid(), st.Start)
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		panic(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, role)); err != nil {
		panic(err)
	}
}

// awaitReport waits for <report>/<role> and returns the pid in it.
func awaitReport(role string) int {
	for {
		b, err := os.ReadFile(filepath.Join(os.Getenv(envReport), role))
		if err == nil {
			var pid int
			var start uint64
			fmt.Sscanf(string(b), "%d %d", &pid, &start)
			return pid
		}
		time.Sleep(time.Millisecond)
	}
}

// spawn starts the test binary in mode as a child of the caller and, for mode
// "child", waits until it has reported as role.
func spawn(role string, ignoreTerm, setsid, keepStdout bool, mode string) int {
	env := []string{envMode + "=" + mode, envReport + "=" + os.Getenv(envReport), envRole + "=" + role, noRaceExitSleep}
	if ignoreTerm {
		env = append(env, envIgnoreTerm+"=1")
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		panic(err)
	}
	defer null.Close()
	out := null
	if keepStdout {
		out = os.Stdout
	}
	p, err := os.StartProcess(exe(), []string{exe()}, &os.ProcAttr{
		Env: env, Files: []*os.File{null, out, null},
		Sys: &syscall.SysProcAttr{Setsid: setsid},
	})
	if err != nil {
		panic(err)
	}
	if mode == "child" {
		for {
			if _, err := os.Stat(filepath.Join(os.Getenv(envReport), role)); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	return p.Pid
}

// checkOwnRecord verifies, from the entrypoint's side, that its owner record
// was durably published before package code ran [GRP-1].
func checkOwnRecord() error {
	records := os.Getenv(envRecords)
	recs, err := List(records)
	if err != nil || len(recs) != 1 {
		return fmt.Errorf("want exactly one record, got %d (%v)", len(recs), err)
	}
	r := recs[0]
	me, err := procstat.Read(os.Getpid())
	if err != nil {
		return err
	}
	boot, _ := BootID()
	switch {
	case r.Phase != PhaseGroup:
		return fmt.Errorf("phase %q", r.Phase)
	case *r.GroupPID != os.Getpid() || me.PGID != os.Getpid():
		return fmt.Errorf("group %d, pid %d, pgid %d", *r.GroupPID, os.Getpid(), me.PGID)
	case *r.Leader != Identity{PID: os.Getpid(), StartTime: me.Start, BootID: boot}:
		return fmt.Errorf("leader %+v", *r.Leader)
	case r.SessionID == nil || *r.SessionID != me.SID || me.SID == os.Getpid():
		return fmt.Errorf("session %v, own session %d, pid %d", r.SessionID, me.SID, os.Getpid())
	case r.Host.PID != os.Getppid() || !r.HostLive:
		return fmt.Errorf("host %+v, parent %d, live %v", r.Host, os.Getppid(), r.HostLive)
	case r.ExtensionID != testOwner.ExtensionID || r.BindingDigest != testOwner.BindingDigest ||
		r.RequestID != testOwner.RequestID || r.SourceID != testOwner.SourceID || r.Operation != testOwner.Operation:
		return fmt.Errorf("owner fields %+v", r)
	case time.Since(time.Unix(r.CreatedAt, 0)) > time.Minute:
		return fmt.Errorf("created_at %d", r.CreatedAt)
	}
	raw, err := os.ReadFile(r.Path)
	if err != nil {
		return err
	}
	canon, _ := strictjson.Canonical(&r)
	if !bytes.Equal(raw, canon) {
		return fmt.Errorf("record is not canonical: %s", raw)
	}
	for _, key := range []string{"schema", "phase", "group_pid", "leader", "host", "extension_id", "binding_digest", "request_id", "source_id", "operation", "created_at", "pid", "start_time", "boot_id", "session_id"} {
		if !bytes.Contains(raw, []byte(`"`+key+`":`)) {
			return fmt.Errorf("record lacks %q", key)
		}
	}
	for path, want := range map[string]os.FileMode{r.Path: 0o600, records: 0o700 | os.ModeDir} {
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode() != want {
			return fmt.Errorf("%s: mode %v, want %v (%v)", path, fi.Mode(), want, err)
		}
	}
	return nil
}

// reportChildren publishes the exact identities of the host's children (the
// barrier) as <report>/host-children, so the test can reap them once they are
// orphans.
func reportChildren() {
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	var lines []string
	for _, task := range tasks {
		b, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			if st, err := procstat.Read(pid); err == nil {
				lines = append(lines, fmt.Sprintf("%d %d", pid, st.Start))
			}
		}
	}
	os.WriteFile(filepath.Join(os.Getenv(envReport), "host-children"), []byte(strings.Join(lines, "\n")), 0o600)
}

// hostMain is a tiny fm host: it runs one invocation with ctx cancelled on
// SIGTERM/SIGINT, prints "ok" or the error code, and exits 3 on error. With
// envCrash it SIGKILLs itself at that step of Run.
func hostMain() int {
	if crash := os.Getenv(envCrash); crash != "" {
		crashHook = func(s string) {
			if s == crash {
				reportChildren()
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				time.Sleep(time.Hour)
			}
		}
	}
	timeout := 30 * time.Second
	if ms, err := strconv.Atoi(os.Getenv(envTimeout)); err == nil {
		timeout = time.Duration(ms) * time.Millisecond
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	reportDir, records := os.Getenv(envReport), os.Getenv(envRecords)
	s := Spec{
		Path: exe(), Verb: "invoke", Dir: reportDir,
		Env:         entryEnv(os.Getenv(envEntry), reportDir, records),
		StdoutLimit: 65536, StderrLimit: 8192, Timeout: timeout,
		Records: records, Owner: testOwner,
	}
	if prog := os.Getenv(envProgram); prog != "" {
		// Another program, with argv [prog, "1000"] (sleep 1000).
		s.Path, s.Argv, s.Env = prog, []string{prog, "1000"}, []string{"PATH=/usr/bin:/bin"}
		if os.Getenv(envHow) == "fd" {
			f, err := os.Open(prog)
			if err != nil {
				fmt.Print(err)
				return 3
			}
			defer f.Close()
			s.Exec = f
		}
	}
	_, err := Run(ctx, s)
	if err != nil {
		fmt.Print(errcode.Of(err))
		return 3
	}
	fmt.Print("ok")
	return 0
}

// hostileCaller is a careless caller of fm: it leaves descriptor 9 open
// without close-on-exec (the `exec 9>lock; flock -n 9` idiom), ignores
// SIGPIPE, SIGHUP and SIGUSR2, blocks SIGUSR1 and SIGWINCH, sets umask 0 and
// a soft RLIMIT_NOFILE of 200, then becomes a host (mode "host") by execve.
func hostileCaller() int {
	runtime.LockOSThread() // the blocked mask is this thread's, kept by execve
	fd, err := unix.Open(filepath.Join(os.Getenv(envReport), "serve.lock"), unix.O_RDWR|unix.O_CREAT, 0o600)
	if err != nil || unix.Dup2(fd, 9) != nil { // dup2's new descriptor is not close-on-exec
		return 4
	}
	signal.Ignore(syscall.SIGPIPE, syscall.SIGHUP, syscall.SIGUSR2)
	var set unix.Sigset_t
	for _, sig := range []unix.Signal{unix.SIGUSR1, unix.SIGWINCH} {
		set.Val[(sig-1)/64] |= 1 << ((uint(sig) - 1) % 64)
	}
	if unix.PthreadSigmask(unix.SIG_BLOCK, &set, nil) != nil {
		return 4
	}
	syscall.Umask(0)
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil || lim.Max < 200 {
		return 4
	}
	// syscall.Setrlimit, so that the execve below keeps 200.
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: 200, Max: lim.Max}) != nil {
		return 4
	}
	env := append([]string{envMode + "=host"}, slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, envMode+"=") })...)
	syscall.Exec(exe(), []string{exe()}, env)
	return 4
}

// emit writes n (decimal) bytes of a position-dependent pattern to f, in
// pieces of 1, 7, 4093, 32769, ... bytes, so the reader's chunks never line
// up with the writes.
func emit(f *os.File, n string) {
	total, _ := strconv.Atoi(n)
	sizes := []int{1, 7, 4093, 32769, 11}
	for i, k := 0, 0; i < total; k++ {
		m := min(sizes[k%len(sizes)], total-i)
		f.Write(pattern(i, m))
		i += m
	}
}

// pattern is bytes off..off+n of the pattern emit writes.
func pattern(off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + (off+i)%23)
	}
	return b
}

// describeStdin says, from inside the entrypoint, whether descriptor 0 is a
// pipe, and how many bytes it reads from it to end of file, with their
// SHA-256.
func describeStdin() string {
	var st unix.Stat_t
	if err := unix.Fstat(0, &st); err != nil {
		return "fstat: " + err.Error()
	}
	in, err := io.ReadAll(os.Stdin)
	return fmt.Sprintf("fifo=%t n=%d sha256=%x err=%v", st.Mode&unix.S_IFMT == unix.S_IFIFO, len(in), sha256.Sum256(in), err)
}
