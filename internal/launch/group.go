package launch

import (
	"bytes"
	"errors"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"firstmate.dev/fm/internal/freshlook"
	"firstmate.dev/fm/internal/procstat"
	"golang.org/x/sys/unix"
)

// Timing of group cleanup [GRP-2].
const (
	// termGrace is how long a group gets to exit after TERM before KILL.
	termGrace = 500 * time.Millisecond
	// killWait bounds the wait for a KILLed group to be proved gone; past
	// it the group is reported as not provably gone (process-cleanup-failed).
	killWait = 5 * time.Second
	// pollMax caps the back-off between two looks at a group.
	pollMax = 25 * time.Millisecond
)

// group is one invocation process group, held through a pidfd of its leader.
//
// The pidfd pins the kernel's struct pid of the leader, which is also the
// group's id, so PIDFD_SIGNAL_PROCESS_GROUP reaches exactly that group even
// after the leader is reaped and its number is reused; and a group probe
// (signal 0) fails with ESRCH exactly when no process, live or zombie, is left
// in it [GRP-4].
type group struct {
	pgid  int // the leader's pid, which is the group id
	pidfd int
}

// close closes the pidfd; the group is no longer supervised (see
// ReapOrphans). It is called only once the leader has exited, so the
// watcher no longer uses the pidfd.
func (g *group) close() {
	supervised.Delete(g.pgid)
	unix.Close(g.pidfd)
}

// signal sends sig to every member of the exact group. Linux before 6.9 has no
// PIDFD_SIGNAL_PROCESS_GROUP (EINVAL); there kill(-pgid) is used, but only
// while the leader still exists (running or an unreaped zombie), because only
// then is the number pinned to this group; otherwise nothing is sent. Errors
// are not returned: whether the group is gone is decided only by gone.
func (g *group) signal(sig unix.Signal) {
	err := unix.PidfdSendSignal(g.pidfd, sig, nil, unix.PIDFD_SIGNAL_PROCESS_GROUP)
	if err == unix.EINVAL && g.leaderExists() {
		_ = unix.Kill(-g.pgid, sig)
	}
}

// groupSignals reports whether the kernel signals a process group through a
// pidfd (PIDFD_SIGNAL_PROCESS_GROUP, Linux 6.9+). It probes the group with
// signal 0, so it is only asked while the group is pinned (the leader
// unreaped): then the probe succeeds where the flag is known.
func (g *group) groupSignals() bool {
	return unix.PidfdSendSignal(g.pidfd, 0, nil, unix.PIDFD_SIGNAL_PROCESS_GROUP) != unix.EINVAL
}

// leaders holds the pids of the leaders this process started (barriers, then
// entrypoints) until it reaps them. A leader is this process's own fork, so
// it never descends from another invocation's leader.
var leaders sync.Map // int -> struct{}

// forkMu makes starting a leader and recording it in leaders one step for
// onlyLeaderChildren.
var forkMu sync.RWMutex

// forkThread is the one OS thread that forks every leader: a goroutine
// locked to it for the life of the process runs the fork requests of start,
// one at a time (each under forkMu). The kernel lists a child in the children file of the thread
// that forked it (its real parent is that thread), so every leader, and every
// sibling a leader makes with CLONE_PARENT, is listed by this thread's file
// and no other (see onlyLeaderChildren). The goroutine never returns, so the
// thread never exits: Go ends a locked thread only when its goroutine does.
// Nothing else about the fork depends on the thread: the runtime gives every
// thread the same signal mask, the child's mask and handlers are reset by
// ForkExec, and no leader is started with a parent-death signal (which the
// kernel ties to the forking thread) or with any per-thread attribute set.
var forkThread struct {
	once sync.Once
	reqs chan func()
	tid  atomic.Int64 // 0 until the thread runs
}

// onForkThread runs fn on the fork thread and returns once it has.
func onForkThread(fn func()) {
	forkThread.once.Do(func() {
		forkThread.reqs = make(chan func())
		running := make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked: see forkThread
			forkThread.tid.Store(int64(unix.Gettid()))
			close(running)
			for fn := range forkThread.reqs {
				fn()
			}
		}()
		<-running
	})
	done := make(chan struct{})
	forkThread.reqs <- func() {
		defer close(done)
		fn()
	}
	<-done
}

// onlyLeaderChildren reports whether no orphan of any invocation group has
// re-parented to this process: whether every child that the children files
// of the threads that fork leaders and adopt orphans list, zombies included,
// is in leaders (this process is a child subreaper, so every descendant of a
// dead leader would be, or descend from, such a child; lookOnlyLeaderChildren
// says which files and why they are enough). False when a file cannot be
// read (no CONFIG_PROC_CHILDREN) or on any doubt. A file can miss a child
// that is added or removed while it is read; the caller only uses a true
// answer to choose a faster proof whose final word is still the kernel's
// group probe.
//
// Concurrent callers share one look (freshlook): a caller takes the answer
// of a look that started after it asked (so the answer is as fresh as its
// own look would be), and otherwise makes the look itself. A thousand polls
// stopped at once make two looks, not a thousand (a thousand callers handed
// a mutex one after the other were what made a mass stop slow under load).
func onlyLeaderChildren() bool {
	return childrenLook.Get(lookOnlyLeaderChildren)
}

// childrenLook shares the looks of onlyLeaderChildren.
var childrenLook freshlook.Look[bool]

// wideEvery is how long a narrow look may follow the last wide one.
const wideEvery = time.Second

// Looks at the children: wideDue is when (time since epoch) the next look
// is wide; strayChild is set for good once a wide look or ReapOrphans found
// a child listed by a thread that is neither the main thread nor the fork
// thread (noteStray).
var (
	epoch      = time.Now()
	wideDue    atomic.Int64
	strayChild atomic.Bool
)

// noteStray sets strayChild if children, the children file of thread tid,
// lists a child and tid is neither the main thread nor the fork thread. Call
// it under forkMu (for reading): a fork thread that starts meanwhile forks
// nothing until it is released.
func noteStray(tid int, children []byte) {
	if tid != unix.Getpid() && tid != int(forkThread.tid.Load()) && len(bytes.TrimSpace(children)) > 0 {
		strayChild.Store(true)
	}
}

// lookOnlyLeaderChildren is one look. Which children files it reads:
//
// A narrow look reads two: the main thread's (its tid is the pid) and the
// fork thread's. Those list every child that can be an orphan of an
// invocation group, or a leader's CLONE_PARENT sibling:
//
//   - A child is listed by the file of its real parent, a thread: the one
//     that forked it, or the one that adopted it. Every leader is forked by
//     the fork thread, and a leader's CLONE_PARENT child takes the leader's
//     real parent, the fork thread.
//   - An orphan is adopted by the first live thread of its new parent's
//     thread group (kernel/exit.c: find_new_reaper returns find_alive_thread
//     of the nearest child subreaper ancestor, or of the PID namespace's
//     init). This process is a child subreaper, so the orphans of every
//     descendant of its leaders come to it (or, were it a namespace's init,
//     come to it all the same), and its first thread is the main thread
//     (the thread group leader, whose tid is the pid), which Go never ends
//     before the process. The children of one of this process's own threads
//     that ends go to that first live thread too.
//
// A child of any other thread was forked by it (os/exec in the same
// process), or by such a child with CLONE_PARENT, and descends from no
// leader. TestOrphansAreAdoptedByTheMainThread checks
// these kernel facts with real processes.
//
// A wide look reads every thread's file (getdents of /proc/self/task), as
// all looks did before: it is made when the last one started wideEvery ago
// or more (the first look of a process is wide), and for good once a
// child of another thread was found (strayChild: the facts above do not hold
// in this process, or it forks children of its own elsewhere). So a process
// that starts a stranger anywhere is answered as before, and the narrow look
// costs a serve with ~100 threads (Go keeps one per concurrently blocking
// system call) two files instead of ~100.
//
// The files are read relative to one descriptor of /proc/self/task into one
// buffer, the pids parsed in place.
func lookOnlyLeaderChildren() bool {
	forkMu.RLock()
	defer forkMu.RUnlock()
	tasks, err := unix.Open("/proc/self/task", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(tasks)
	var (
		buf  = make([]byte, 1024)
		path = make([]byte, 0, 32)
		main = unix.Getpid()
		fork = int(forkThread.tid.Load())
	)
	only := true
	check := func(name []byte, tid int) error {
		path = append(append(path[:0], name...), "/children"...)
		b, err := readAllAt(tasks, path, &buf)
		if err != nil {
			return err
		}
		noteStray(tid, b)
		only = only && onlyLeaders(b)
		return nil
	}
	if now := int64(time.Since(epoch)); strayChild.Load() || now >= wideDue.Load() {
		// Every file, even past a stranger, so that every stray is noted.
		wideDue.Store(now + int64(wideEvery))
		return eachPID(tasks, "/proc/self/task", make([]byte, 8<<10), check) == nil && only
	}
	name := make([]byte, 0, 10)
	if check(strconv.AppendInt(name, int64(main), 10), main) != nil || !only {
		return false
	}
	return fork == 0 || fork == main || check(strconv.AppendInt(name, int64(fork), 10), fork) == nil && only
}

// onlyLeaders reports whether every pid that one children file lists is a
// leader (or a leader reaped since the file was read).
func onlyLeaders(b []byte) bool {
	for len(b) > 0 {
		i := bytes.IndexAny(b, " \n")
		if i < 0 {
			i = len(b)
		}
		f := b[:i]
		b = b[min(i+1, len(b)):]
		if len(f) == 0 {
			continue
		}
		pid, ok := atoiPID(f)
		if !ok {
			return false
		}
		if _, ok := leaders.Load(pid); !ok && !reapedLeader(pid) {
			return false
		}
	}
	return true
}

// leaderExists reports whether the leader is still running or an unreaped
// zombie.
func (g *group) leaderExists() bool {
	return unix.PidfdSendSignal(g.pidfd, 0, nil, 0) == nil
}

// empty reports whether the kernel proves the group has no process left, not
// even a zombie. false means "not proved", not "alive".
func (g *group) empty() bool {
	err := unix.PidfdSendSignal(g.pidfd, 0, nil, unix.PIDFD_SIGNAL_PROCESS_GROUP)
	if err == unix.EINVAL && g.leaderExists() {
		err = unix.Kill(-g.pgid, 0)
	}
	return err == unix.ESRCH
}

// gone reports whether the group is proved extinct: empty, or every process
// left in it is a zombie that some other parent will (or will never) reap
// [GRP-4]. The scan only runs when the kernel says the group is not empty, so
// the group's number is still held by its own members and every process found
// with that pgid is one of them; should the group empty and the number be
// reused in between, a live stranger makes the answer "not gone" (refuse) and
// only zombies make it "gone", which is then true of this group as well.
func (g *group) gone() (bool, error) {
	if g.empty() {
		return true, nil
	}
	ms, err := members(g.pgid)
	if err != nil {
		return false, err
	}
	for _, m := range ms {
		if !m.Dead() {
			return false, nil
		}
	}
	return true, nil
}

// sweep looks at the members of a group whose number is pinned: by its
// leader, this process's unreaped child, or, once stop's fast path has reaped
// the leader, by the members the kernel's probe just found (stop probes
// again before every sweep there). It counts the live members, the leader
// included, and reaps every zombie member that is this process's child,
// except the leader: orphans of the group re-parent to this process because
// it is a child subreaper. Reaping by exact pid is safe: only this process
// can reap its own children, and a member's pid is pinned while it is a
// zombie.
func (g *group) sweep() (live, reaped int, err error) {
	ms, err := members(g.pgid)
	if err != nil {
		return 0, 0, err
	}
	self := os.Getpid()
	for _, m := range ms {
		switch {
		case !m.Dead():
			live++
		case m.pid != g.pgid && m.PPID == self:
			if p, _ := unix.Wait4(m.pid, nil, unix.WNOHANG|unix.WALL, nil); p == m.pid {
				reaped++
			}
		}
	}
	return live, reaped, nil
}

// stopForeign stops a group this process did not start (recovery [GRP-3]):
// TERM, KILL after termGrace, and reports whether it was proved gone within
// killWait. It reaps nothing: the members are not its children.
func (g *group) stopForeign() (bool, error) {
	if ok, err := g.gone(); ok || err != nil {
		return ok, err
	}
	g.signal(unix.SIGTERM)
	if ok, err := waitFor(termGrace, g.gone); ok || err != nil {
		return ok, err
	}
	g.signal(unix.SIGKILL)
	return waitFor(killWait, g.gone)
}

// waitFor polls cond with a short back-off until it holds or d passes.
func waitFor(d time.Duration, cond func() (bool, error)) (bool, error) {
	deadline := time.Now().Add(d)
	for delay := time.Millisecond; ; delay = min(2*delay, pollMax) {
		ok, err := cond()
		if ok || err != nil {
			return ok, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		time.Sleep(delay)
	}
}

// reapedLeader reports whether pid, a child listed by a look but not in
// leaders, is a leader that a stop reaped (and dropped from leaders) since
// the list was read: it is gone by now, or, its number reused, no longer
// this process's child. Without this, every stop of a mass stop that shared
// a look racing one reap went the slow way (a /proc scan per group). A
// stranger is still this process's child: the answer stays false for it,
// and on any doubt.
func reapedLeader(pid int) bool {
	st, err := procstat.Read(pid)
	if errors.Is(err, procstat.ErrNoProcess) {
		return true
	}
	return err == nil && st.PPID != os.Getpid()
}
