// Package barrier is the launch barrier [GRP-1]: the hidden mode in which fm
// (or a test binary) re-executed by the host parks in its new process group
// until released, then becomes the entrypoint by execve.
//
// It is its own package, importing only os, strconv, syscall and unsafe,
// because a barrier is started twice for every call and its start-up is on
// the path of every call: Go initialises the packages of a program one at a
// time, each time the first in import-path order whose imports are all
// initialised, so a package that needs only os runs its init right after os,
// before the dozens of packages (reflect, unicode, crypto, JSON,
// golang.org/x/sys/unix and all that waits for them) that the rest of fm
// needs and a barrier never uses. For the same reason the few kernel numbers
// the syscall package does not export are constants here.
// TestBarrierStartsBeforeTheRestOfFm (internal/launch) keeps it that way; the
// figures are in docs/performance.md, "Ninth pass".
package barrier

import (
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

// Arg is the hidden argv[1] that makes fm (or a test binary) act as the
// launch barrier for [exe, Arg, entrypoint, verb].
const Arg = "__fm-launch-barrier"

// ArgvArg is the hidden argv[1] of a barrier for an explicit argv:
// [exe, ArgvArg, path, argv...] execve's path with argv.
const ArgvArg = "__fm-launch-barrier-argv"

// FdArg is the hidden argv[1] of a barrier for an open entrypoint:
// [exe, FdArg, path, argv...] executes the open file at descriptor ExecFd
// (path only names it) with argv.
const FdArg = "__fm-launch-barrier-fd"

// Descriptors of a barrier: its end of the release socket (a stream socket
// pair, which the host reads end of file from once the barrier's end is
// closed: at the execve, which closes it, or at the barrier's exit), and for
// FdArg the open entrypoint, and for a confined barrier its Landlock
// ruleset.
const (
	ReleaseFd = 3
	ExecFd    = 4
	RulesetFd = 5
)

// Confined, appended to argv[1] (Arg, ArgvArg or FdArg), makes the barrier
// restrict itself with the Landlock ruleset at RulesetFd right before its
// execve [CONF-4]; it never executes anything unrestricted then.
const Confined = "+confined"

// scriptFd is where the entrypoint's descriptor sits when it is executed: a
// script's interpreter is handed the name "/dev/fd/3" and opens it there, so
// the descriptor stays open (not close-on-exec) for a script, and only for a
// script.
const scriptFd = 3

// ReleaseByte is the one byte the host writes to release the barrier.
const ReleaseByte = 'G'

// EntrypointUmask is the file mode creation mask every entrypoint starts with
// (see "What the package inherits" in docs/architecture.md): whatever umask
// the caller of fm had, a package creates private files.
const EntrypointUmask = 0o077

// RuntimeEnv is the entry the host puts first in a barrier's environment
// (see Env) and the barrier takes out again before any execve: the
// entrypoint gets exactly its own environment.
//
// It runs the barrier's Go runtime on one P. With two, every goroutine the
// runtime starts at start-up (the sweeper, the scavenger, the forced-GC
// helper) finds the other P idle and wakes or starts a thread for it, and a
// parked barrier is four or five threads; on one P they wait until the main
// goroutine blocks reading the release socket, and it is three or four. execve
// ends only once every other thread of the process has run to its exit, and
// on a loaded machine each waits its turn for a CPU. A barrier released at once
// onto a static exit, under two busy loops on two cores: 22–23 → 10–18 ms;
// quiet 8.1–8.4 → 7.7 ms, with 10–20 % less CPU (docs/performance.md,
// "Ninth pass"). The runtime reads the first GOMAXPROCS entry, so an
// entrypoint's own (kept for it, see environ) does not apply to the barrier.
const RuntimeEnv = "GOMAXPROCS=1"

// Env is the environment of a barrier for an entrypoint whose exact
// environment is env: RuntimeEnv, then env.
func Env(env []string) []string { return append([]string{RuntimeEnv}, env...) }

// Exit statuses of a barrier that never became the entrypoint.
const (
	NotReleased   = 125 // no release byte: the host died or gave up
	ExecFailed    = 127 // execve of the entrypoint failed
	ConfineFailed = 123 // the kernel refused the ruleset: nothing was executed
)

// init runs the barrier as soon as os is initialised (see the package
// comment). Package initialisation runs on the program's startup thread with
// the main goroutine wired to it (the runtime's documented rule, see
// runtime.LockOSThread), so the signal mask the barrier sets is the one of
// the thread that calls execve; locking the thread again would only start
// the runtime's template thread, one more thread for execve to wait for.
func init() { Maybe() }

// Maybe is the barrier's entry. This package's init already calls it, so
// every program that imports the package acts as the barrier when
// os.Args[1] is Arg, ArgvArg or FdArg; a later call returns at once. In
// barrier mode it never returns.
//
// The barrier is the process the host starts in a new process group: argv is
// [exe, Arg, entrypoint, verb], its environment is Env of the entrypoint's,
// its working directory already the entrypoint's, and descriptor 3 is its
// end of the release socket. It blocks reading that descriptor. Only the
// exact release byte (which the host writes after the group's owner record
// is published) makes it execve the entrypoint with argv [entrypoint, verb]
// and its exact environment (the barrier's without RuntimeEnv); execve keeps
// its pid, process group and start time, so the recorded leader identity is
// the entrypoint's. End of file (the host died: nobody else holds
// the host's end) or any other byte makes it exit 125 without running package
// code. Its end of the socket is closed by the execve (close on exec) and by
// nothing before: that end of file tells the host the entrypoint runs. There is no shell, no PATH search and no generated source. ArgvArg
// execve's path with exactly the argv that follows it.
//
// FdArg runs with the open, verified entrypoint as descriptor 4: the release
// executes that very file through its descriptor (execveat, see execveat),
// never a name looked up again [INV-1].
//
// Before any execve the barrier clears what the caller of fm could pass on
// (see clean): every descriptor but 0, 1 and 2 (and a script's own, see
// scriptFd) is closed on exec, the controlling terminal is given up, every
// signal is reset to its default action and unblocked, and the umask is
// EntrypointUmask [INV-2], [INV-3].
//
// With Confined appended to its mode, the barrier then sets no-new-privileges
// and restricts itself with the ruleset at RulesetFd (see confine) on the
// thread that calls execve; a refusal of either exits ConfineFailed.
func Maybe() {
	if len(os.Args) < 2 {
		return
	}
	mode, confined := os.Args[1], false
	if n := len(mode) - len(Confined); n > 0 && mode[n:] == Confined {
		mode, confined = mode[:n], true
	}
	if mode != Arg && mode != ArgvArg && mode != FdArg {
		return
	}
	os.Exit(run(mode, confined))
}

func run(mode string, confined bool) int {
	var path string
	var argv []string
	switch {
	case mode == Arg && len(os.Args) == 4:
		path, argv = os.Args[2], []string{os.Args[2], os.Args[3]}
	case mode != Arg && len(os.Args) >= 4:
		// ArgvArg or FdArg: exactly that argv.
		path, argv = os.Args[2], os.Args[3:]
	default:
		return NotReleased
	}
	// A barrier started without RuntimeEnv first (by anything but Env) is
	// refused like a malformed argv: the entrypoint's environment could not
	// be told from what was added to it.
	env, err := environ()
	if err != nil || len(env) == 0 || env[0] != RuntimeEnv {
		return NotReleased
	}
	env = env[1:]
	var b [1]byte
	for {
		n, err := syscall.Read(ReleaseFd, b[:])
		if err == syscall.EINTR {
			continue
		}
		if n != 1 || b[0] != ReleaseByte {
			return NotReleased
		}
		break
	}
	if mode != FdArg {
		if clean(ReleaseFd) != nil {
			return ExecFailed
		}
		if confined && restrict() != nil {
			return ConfineFailed
		}
		_ = syscall.Exec(path, argv, env)
		return ExecFailed
	}
	// The host starts the package's bound when the barrier's end of the
	// release socket closes, which must be the execve itself (close on
	// exec): keep a copy out of scriptFd's way.
	if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, ReleaseFd, syscall.F_DUPFD_CLOEXEC, ExecFd+1); e != 0 {
		return ExecFailed
	}
	script, err := isScript(ExecFd)
	if err != nil || syscall.Dup3(ExecFd, scriptFd, 0) != nil {
		return ExecFailed
	}
	keep := scriptFd // the first descriptor closed on exec
	if script {
		keep = scriptFd + 1
	}
	if clean(keep) != nil {
		return ExecFailed
	}
	if confined && restrict() != nil {
		return ConfineFailed
	}
	execveat(scriptFd, argv, env)
	return ExecFailed
}

// sysLandlockRestrictSelf is landlock_restrict_self's number, the same on
// every architecture that has it; prNoNewPrivs is the kernel's
// PR_SET_NO_NEW_PRIVS.
const (
	sysLandlockRestrictSelf = 446
	prNoNewPrivs            = 38
)

// restrict sets no-new-privileges (Landlock requires it of a process without
// CAP_SYS_ADMIN, and a setuid program the package runs then gains nothing),
// takes every capability out of reach of the program executed (see
// dropCapabilities) and applies the ruleset at RulesetFd to the calling
// thread, the one that calls execve: the runtime's other threads end at the
// execve, so the program executed is restricted from its first instruction.
// The ruleset's descriptor is closed: the package does not get it.
func restrict() error {
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, prNoNewPrivs, 1, 0, 0, 0, 0); e != 0 {
		return e
	}
	if err := dropCapabilities(); err != nil {
		return err
	}
	if _, _, e := syscall.RawSyscall(sysLandlockRestrictSelf, RulesetFd, 0, 0); e != 0 {
		return e
	}
	return syscall.Close(RulesetFd)
}

// Kernel numbers for dropCapabilities: PR_CAPBSET_DROP, PR_CAP_AMBIENT and
// its PR_CAP_AMBIENT_CLEAR_ALL, and the highest capability number a kernel
// may know (CAP_LAST_CAP is 40 on Linux 6.x; the rest are refused, EINVAL).
const (
	prCapbsetDrop        = 24
	prCapAmbient         = 47
	prCapAmbientClearAll = 4
	lastCap              = 63
)

// dropCapabilities empties the bounding and ambient sets of the calling
// thread, so the program it executes has no capability, whatever its uid: a
// confined package run by root would otherwise keep root's capabilities
// past Landlock, and CAP_SYS_ADMIN or CAP_PERFMON alone let it read
// /proc/<pid>/environ and maps of processes outside its domain (fm's
// environment, the caller's), besides loading modules or using raw
// sockets. Without CAP_SETPCAP (a user other than root) the bounding set
// cannot be changed and needs no change: with no-new-privileges such a
// process gains no capability at execve. A uid 0 that cannot drop them is
// refused.
func dropCapabilities() error {
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, prCapAmbient, prCapAmbientClearAll, 0, 0, 0, 0); e != 0 && e != syscall.EINVAL {
		return e
	}
	for c := uintptr(0); c <= lastCap; c++ {
		_, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, prCapbsetDrop, c, 0, 0, 0, 0)
		switch {
		case e == syscall.EINVAL:
			return nil // past the kernel's last capability
		case e == syscall.EPERM && syscall.Geteuid() != 0:
			return nil
		case e != 0:
			return e
		}
	}
	return nil
}

// environ returns the barrier's environment exactly as execve passed it, from
// /proc/self/environ (NUL-terminated entries). syscall.Environ (and so
// os.Environ) would not do: it drops every later entry of a name, such as an
// entrypoint's own GOMAXPROCS behind RuntimeEnv, and every empty entry. The
// file is read with plain system calls: os would start the runtime's poller,
// one more epoll watch of the user's, which at fs.epoll.max_user_watches
// kills the barrier (TestWatchesAtUserLimit).
func environ() ([]string, error) {
	fd, err := syscall.Open("/proc/self/environ", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	block := make([]byte, 0, 4096)
	for {
		if len(block) == cap(block) {
			block = append(block, 0)[:len(block)]
		}
		n, err := syscall.Read(fd, block[len(block):cap(block)])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
		block = block[:len(block)+n]
	}
	var env []string
	for len(block) > 0 {
		i := 0
		for i < len(block) && block[i] != 0 {
			i++
		}
		env = append(env, string(block[:i]))
		block = block[min(i+1, len(block)):]
	}
	return env, nil
}

// atEmptyPath is the kernel's AT_EMPTY_PATH (the same on every Linux
// architecture), which the syscall package does not export.
const atEmptyPath = 0x1000

// execveat executes the open file fd with argv and env:
// execveat(fd, "", argv, env, AT_EMPTY_PATH). The kernel names a script to
// its interpreter "/dev/fd/<fd>" (so fd must stay open across the exec for a
// script), and the new program's name (comm) is the file's own.
//
// Go raises the soft RLIMIT_NOFILE of its own process at start and gives
// the original back only to programs it starts itself: syscall.Exec restores
// it before its execve, and does so even when that execve fails. A raw
// execveat does not, so syscall.Exec of "" (which fails at once, ENOENT)
// is called first for exactly that restore: the entrypoint gets the soft
// limit of fm's caller, as a program fm executed by name would.
func execveat(fd int, argv, env []string) {
	_ = syscall.Exec("", nil, nil)
	empty, err := syscall.BytePtrFromString("")
	if err != nil {
		return
	}
	argvp, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		return
	}
	envp, err := syscall.SlicePtrFromStrings(env)
	if err != nil {
		return
	}
	_, _, _ = syscall.Syscall6(sysExecveat, uintptr(fd), uintptr(unsafe.Pointer(empty)),
		uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envp[0])), atEmptyPath, 0)
}

// isScript reports whether the open file fd starts with "#!": the kernel
// then runs its interpreter, which must be able to open the file by its
// descriptor's name.
func isScript(fd int) (bool, error) {
	var b [2]byte
	n, err := syscall.Pread(fd, b[:], 0)
	if err != nil {
		return false, err
	}
	return n == 2 && b[0] == '#' && b[1] == '!', nil
}

// clean makes every descriptor from first on close-on-exec, gives up the
// controlling terminal, resets every signal to its default action, unblocks
// every signal of the calling thread and sets the umask, so the program the
// barrier executes inherits nothing of them from fm's caller.
func clean(first int) error {
	if err := cloexecFrom(first); err != nil {
		return err
	}
	detachTerminal()
	dfl := kernelSigaction{} // handler SIG_DFL, no flags, empty mask
	for sig := 1; sig <= 64; sig++ {
		if sig == int(syscall.SIGKILL) || sig == int(syscall.SIGSTOP) {
			continue
		}
		// Numbers the kernel refuses (none on Linux) need no reset.
		_, _, _ = syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0)
	}
	var none uint64 // the kernel's 64-signal set, empty
	if _, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, sigSetmask, uintptr(unsafe.Pointer(&none)), 0, 8, 0, 0); e != 0 {
		return e
	}
	syscall.Umask(EntrypointUmask)
	return nil
}

// sigSetmask is the kernel's SIG_SETMASK, the same on every architecture
// this package builds for (the sysnum files; MIPS, where it differs, is not
// one of them).
const sigSetmask = 2

// detachTerminal gives up, for this process only, the controlling terminal
// of fm's session (an operator's terminal): TIOCNOTTY by a process that does
// not lead its session clears its own terminal and nothing else, keeping its
// session and process group ([GRP-3] records them). Not leading a session,
// neither it nor any descendant can acquire a terminal again, so the package
// cannot open /dev/tty to write to the operator's terminal past fm's
// escaping, push input into the operator's shell (TIOCSTI) or be stopped
// reading it. Without a controlling terminal (ENXIO) there is nothing to give
// up.
func detachTerminal() {
	fd, err := syscall.Open("/dev/tty", syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCNOTTY, 0)
	syscall.Close(fd)
}

// kernelSigaction has the size of the kernel's struct sigaction on 64-bit
// Linux (and more than on 32-bit); only its zero value is ever passed, which
// is SIG_DFL with no flags and an empty mask whatever the field order of an
// architecture.
type kernelSigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

// Numbers of close_range (Linux 5.11+; the same on every architecture) and
// its CLOSE_RANGE_CLOEXEC flag, which the syscall package does not export.
const (
	sysCloseRange     = 436
	closeRangeCloexec = 1 << 2
)

// cloexecFrom marks every descriptor from first on close-on-exec:
// close_range(CLOSE_RANGE_CLOEXEC) (Linux 5.11+), else each descriptor listed
// in /proc/self/fd. They are not closed now: the Go runtime may hold some of
// them until the execve.
func cloexecFrom(first int) error {
	if _, _, e := syscall.Syscall(sysCloseRange, uintptr(first), ^uintptr(0), closeRangeCloexec); e == 0 {
		return nil
	}
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, name := range names {
		if fd, err := strconv.Atoi(name); err == nil && fd >= first {
			_, _, _ = syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_SETFD, syscall.FD_CLOEXEC)
		}
	}
	return nil
}
