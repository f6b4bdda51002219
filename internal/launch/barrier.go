package launch

import (
	"os"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BarrierArg is the hidden argv[1] that makes fm (or a test binary) act as the
// launch barrier [GRP-1].
const BarrierArg = "__fm-launch-barrier"

// barrierArgvArg is the hidden argv[1] of a barrier for a Spec with Argv:
// [exe, barrierArgvArg, path, argv...] execve's path with argv.
const barrierArgvArg = "__fm-launch-barrier-argv"

// barrierFdArg is the hidden argv[1] of a barrier for a Spec with Exec:
// [exe, barrierFdArg, path, argv...] executes the open file at descriptor
// execFd (path only names it) with argv.
const barrierFdArg = "__fm-launch-barrier-fd"

// Descriptors of a barrier: the release pipe's read end, and for a Spec with
// Exec the open entrypoint.
const (
	releaseFd = 3
	execFd    = 4
)

// scriptFd is where the entrypoint's descriptor sits when it is executed: a
// script's interpreter is handed the name "/dev/fd/3" and opens it there, so the descriptor stays open (not close-on-exec) for a script, and
// only for a script.
const scriptFd = 3

// releaseByte is the one byte the host writes to release the barrier.
const releaseByte = 'G'

// EntrypointUmask is the file mode creation mask every entrypoint starts with
// (see "What the package inherits" in docs/architecture.md): whatever umask
// the caller of fm had, a package creates private files.
const EntrypointUmask = 0o077

// Exit statuses of a barrier that never became the entrypoint.
const (
	barrierNotReleased = 125 // no release byte: the host died or gave up
	barrierExecFailed  = 127 // execve of the entrypoint failed
)

// init runs the barrier before the rest of the program initialises: the
// launch barrier is on the path of every invocation, and the Go specification
// initialises the packages of a program in import-path order as far as their
// dependencies allow, so this package's init runs right after its few
// dependencies and before the packages that compile regular expressions or
// build tables at start-up (manifest, protocol, binding, cli, ...): those are
// never initialised in a barrier. Measured in docs/performance.md.
func init() { MaybeBarrier() }

// MaybeBarrier is the launch barrier's entry. This package's init already
// calls it, so every program that imports launch acts as the barrier when
// os.Args[1] is BarrierArg; main() and TestMain call it as well, first, to
// say so. If os.Args[1] is BarrierArg it runs the barrier and never returns;
// otherwise it returns at once.
//
// The barrier is the process Run starts in a new process group: argv is
// [exe, BarrierArg, entrypoint, verb], its environment and working directory
// are already the entrypoint's, and descriptor 3 is the read end of the
// release pipe. It blocks reading that descriptor. Only the exact release byte
// (which the host writes after the group's owner record is published) makes it
// execve the entrypoint with argv [entrypoint, verb] and its own environment;
// execve keeps its pid, process group and start time, so the recorded leader
// identity is the entrypoint's. End of file (the host died: nobody else holds
// the write end) or any other byte makes it exit 125 without running package
// code. There is no shell, no PATH search and no generated source. A Spec with
// Argv starts the barrier as [exe, barrierArgvArg, path, argv...] instead,
// and the release execve's path with exactly argv.
//
// A Spec with Exec starts it as [exe, barrierFdArg, path, argv...] with the
// open, verified entrypoint as descriptor 4: the release executes that very
// file through its descriptor (execveat, see execveat), never a name looked
// up again [INV-1].
//
// Before any execve the barrier clears what the caller of fm could pass on
// (see clean): every descriptor but 0, 1 and 2 (and a script's own, see
// scriptFd) is closed on exec, the controlling terminal is given up, every signal is reset to its default action
// and unblocked, and the umask is EntrypointUmask [INV-2], [INV-3].
func MaybeBarrier() {
	if len(os.Args) < 2 || (os.Args[1] != BarrierArg && os.Args[1] != barrierArgvArg && os.Args[1] != barrierFdArg) {
		return
	}
	os.Exit(barrier())
}

func barrier() int {
	var path string
	var argv []string
	switch {
	case os.Args[1] == BarrierArg && len(os.Args) == 4:
		path, argv = os.Args[2], []string{os.Args[2], os.Args[3]}
	case os.Args[1] != BarrierArg && len(os.Args) >= 4:
		// A Spec with Argv or Exec: exactly that argv.
		path, argv = os.Args[2], os.Args[3:]
	default:
		return barrierNotReleased
	}
	var b [1]byte
	for {
		n, err := unix.Read(releaseFd, b[:])
		if err == unix.EINTR {
			continue
		}
		if n != 1 || b[0] != releaseByte {
			return barrierNotReleased
		}
		break
	}
	// The signal mask is per thread, and execve keeps the calling thread's.
	runtime.LockOSThread()
	if os.Args[1] != barrierFdArg {
		if clean(releaseFd) != nil {
			return barrierExecFailed
		}
		_ = syscall.Exec(path, argv, os.Environ())
		return barrierExecFailed
	}
	script, err := isScript(execFd)
	if err != nil || unix.Dup3(execFd, scriptFd, 0) != nil {
		return barrierExecFailed
	}
	keep := scriptFd // the first descriptor closed on exec
	if script {
		keep = scriptFd + 1
	}
	if clean(keep) != nil {
		return barrierExecFailed
	}
	execveat(scriptFd, argv, os.Environ())
	return barrierExecFailed
}

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
	_, _, _ = unix.Syscall6(unix.SYS_EXECVEAT, uintptr(fd), uintptr(unsafe.Pointer(empty)),
		uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envp[0])), unix.AT_EMPTY_PATH, 0)
}

// isScript reports whether the open file fd starts with "#!": the kernel
// then runs its interpreter, which must be able to open the file by its
// descriptor's name.
func isScript(fd int) (bool, error) {
	var b [2]byte
	n, err := unix.Pread(fd, b[:], 0)
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
		if sig == int(unix.SIGKILL) || sig == int(unix.SIGSTOP) {
			continue
		}
		// Numbers the kernel refuses (none on Linux) need no reset.
		_, _, _ = unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0)
	}
	var none unix.Sigset_t
	if err := unix.PthreadSigmask(unix.SIG_SETMASK, &none, nil); err != nil {
		return err
	}
	unix.Umask(EntrypointUmask)
	return nil
}

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
	fd, err := unix.Open("/dev/tty", unix.O_RDWR|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_ = unix.IoctlSetInt(fd, unix.TIOCNOTTY, 0)
	unix.Close(fd)
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

// cloexecFrom marks every descriptor from first on close-on-exec:
// close_range(CLOSE_RANGE_CLOEXEC) (Linux 5.11+), else each descriptor listed
// in /proc/self/fd. They are not closed now: the Go runtime may hold some of
// them until the execve.
func cloexecFrom(first int) error {
	if unix.CloseRange(uint(first), ^uint(0), unix.CLOSE_RANGE_CLOEXEC) == nil {
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
			_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
		}
	}
	return nil
}
