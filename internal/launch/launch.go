// Package launch runs one extension invocation in its own process group and
// proves that group gone afterwards (CONTRACT §7.3 [INV-2]..[INV-5], §8
// [GRP-1]..[GRP-5]).
//
// # Launch [GRP-1], [INV-2], [INV-3]
//
// Run first publishes <Records>/<hex>.owner.json in phase "reserved", then
// starts the launch barrier: the running executable (/proc/self/exe)
// re-executed as [exe, BarrierArg, entrypoint, verb] in a new process group
// (pgid = its pid), with the entrypoint's exact environment and working
// directory, three pipes for stdio and its end of a release socket as
// descriptor 3. Run reads the barrier's exact identity (pid, start time from
// /proc/<pid>/stat, boot id), rewrites the record in phase "group" with that
// leader and group, and only then writes the release byte; the barrier then
// execve's the entrypoint with argv [entrypoint, verb] (package barrier). So
// no package code ever runs in a group that is not recorded, and a host that
// dies before the release leaves a barrier that exits on end of file. A Spec
// with Exec hands the barrier the entrypoint already open, and the barrier
// executes that descriptor rather than the path [INV-1]; every barrier first
// clears what fm's own caller could pass on (descriptors, signal state,
// umask), see package barrier.
//
// Prepare and Pending split Run at the release, so a host can overlap the
// start-up of a barrier (a whole fm process) with other work, such as the
// handshake that must precede the invoke; package code still runs only on
// Pending.Run.
//
// # Records and durability
//
// A record is published by writing a temporary file and renaming it into
// place (renameat2(RENAME_EXCHANGE) for the rewrite in phase group), so a
// reader sees a whole record or none; nothing is fsynced. The record has to
// outlive the host process, not the machine, and that is what it does: once
// the rename returns, the record is in the kernel's page cache, which every
// later reader sees and which a process's death, SIGKILL included, does not
// touch. A machine crash is different, and harmless: it ends every process
// group with it, and the next boot has another boot id, so every record it
// left names an extinct boot and Cleanup clears it (the "other boot id" row of
// its table). What a crash can leave that a process death cannot is a record
// file that is empty or torn (it was never written back); to recognise those
// without reading them, a record's name carries the 32 hex digits of the
// boot id it was written in (after its source key, see sourceKey), and
// readers skip, and Cleanup removes, an unreadable record named for another
// boot. Removal is a plain unlink for the
// same reason: a record that reappears after a crash names an earlier boot.
// Dropping the fsyncs (two per record write, one per removal: ten per
// process-event call) took 4 to 10 ms off every call on the reference
// machines; see docs/performance.md.
//
// # Streams and time [INV-4], [INV-5]
//
// Stdin is a pipe holding the request, then end of file (fillStdin). Stdout
// is kept up to StdoutLimit; stderr is only counted, never stored or shown,
// unless the caller asks for it (Spec.Stderr, an operator's direct call):
// then its first StderrLimit bytes are handed to the caller, and still never
// stored. One byte over a limit, the timeout, or cancellation of ctx stops
// the invocation at once. The timeout runs from the execve of the
// entrypoint, which the host sees as the end of file of the release socket
// (see supervise): the time fm takes to get there is not the package's.
//
// # Group cleanup [GRP-2]
//
// Whatever ends the invocation, Run does not return until the exact group is
// proved gone (or reports that it cannot be). The host is a child subreaper,
// so the group's orphans re-parent to it; the leader is kept an unreaped
// zombie while anything else of the group may be alive, which pins the
// group's number, so signals and the /proc membership scan cannot reach
// another group; zombie members that are this process's children are reaped
// by exact pid. The group gets TERM, then KILL after 500 ms, when the
// invocation is stopped early or when anything in it outlives the leader; a
// successful leader whose group is still alive is process-leak. When no
// member is alive the leader is reaped and the kernel is asked through the
// leader's pidfd whether the group still has any process; members that are
// all zombies of some other parent count as gone [GRP-4]. Only then is the
// record removed. If the group cannot be proved gone the result is
// process-cleanup-failed and the record stays.
//
// The common case, a leader that exits on its own and leaves nothing behind,
// takes a fast path without the /proc scan (see stop): when every child of
// this process is one of its invocation leaders, no orphan of the group
// exists, so the leader is reaped at once and the kernel's group probe is
// the whole proof.
//
// The leader's exit is awaited through the runtime's poller on its pidfd, so
// many concurrent invocations (a serve with hundreds of long polls) hold no
// thread each. Several Runs may run at once in one process: each touches only
// its own group, and nothing here ever waits for "any child".
//
// # Recovery [GRP-3]
//
// A record whose host died stays until Cleanup resolves it; see Cleanup for
// the decision table. List and Pins read records without changing anything.
//
// # What is not promised [GRP-5]
//
// A package process that leaves the group (setsid, setpgid) is outside the
// contract: it is never signalled, never claimed killed, and if it keeps the
// invocation's stdout or stderr open after the group is gone, Run reports
// process-leak. No process outside the exact recorded group is ever signalled,
// and ownership is never inferred from command lines or process-table scans.
package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/launch/barrier"
	"firstmate.dev/fm/internal/procstat"
)

// Owner says who an invocation is for; it is written into the owner record.
type Owner struct {
	ExtensionID   string
	BindingDigest string
	RequestID     string
	SourceID      string // "" when the invocation serves no source
	Operation     string
}

// Spec is one invocation of one entrypoint.
type Spec struct {
	// Path is the entrypoint, an absolute path; argv is [Path, Verb].
	Path string
	// Exec, when not nil, is the entrypoint already open: the file whose
	// bytes the host verified. The barrier executes exactly this open file
	// (through its descriptor), never Path, which then only names it in
	// argv[0] [INV-1]. Run does not close it.
	Exec *os.File
	Verb string
	// Dir is the working directory (the package root).
	Dir string
	// DirFile, when not nil, is Dir already open: the directory the host
	// verified. The barrier starts in exactly that directory, entered
	// through its descriptor, so a rename of Dir or of a directory above it
	// between the verification and the start cannot give the package
	// another tree to read relative paths from [INV-1]. Run does not close
	// it.
	DirFile *os.File
	// Ruleset, when not nil, is a Landlock ruleset (package confine): the
	// barrier restricts itself with it right before its execve, and exits
	// barrier.ConfineFailed rather than run anything unrestricted
	// [CONF-4]. Run does not close it.
	Ruleset *os.File
	// Env is the entrypoint's exact environment. Nothing of the host's
	// environment is added; a nil Env is an empty environment. (The barrier
	// itself runs with barrier.RuntimeEnv first, which it takes out.)
	Env   []string
	Stdin []byte
	// StdoutLimit and StderrLimit bound the streams in bytes; one byte more is
	// response-oversized or stderr-oversized, and stops the invocation at once.
	StdoutLimit, StderrLimit int
	// Timeout bounds the invocation from the moment its entrypoint has been
	// executed (timeout) [INV-5]; fm's own barrier gets as long again to
	// get there after the release (else host-resource).
	Timeout time.Duration
	// Running, when set, is called once the entrypoint has been executed:
	// the moment the invocation's bound starts. A host gives back its
	// start-up slot there (Gate).
	Running func()
	// Stderr, when set, is called once the group is proved gone (whatever
	// the outcome, except process-cleanup-failed) with the first
	// StderrLimit bytes the invocation wrote to stderr and the count of all
	// of them. Without it stderr is only counted [INV-4]. It serves an
	// operator's explicit request on a direct call; nothing here stores it.
	Stderr func(kept []byte, total int64)
	// Records is <state>/extension-invocations. It is created 0700 if absent
	// (its parent must exist) and must be a private directory.
	Records string
	Owner   Owner

	// The fields below serve commands that are not extension entrypoints
	// (the process-event core's built-in adapters); an extension invocation
	// leaves them zero.

	// Argv, when not nil, is the whole argv the program at Path is executed
	// with, instead of [Path, Verb]; Verb then only names the invocation in
	// messages. The barrier still execve's Path itself (no PATH search, no
	// shell).
	Argv []string
	// AnswerStatuses are non-zero exit statuses that are an answer rather
	// than a failure: Run returns the Result, with ExitStatus set, as it does
	// for 0.
	AnswerStatuses []int
	// StopLeftovers makes processes of the group that outlive an answering
	// leader no process-leak: they are stopped (TERM, then KILL) and the group
	// is proved gone exactly as always, and the answer stands.
	StopLeftovers bool
}

// Result is a successful invocation's output.
type Result struct {
	Stdout []byte
	// ExitStatus is the entrypoint's exit status: 0, or one of
	// Spec.AnswerStatuses.
	ExitStatus int
}

// pipeGrace is how long Run waits, once the group is proved gone, for stdout
// and stderr to reach end of file. Only a process outside the group can still
// hold them then.
const pipeGrace = time.Second

// crashHook, when set, is called at each step of Run and of its cleanup; nil
// in production. Tests kill the host there (crash injection). The steps are
// "reserve", "reserved", "started", "grouped", "released", "reading",
// "terminating" and "proved".
var crashHook func(step string)

func step(name string) {
	if crashHook != nil {
		crashHook(name)
	}
}

// Run runs s to completion and returns its stdout, or a coded error:
// response-oversized, stderr-oversized, timeout (also when ctx's deadline
// passes), process-failed (non-zero exit, death by signal, or ctx cancelled:
// the host was interrupted), process-leak, or process-cleanup-failed when the
// group could not be proved gone (the record is then kept, and stays a live
// invocation of this host until the host exits). Run returns only after the
// group is proved gone, except in that last case. A records directory that is
// not private is refused before anything starts.
//
// Run makes the calling process a child subreaper (PR_SET_CHILD_SUBREAPER)
// for the rest of its life, so orphans of everything it starts re-parent to
// it; Run reaps only those of its own invocation groups.
//
// Run is Prepare followed by Pending.Run.
func Run(ctx context.Context, s Spec) (*Result, error) {
	p, err := Prepare(ctx, s)
	if err != nil {
		return nil, err
	}
	return p.Run(ctx)
}

// Pending is an invocation prepared up to its release: its owner record is
// published in phase group and its barrier waits, in its own process group,
// for the release byte. No package code has run. Exactly one of Run and
// Abort must follow, from one goroutine; a host that dies first leaves a
// barrier that reads end of file and exits, and a record Cleanup clears.
type Pending struct {
	s    Spec
	dir  *recordDir
	name string
	inv  *invocation
	used bool
}

// Prepare does everything of Run before the release: it publishes the
// reserved record, starts the barrier, reads its identity and publishes the
// record in phase group. It lets a host overlap the start-up of the barrier
// (a whole fm process) with other work, such as revalidating the package or
// running the handshake that must precede the invocation: the package's code
// still runs only on Pending.Run. It first waits until the process catches
// its stop signals (AfterSignals). Its errors are Run's.
func Prepare(ctx context.Context, s Spec) (*Pending, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if !AwaitSignals(ctx) || ctx.Err() != nil {
		return nil, s.interrupted(ctx)
	}
	if err := becomeSubreaper(); err != nil {
		return nil, err
	}
	host, err := selfIdentity()
	if err != nil {
		return nil, err
	}
	boot, err := BootID()
	if err != nil {
		return nil, err
	}
	dir, err := openRecordDir(s.Records, true)
	if err != nil {
		return nil, err
	}
	name, err := newRecordName(s.Owner.SourceID)
	if err != nil {
		dir.close()
		return nil, err
	}
	rec := &Record{
		Schema:        RecordSchema,
		Phase:         PhaseReserved,
		Host:          host,
		ExtensionID:   s.Owner.ExtensionID,
		BindingDigest: s.Owner.BindingDigest,
		RequestID:     s.Owner.RequestID,
		SourceID:      s.Owner.SourceID,
		Operation:     s.Owner.Operation,
		CreatedAt:     time.Now().Unix(),
	}
	step("reserve")
	if err := dir.write(name, rec); err != nil {
		dir.close()
		return nil, err
	}
	step("reserved")

	inv, err := start(s)
	if err != nil {
		// The barrier never ran (a failed start is reaped by the runtime),
		// so the reserved record owns nothing.
		err = firstErr(err, dir.releaseErr(name))
		dir.close()
		return nil, err
	}
	step("started")
	p := &Pending{s: s, dir: dir, name: name, inv: inv}

	st, err := procstat.Read(inv.g.pgid)
	switch {
	case err != nil:
		err = errcode.Wrap(errcode.Internal, err, "read the identity of launch barrier %d", inv.g.pgid)
	case st.PGID != inv.g.pgid:
		err = errcode.New(errcode.Internal, "launch barrier %d is in process group %d, not its own", inv.g.pgid, st.PGID)
	case st.SID == inv.g.pgid:
		err = errcode.New(errcode.Internal, "launch barrier %d leads a session", inv.g.pgid)
	default:
		pgid, sid := inv.g.pgid, st.SID
		rec.Phase, rec.GroupPID, rec.SessionID = PhaseGroup, &pgid, &sid
		rec.Leader = &Identity{PID: pgid, StartTime: st.Start, BootID: boot}
		err = dir.write(name, rec)
	}
	if err != nil {
		return nil, p.abort(err)
	}
	step("grouped")
	return p, nil
}

// Run releases the barrier (unless ctx is already done) and runs the
// invocation to completion, exactly as the package function Run.
func (p *Pending) Run(ctx context.Context) (*Result, error) {
	if p.used {
		return nil, errcode.New(errcode.Internal, "launch: a prepared invocation was run twice")
	}
	var err error
	if ctx.Err() != nil {
		err = p.s.interrupted(ctx)
	} else {
		err = p.inv.release()
	}
	if err != nil {
		return nil, p.abort(err)
	}
	p.used = true
	defer p.dir.close()
	defer p.inv.closePipes()
	step("released")

	cause := p.inv.supervise(ctx, p.s)
	res, err := p.inv.finish(ctx, p.s, cause)
	if errcode.Is(err, errcode.ProcessCleanupFailed) {
		return nil, err // the record stays [GRP-2]
	}
	step("proved")
	if err := firstErr(err, p.dir.releaseErr(p.name)); err != nil {
		return nil, err
	}
	return res, nil
}

// Abort gives up a prepared invocation without releasing it: the barrier
// (no package code has run) is stopped and proved gone, and the record
// removed. It returns process-cleanup-failed (the record then stays) if the
// group cannot be proved gone. After Run it does nothing.
func (p *Pending) Abort() error {
	if p.used {
		return nil
	}
	return p.abort(nil)
}

// abort stops the unreleased group, removes the record and returns cause,
// or the cleanup's error.
func (p *Pending) abort(cause error) error {
	p.used = true
	defer p.dir.close()
	defer p.inv.closePipes()
	// Package code never ran: only the barrier is in the group.
	if _, err := p.inv.stop(true); err != nil {
		return err // the record stays [GRP-2]
	}
	return firstErr(cause, p.dir.releaseErr(p.name))
}

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// becomeSubreaper marks this process a child subreaper. The mark is
// process-wide and stays, so it is made once, by the first launch (a serve
// made the same call hundreds of times a second).
var becomeSubreaper = sync.OnceValue(func() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return errcode.Wrap(errcode.Internal, err, "become a child subreaper")
	}
	return nil
})

func (s *Spec) check() error {
	switch {
	case !filepath.IsAbs(s.Path):
		return errcode.New(errcode.Internal, "launch: entrypoint %q is not an absolute path", s.Path)
	case s.Verb == "" || s.Dir == "":
		return errcode.New(errcode.Internal, "launch: verb and working directory are required")
	case s.Argv != nil && len(s.Argv) == 0:
		return errcode.New(errcode.Internal, "launch: an argv must hold at least the program name")
	case s.StdoutLimit < 0 || s.StderrLimit < 0 || s.Timeout <= 0:
		return errcode.New(errcode.Internal, "launch: stream limits must be >= 0 and the timeout > 0")
	case s.Owner.ExtensionID == "" || s.Owner.BindingDigest == "" || s.Owner.RequestID == "" || s.Owner.Operation == "":
		return errcode.New(errcode.Internal, "launch: owner extension id, binding digest, request id and operation are required")
	}
	return nil
}

// barrierArgv is the barrier's argv: [exe, BarrierArg, Path, Verb], with
// Argv [exe, barrier.ArgvArg, Path, Argv...], and with Exec
// [exe, barrier.FdArg, Path, argv...] where argv is Argv or [Path, Verb];
// with a Ruleset, argv[1] ends in barrier.Confined.
func (s *Spec) barrierArgv() []string {
	argv := s.Argv
	if argv == nil {
		argv = []string{s.Path, s.Verb}
	}
	confined := ""
	if s.Ruleset != nil {
		confined = barrier.Confined
	}
	switch {
	case s.Exec != nil:
		return append([]string{os.Args[0], barrier.FdArg + confined, s.Path}, argv...)
	case s.Argv != nil:
		return append([]string{os.Args[0], barrier.ArgvArg + confined, s.Path}, argv...)
	}
	return []string{os.Args[0], BarrierArg + confined, s.Path, s.Verb}
}

// what names the invocation in messages: never package text.
func (s *Spec) what() string {
	return fmt.Sprintf("extension %s %s (%s)", s.Owner.ExtensionID, s.Owner.Operation, s.Verb)
}

// interrupted is the error for a cancelled ctx: timeout for an expired
// deadline, otherwise process-failed (the host was interrupted).
func (s *Spec) interrupted(ctx context.Context) error {
	cause := context.Cause(ctx)
	if errors.Is(cause, context.DeadlineExceeded) {
		return errcode.Wrap(errcode.Timeout, cause, "%s: stopped at the caller's deadline", s.what())
	}
	return errcode.Wrap(errcode.ProcessFailed, cause, "%s: interrupted by the host", s.what())
}

// forkFault turns the EBADF of a syscall.ForkExec whose child could not place
// its descriptors into the EMFILE it is. The child first moves its error pipe
// just above the highest descriptor in files (and may move a few more after
// it); where that is at or above RLIMIT_NOFILE the kernel refuses it with
// EBADF. Every descriptor in files is open (this process made or holds
// them), so near the limit the only bad descriptor is the one the limit
// forbids: a host fault, never the package's failure.
func forkFault(err error, files []uintptr) error {
	if !errors.Is(err, syscall.EBADF) {
		return err
	}
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil {
		return err
	}
	top := uint64(len(files))
	for _, fd := range files {
		if fd != ^uintptr(0) { // a descriptor the child closes
			top = max(top, uint64(fd))
		}
	}
	if top+1+uint64(len(files)) < lim.Cur {
		return err
	}
	return fmt.Errorf("%w: the launch's descriptors reach the file limit (%d)", syscall.EMFILE, lim.Cur)
}

// invocation is one started barrier/entrypoint and the host's ends of its
// pipes.
type invocation struct {
	g         group
	w         *watcher // reads stdout and stderr, awaits the leader (w.leaderDone)
	rel       int      // the host's end of the release socket; -1 once released or closed
	out, errs *stream
	// stdin is the write end of stdin's pipe while stdinRest, the part of
	// the request that did not fit in the pipe before the fork, is still
	// to be written; nil when it all fit.
	stdin     *os.File
	stdinRest []byte
	stdinDone chan struct{}
}

// fillStdin writes to w, the host's (non-blocking) end of stdin's pipe, as
// much of the request req as the pipe takes now, before the fork. Every
// request fits an empty pipe of the default size (64 KiB, the request bound
// of [INV-4]): w is then closed at once and nil returned, so the launch needs
// no writer and the host keeps no descriptor for it. A smaller pipe (a user
// past fs.pipe-user-pages-soft gets one page per new pipe) leaves a rest: w
// is returned as a File in the runtime's poller with that rest, for
// supervise to write once the package runs. Either way the package reads the
// whole request, then end of file, from a pipe as it always did.
func fillStdin(w int, req []byte) (*os.File, []byte, error) {
	for len(req) > 0 {
		n, err := unix.Write(w, req)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			break
		}
		if err != nil {
			unix.Close(w)
			return nil, nil, err
		}
		req = req[n:]
	}
	if len(req) == 0 {
		return nil, nil, unix.Close(w)
	}
	return os.NewFile(uintptr(w), "|1"), req, nil
}

// selfExe is what the barrier is executed from: the kernel's link to the
// running executable, so the barrier is exactly this binary even if the file
// at its path was replaced (an upgrade) or removed since it started.
const selfExe = "/proc/self/exe"

// start starts the barrier in a new process group.
func start(s Spec) (*invocation, error) {
	// stdin, stdout, stderr, release. Stdin's host end is filled before the
	// fork (see fillStdin); stdout's and stderr's are the watcher's. The
	// release channel is a stream socket pair rather than a pipe: the host
	// writes the release byte into its end, and the barrier's end, which
	// only the barrier holds and which is closed on exec, reads end of file
	// on the host's side at the moment the entrypoint has been executed (or
	// the barrier exited): the watcher watches a copy of the host's end for
	// that (watcher.execd), and the invocation's bound starts there [INV-5].
	// The barrier's ends are bare blocking descriptors, closed here once it
	// has its copies: a File for them would cost a poller registration, a
	// finalizer and the switch back to blocking mode that Fd makes, on each
	// of four channels of every launch.
	host := [4]int{-1, -1, -1, -1}
	child := [4]int{-1, -1, -1, -1}
	closeAll := func(fds []int) {
		for _, fd := range fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}
	for i := range host {
		var p [2]int
		var err error
		if i == 3 {
			p, err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		} else {
			err = unix.Pipe2(p[:], unix.O_CLOEXEC)
		}
		if err == nil {
			// The host's end: the read end of stdout and stderr, which
			// the child writes.
			h := 1
			if i == 1 || i == 2 {
				h = 0
			}
			host[i], child[i] = p[h], p[1-h]
			err = unix.SetNonblock(p[h], true)
		}
		if err != nil {
			closeAll(host[:])
			closeAll(child[:])
			return nil, errcode.Wrap(errcode.Internal, os.NewSyscallError("pipe2", err), "create the pipes and release socket of %s", s.what())
		}
	}
	inv := &invocation{out: newStream(s.StdoutLimit, true), errs: newStream(s.StderrLimit, s.Stderr != nil)}
	w, err := newWatcher(host[1], host[2], host[3], inv.out, inv.errs, func() { step("reading") })
	if err != nil {
		closeAll(host[:])
		closeAll(child[:])
		// A refusal of the runtime's poller is a host fault that carries
		// no errno: keep its code.
		return nil, errcode.Wrap(errcode.Of(err), err, "watch the pipes of %s", s.what())
	}
	stdin, rest, err := fillStdin(host[0], s.Stdin)
	if err != nil {
		w.release()
		closeAll(host[3:])
		closeAll(child[:])
		return nil, errcode.Wrap(errcode.Internal, os.NewSyscallError("write", err), "write the request of %s", s.what())
	}
	files := []uintptr{uintptr(child[0]), uintptr(child[1]), uintptr(child[2]), uintptr(child[3])}
	if s.Exec != nil {
		files = append(files, s.Exec.Fd()) // barrier.ExecFd
	}
	if s.Ruleset != nil {
		if s.Exec == nil {
			files = append(files, ^uintptr(0)) // ForkExec closes barrier.ExecFd
		}
		files = append(files, s.Ruleset.Fd()) // barrier.RulesetFd
	}
	dir := s.Dir
	if s.DirFile != nil {
		// The child changes directory after the fork and before its
		// descriptors are rearranged, through its own copy of this
		// descriptor: the kernel's link to the open directory, not a name.
		dir = "/proc/self/fd/" + strconv.Itoa(int(s.DirFile.Fd()))
	}
	var (
		pidfd = -1
		pid   int
	)
	// Forked by the fork thread, which lists every leader (see
	// onlyLeaderChildren), under forkMu (for writing) until the new leader
	// is in leaders, so a look never sees it as a stranger. The lock is
	// taken on that thread, so no look waits while it is woken.
	onForkThread(func() {
		forkMu.Lock()
		defer forkMu.Unlock()
		pid, err = syscall.ForkExec(selfExe, s.barrierArgv(), &syscall.ProcAttr{
			Dir:   dir,
			Env:   barrier.Env(s.Env),
			Files: files,
			Sys:   &syscall.SysProcAttr{Setpgid: true, PidFD: &pidfd},
		})
		if err == nil && pidfd >= 0 {
			leaders.Store(pid, struct{}{})
			supervised.Store(pid, struct{}{})
		}
	})
	closeAll(child[:])
	giveUp := func() {
		w.release()
		if stdin != nil {
			stdin.Close()
		}
		closeAll(host[3:])
	}
	if err != nil {
		giveUp()
		return nil, errcode.Wrap(errcode.ProcessFailed, errcode.Spawn(forkFault(err, files)), "start the launch barrier for %s", s.what())
	}
	if pidfd < 0 {
		// No CLONE_PIDFD (Linux before 5.2). The unreaped child still pins
		// its pid, so killing and reaping it by pid is exact.
		_ = unix.Kill(pid, unix.SIGKILL)
		_, _ = unix.Wait4(pid, nil, unix.WALL, nil)
		giveUp()
		return nil, errcode.New(errcode.Internal, "start the launch barrier: this kernel has no pidfds (Linux 5.3 or later is required)")
	}
	if err := w.watch(pidfd); err != nil {
		// Out of epoll watches. The barrier waits for its release, which
		// never comes: kill and reap it; it ran no package code.
		_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		_, _ = unix.Wait4(pid, nil, unix.WALL, nil)
		leaders.Delete(pid)
		supervised.Delete(pid)
		unix.Close(pidfd)
		giveUp()
		return nil, errcode.Wrap(errcode.Internal, err, "watch the launch barrier of %s", s.what())
	}
	inv.g = group{pgid: pid, pidfd: pidfd}
	inv.w = w
	inv.stdin, inv.stdinRest = stdin, rest
	inv.rel = host[3]
	return inv, nil
}

// release writes the release byte; the barrier then becomes the entrypoint.
// The host's end is closed at once: the watcher's copy of it stays, to see
// the entrypoint executed.
func (inv *invocation) release() error {
	var err error
	for {
		err = unix.Sendto(inv.rel, []byte{barrier.ReleaseByte}, unix.MSG_NOSIGNAL, nil)
		if err != unix.EINTR {
			break
		}
	}
	if cerr := unix.Close(inv.rel); err == nil {
		err = cerr
	}
	inv.rel = -1
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
		// The barrier is gone before its release, so no package code ran:
		// the barrier is fm itself, and what ends it this early is the
		// host (a Go runtime that could not get memory under RLIMIT_AS, or
		// a kill), never the package, whose failure this must not be
		// counted as [OP-3].
		return errcode.Wrap(errcode.HostResource, err, "release the launch barrier: it exited before its release, so no package code ran (out of memory, or killed)")
	}
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "release the launch barrier")
	}
	return nil
}

// closePipes closes the host's ends of the pipes. Once the leader has
// exited, the cut watcher ends at once, and closePipes waits for that: the
// caller returns holding no descriptor of the invocation. Else (the group
// could not be proved gone) the watcher keeps waiting for the leader, and
// the pidfd and the epoll instance stay open until it exits.
func (inv *invocation) closePipes() {
	inv.w.cut()
	if inv.stdin != nil {
		inv.stdin.Close()
	}
	if inv.rel >= 0 {
		unix.Close(inv.rel)
		inv.rel = -1
	}
	if inv.leaderExited() {
		<-inv.w.ended
	}
}

// stream is what is read from one output pipe (by the watcher), keeping at most limit+1 bytes when keep is
// set and counting all of them.
type stream struct {
	limit int
	keep  bool
	buf   []byte
	n     int64
	over  chan struct{} // closed when n first exceeds limit
	done  chan struct{} // closed at end of file, a read error, or a cut (watcher)
}

func newStream(limit int, keep bool) *stream {
	return &stream{limit: limit, keep: keep, over: make(chan struct{}), done: make(chan struct{})}
}

// take counts the bytes just read and keeps what the bound allows.
func (st *stream) take(b []byte) {
	if st.keep && len(st.buf) <= st.limit {
		st.buf = append(st.buf, b[:min(len(b), st.limit+1-len(st.buf))]...)
	}
	wasOver := st.n > int64(st.limit)
	st.n += int64(len(b))
	if !wasOver && st.n > int64(st.limit) {
		close(st.over)
	}
}

// stopCause is what ended the invocation before the leader exited.
type stopCause int

const (
	leaderExited stopCause = iota
	stdoutOver
	stderrOver
	timedOut
	cancelled
	notStarted // the barrier did not execute the entrypoint in time
)

// supervise feeds stdin, drains stdout and stderr, and waits for the first
// of: leader exit, a stream bound crossed, the timeout, ctx cancelled.
//
// The timeout runs from the moment the entrypoint has been executed
// (watcher.execd), not from the release: what comes before is fm's own
// barrier finishing its start-up, reading the release byte and calling
// execve, and on a busy host that can take seconds which are no part of the
// package's time [INV-5]. fm allows its barrier as long again to get there
// (the same duration, counted separately); past that the invocation ends as
// host-resource, never as the package's timeout.
func (inv *invocation) supervise(ctx context.Context, s Spec) stopCause {
	inv.stdinDone = make(chan struct{})
	if inv.stdin == nil {
		close(inv.stdinDone)
	} else {
		go func() {
			defer close(inv.stdinDone)
			_, _ = inv.stdin.Write(inv.stdinRest) // a package may close stdin early
			inv.stdin.Close()
		}()
	}
	start := time.NewTimer(s.Timeout)
	select {
	case <-inv.w.execd:
		start.Stop()
	case <-inv.w.leaderDone:
		start.Stop()
		return leaderExited
	case <-start.C:
		return notStarted
	case <-ctx.Done():
		start.Stop()
		return cancelled
	}
	if s.Running != nil {
		s.Running()
	}
	timer := time.NewTimer(s.Timeout)
	defer timer.Stop()
	select {
	case <-inv.w.leaderDone:
		return leaderExited
	case <-inv.out.over:
		return stdoutOver
	case <-inv.errs.over:
		return stderrOver
	case <-timer.C:
		return timedOut
	case <-ctx.Done():
		return cancelled
	}
}

// finish stops and proves the group gone, collects the streams and turns the
// outcome into a result or a coded error. Its verdict, first match wins:
// group not provably gone (process-cleanup-failed); the cause that stopped the
// invocation early; a stream over its bound; a non-zero exit or a signal
// (process-failed); anything of the group alive after the leader exited, or a
// stream held open by a process outside the group (process-leak).
func (inv *invocation) finish(ctx context.Context, s Spec, cause stopCause) (*Result, error) {
	ws, stopErr := inv.stop(cause != leaderExited)
	if stopErr != nil {
		return nil, stopErr
	}
	held := inv.drain()
	if s.Stderr != nil {
		s.Stderr(inv.errs.buf[:min(len(inv.errs.buf), s.StderrLimit)], inv.errs.n)
	}
	switch cause {
	case timedOut:
		t := TimedOut{What: s.what(), After: s.Timeout, Stdout: inv.out.buf[:min(len(inv.out.buf), s.StdoutLimit)]}
		return nil, &errcode.Error{Code: errcode.Timeout, Msg: t.Error(), Err: t}
	case notStarted:
		return nil, errcode.New(errcode.HostResource, "%s: the launch barrier did not execute the entrypoint within %d ms of its release: the host is overloaded (the package's own bound never started)", s.what(), s.Timeout.Milliseconds())
	case cancelled:
		return nil, s.interrupted(ctx)
	}
	switch {
	case inv.out.n > int64(s.StdoutLimit):
		return nil, errcode.New(errcode.ResponseOversized, "%s: stdout exceeded %d bytes", s.what(), s.StdoutLimit)
	case inv.errs.n > int64(s.StderrLimit):
		return nil, errcode.New(errcode.StderrOversized, "%s: stderr exceeded %d bytes", s.what(), s.StderrLimit)
	case ws.Signaled():
		return nil, errcode.New(errcode.ProcessFailed, "%s: entrypoint killed by signal %d (%s)", s.what(), int(ws.Signal()), ws.Signal())
	case ws.ExitStatus() != 0 && !slices.Contains(s.AnswerStatuses, ws.ExitStatus()):
		return nil, &errcode.Error{Code: errcode.ProcessFailed, Msg: fmt.Sprintf("%s: entrypoint exit status %d", s.what(), ws.ExitStatus()), Err: ExitStatus(ws.ExitStatus())}
	case ws.leak && !s.StopLeftovers:
		return nil, errcode.New(errcode.ProcessLeak, "%s: processes of the invocation group outlived the entrypoint; they were stopped", s.what())
	case held:
		return nil, errcode.New(errcode.ProcessLeak, "%s: stdout or stderr stayed open after the invocation group was gone: a process that left the group holds it (not signalled)", s.what())
	}
	return &Result{Stdout: inv.out.buf, ExitStatus: ws.ExitStatus()}, nil
}

// TimedOut is the cause of a timeout error at the invocation's own bound:
// what the invocation is, the bound, and what it had written to stdout by
// then (within StdoutLimit), for a caller that tells a package that
// answered but did not exit from one that did not answer.
type TimedOut struct {
	What   string
	After  time.Duration
	Stdout []byte
}

func (t TimedOut) Error() string {
	return fmt.Sprintf("%s: no answer within %d ms", t.What, t.After.Milliseconds())
}

// ExitStatus is the cause of a process-failed error for a non-zero exit:
// the entrypoint's exit status (127 also when the barrier's execve of it
// failed), for a caller that explains it.
type ExitStatus int

func (e ExitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// exitState is the leader's wait status plus whether anything of the group
// was found alive after the leader exited.
type exitState struct {
	unix.WaitStatus
	leak bool
}

// hostFaultWait is how long stop retries a sweep that failed for a host
// fault (errcode.HostFault: out of descriptors or memory) before it keeps
// the record as unproven.
const hostFaultWait = 30 * time.Second

// stop brings the group to its end and proves it gone [GRP-2], [GRP-4].
// With terminate, the group gets TERM at once; otherwise (the leader exited
// on its own) it gets TERM only if a member is found alive, which is then a
// leak. KILL follows termGrace later. The final proof is the pidfd group
// probe.
//
// The leader is normally reaped only once nothing in the group is alive:
// while it is an unreaped zombie it pins the group's number for kill(-pgid)
// and the /proc scan, and, should this process die meanwhile, it keeps the
// recorded leader identity provable for Cleanup. But the kernel's group
// probe counts that zombie, so proving a group empty that way means reaping
// first. That is done when it cannot cost the proof anything (the fast path,
// which needs no /proc scan): the leader has exited (on its own, or within
// termGrace of the TERM, which stop waits for before it looks any further),
// the kernel signals groups through pidfds (Linux 6.9+), and no orphan of
// any invocation group has re-parented to this process (onlyLeaderChildren:
// every child listed by the threads that fork leaders and adopt orphans is a
// leader).
// A member of the group other than the leader is then either a descendant of
// the leader, and every live or zombie descendant of a dead leader descends
// from a child of this subreaper that is not such a leader, or a process of
// the same session that joined the group on purpose; the probe after the
// reap still sees that one, and the scan below handles it.
func (inv *invocation) stop(terminate bool) (exitState, error) {
	g := &inv.g
	var es exitState
	fail := func(err error) (exitState, error) {
		// Keep the leader unreaped and its pidfd open until it exits.
		go func() { <-inv.w.leaderDone; g.close() }()
		return es, errcode.Wrap(errcode.ProcessCleanupFailed, err, "process group %d could not be proved gone; its owner record is kept", g.pgid)
	}
	reaped := false
	deadline := time.Now().Add(termGrace)
	if terminate {
		g.signal(unix.SIGTERM)
		step("terminating")
		// Most groups end with their leader: wait for that rather than scan
		// /proc while they do (with a thousand polls stopped at once, the
		// scans were what made stopping slow). The proof below is the same.
		timer := time.NewTimer(termGrace)
		select {
		case <-inv.w.leaderDone:
		case <-timer.C:
		}
		timer.Stop()
	}
	// fast reaps the leader and probes the group when that costs the proof
	// nothing (above), and reports whether the group is proved empty.
	fast := func() (bool, error) {
		if !inv.leaderExited() || !g.groupSignals() || !onlyLeaderChildren() {
			return false, nil
		}
		if _, err := unix.Wait4(g.pgid, &es.WaitStatus, unix.WALL, nil); err != nil {
			return false, err
		}
		leaders.Delete(g.pgid)
		// Unless the group is empty, something outlived the leader: a live
		// member (a leak) or a zombie orphan to reap. From here the pidfd
		// alone names the group, and the scan below sees its number pinned
		// by those members.
		reaped = true
		return g.empty(), nil
	}
	if done, err := fast(); err != nil {
		return fail(err)
	} else if done {
		g.close()
		return es, nil
	}
	faultUntil := time.Now().Add(hostFaultWait)
	killed := false
	for delay := time.Millisecond; ; delay = min(2*delay, pollMax) {
		if !reaped && !inv.leaderExited() {
			// Terminating, and the leader is alive, so the group is: wait
			// for its exit until the deadline rather than scan /proc
			// meanwhile (a thousand groups stopped on a loaded machine
			// each scanned it every 25 ms while their leaders were still
			// being scheduled to die). Past the deadline the group gets
			// KILL, as a scan finding the leader alive would decide.
			timer := time.NewTimer(time.Until(deadline))
			select {
			case <-inv.w.leaderDone:
			case <-timer.C:
			}
			timer.Stop()
			if inv.leaderExited() {
				if done, err := fast(); err != nil {
					return fail(err)
				} else if done {
					g.close()
					return es, nil
				}
				continue
			}
			if killed {
				return fail(errors.New("members still alive after KILL"))
			}
			g.signal(unix.SIGKILL)
			killed, deadline = true, time.Now().Add(killWait)
			continue
		}
		if reaped && g.empty() {
			break
		}
		live, swept, err := g.sweep()
		if err != nil {
			if !errcode.HostFault(err) || time.Now().After(faultUntil) {
				return fail(err)
			}
			// The /proc scan needs descriptors the host is out of: retry
			// rather than keep a record for a group that is likely gone,
			// escalating to KILL as if members lived.
			if terminate && !killed && time.Now().After(deadline) {
				g.signal(unix.SIGKILL)
				killed, deadline = true, time.Now().Add(killWait)
			}
			time.Sleep(delay)
			continue
		}
		if live > 0 && !terminate {
			es.leak, terminate = true, true
			g.signal(unix.SIGTERM)
			step("terminating")
			deadline = time.Now().Add(termGrace)
		}
		if live == 0 && swept == 0 {
			break
		}
		if live > 0 && time.Now().After(deadline) {
			if killed {
				return fail(errors.New("members still alive after KILL"))
			}
			g.signal(unix.SIGKILL)
			killed, deadline = true, time.Now().Add(killWait)
		}
		time.Sleep(delay)
	}
	if !reaped {
		// Nothing in the group is alive, the leader included.
		select {
		case <-inv.w.leaderDone:
		case <-time.After(killWait):
			return fail(errors.New("leader exit not reported"))
		}
		if _, err := unix.Wait4(g.pgid, &es.WaitStatus, unix.WALL, nil); err != nil {
			return fail(err)
		}
		leaders.Delete(g.pgid)
	}
	// The leader is reaped; from here only the pidfd names the group. A
	// member the sweep could not see (a fork racing the scan) or could not
	// reap (a zombie of a foreign parent) is handled here.
	ok, err := waitFor(killWait, func() (bool, error) {
		if ok, err := g.gone(); ok || err != nil {
			return ok, err
		}
		es.leak = true
		g.signal(unix.SIGKILL)
		return false, nil
	})
	if err != nil || !ok {
		return fail(errors.Join(err, errors.New("members still alive after the leader was reaped")))
	}
	g.close()
	return es, nil
}

// leaderExited reports whether the leader has exited (it is not reaped).
func (inv *invocation) leaderExited() bool {
	select {
	case <-inv.w.leaderDone:
		return true
	default:
		return false
	}
}

// drain waits for stdout and stderr to reach end of file, and stdin's writer
// (if any) to finish, once the group is gone. If they do not within
// pipeGrace, a process outside the group holds them: drain cuts them off and
// reports it.
func (inv *invocation) drain() (held bool) {
	timer := time.NewTimer(pipeGrace)
	defer timer.Stop()
	for _, done := range []chan struct{}{inv.out.done, inv.errs.done} {
		select {
		case <-done:
			continue
		case <-timer.C:
		}
		held = true
		inv.w.cut()
		break
	}
	<-inv.out.done
	<-inv.errs.done
	if inv.stdin != nil {
		inv.stdin.SetWriteDeadline(time.Now())
	}
	<-inv.stdinDone
	return held
}
