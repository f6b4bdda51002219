package launch

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"golang.org/x/sys/unix"
)

// watcher is the one goroutine of an invocation that waits on the host's
// descriptors of it: the read ends of stdout and stderr, which it reads into
// their streams, a copy of the host's end of the release socket, which reads
// end of file once the barrier has executed the entrypoint (or exited), and
// the leader's pidfd, which tells it that the leader exited. They share one
// epoll instance, and only that instance is in the runtime's poller. So a waiting invocation costs one goroutine, not one
// per descriptor: a serve with a thousand long polls in flight keeps two
// goroutines for each (its pass, and this one) instead of four, and an
// invocation that ends wakes one goroutine, not three.
//
// The watcher owns the stream descriptors: it closes each once it has read it
// to its end, or once cut, and nothing else reads or closes them, so their
// numbers cannot be reused under it. It stops looking at the pidfd when the
// leader has exited, before leaderDone is closed, and the group closes the
// pidfd only after that (see group.close). It owns its copy of the release
// socket likewise, and closes it at its end of file or once the leader has
// exited. It returns, closing the epoll
// instance, once the leader has exited and both streams are closed; ended
// says it has (closePipes waits for that, so Run returns holding none of the
// invocation's descriptors).
type watcher struct {
	ep         *os.File // the epoll instance, registered with the runtime's poller
	epfd       int
	fds        [2]int     // stdout, stderr; -1 once closed
	streams    [2]*stream // what each is read into
	pidfd      int
	leaderDone chan struct{} // closed once the leader has exited (not reaped)
	relfd      int           // the copy of the host's end of the release socket; -1 once closed
	// execd is closed once the barrier's end of the release socket is
	// closed: the entrypoint has been executed, or the barrier exited
	// without (then leaderDone follows).
	execd   chan struct{}
	first   func() // called once, when stdout's first bytes arrive
	cutting atomic.Bool
	ended   chan struct{} // closed once run has closed the epoll instance
}

// Tags of the watched descriptors, in each epoll event's data.
const (
	tagStdout  = 0
	tagStderr  = 1
	tagLeader  = 2
	tagRelease = 3
)

// newWatcher makes the epoll instance for stdout and stderr (non-blocking
// read ends, which it then owns) and a copy of rel, the host's end of the
// release socket, before the fork, so that a host short of descriptors or of
// epoll watches fails before any process exists. watch adds the leader and
// starts the goroutine.
func newWatcher(stdout, stderr, rel int, out, errs *stream, first func()) (*watcher, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	relfd, err := unix.FcntlInt(uintptr(rel), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Close(epfd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	w := &watcher{epfd: epfd, fds: [2]int{stdout, stderr}, streams: [2]*stream{out, errs}, pidfd: -1, leaderDone: make(chan struct{}),
		relfd: relfd, execd: make(chan struct{}), first: first, ended: make(chan struct{})}
	fail := func(err error) (*watcher, error) {
		unix.Close(relfd)
		unix.Close(epfd)
		return nil, err
	}
	for tag, fd := range []int{stdout, stderr, tagLeader: -1, tagRelease: relfd} {
		if fd < 0 {
			continue
		}
		if err := w.add(fd, tag); err != nil {
			return fail(err)
		}
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		return fail(os.NewSyscallError("fcntl", err))
	}
	w.ep = os.NewFile(uintptr(epfd), "epoll")
	// os.NewFile keeps a descriptor the runtime's poller refused (out of
	// epoll watches: fs.epoll.max_user_watches) as a plain file, which has
	// no deadlines; the watcher needs both.
	if err := w.ep.SetReadDeadline(time.Time{}); err != nil {
		unix.Close(relfd)
		w.ep.Close()
		return nil, errcode.Wrap(errcode.HostResource, err, "the runtime's poller refused an epoll descriptor (fs.epoll.max_user_watches reached?)")
	}
	return w, nil
}

// add adds fd to the epoll instance under tag.
func (w *watcher) add(fd, tag int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(tag)}
	return os.NewSyscallError("epoll_ctl", unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev))
}

// watch adds the leader's pidfd and starts the watcher.
func (w *watcher) watch(pidfd int) error {
	if err := w.add(pidfd, tagLeader); err != nil {
		return err
	}
	w.pidfd = pidfd
	go w.run()
	return nil
}

// release gives up a watcher whose watch never started: it closes the
// streams' descriptors and the epoll instance.
func (w *watcher) release() {
	for i := range w.fds {
		w.closeStream(i)
	}
	w.closeRelease()
	w.ep.Close()
}

// cut makes the watcher stop reading: it closes the streams that have not
// reached their end, at once, and keeps waiting for the leader only. drain
// cuts streams that a process outside the group holds open; closePipes cuts
// whatever a launch given up before its release left.
func (w *watcher) cut() {
	w.cutting.Store(true)
	_ = w.ep.SetReadDeadline(time.Now()) // the file may be closed already: the watcher is done
}

// chunks are the read buffers of every stream of this process. A stream
// takes one only while data is ready to read, so the hundreds of polls that
// serve keeps waiting on a long poll hold no buffer at all.
var chunks = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// readsPerEvent bounds how many chunks one readiness of a stream reads before
// the watcher looks at its other descriptors again.
const readsPerEvent = 4

func (w *watcher) run() {
	defer close(w.ended)
	defer w.ep.Close()
	rc, err := w.ep.SyscallConn()
	if err != nil {
		w.fallBack()
		return
	}
	var evs [4]unix.EpollEvent
	for w.pidfd >= 0 || w.fds[0] >= 0 || w.fds[1] >= 0 {
		n := 0
		var werr error
		err := rc.Read(func(uintptr) bool {
			// Returning false waits for the next readiness edge, so a
			// ready instance must never be left unread here.
			for n, werr = unix.EpollWait(w.epfd, evs[:], 0); werr == unix.EINTR; n, werr = unix.EpollWait(w.epfd, evs[:], 0) {
			}
			return n > 0 || werr != nil
		})
		if w.cutting.Load() {
			w.closeStream(tagStdout)
			w.closeStream(tagStderr)
		}
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			_ = w.ep.SetReadDeadline(time.Time{}) // cut: only the leader is left to wait for
			continue
		case err != nil || werr != nil:
			w.fallBack()
			return
		}
		for _, ev := range evs[:n] {
			switch tag := int(ev.Fd); tag {
			case tagLeader:
				w.checkLeader()
			case tagRelease:
				w.checkExecd()
			default:
				w.read(tag)
			}
		}
	}
}

// read reads what stream tag has ready, and closes it at its end.
func (w *watcher) read(tag int) {
	fd := w.fds[tag]
	if fd < 0 {
		return
	}
	chunk := chunks.Get().(*[]byte)
	defer chunks.Put(chunk)
	for range readsPerEvent {
		k, err := unix.Read(fd, *chunk)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return // drained: wait for the next readiness
		case k > 0:
			if tag == tagStdout && w.first != nil {
				w.first()
				w.first = nil
			}
			w.streams[tag].take((*chunk)[:k])
			continue
		}
		w.closeStream(tag) // end of file, or a read error
		return
	}
}

// closeStream stops watching stream tag, closes its descriptor and marks the
// stream done.
func (w *watcher) closeStream(tag int) {
	fd := w.fds[tag]
	if fd < 0 {
		return
	}
	// Removed before the close: epoll keeps reporting a descriptor whose
	// open file another copy still holds (a fork in flight).
	_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	unix.Close(fd)
	w.fds[tag] = -1
	close(w.streams[tag].done)
}

// checkLeader closes leaderDone if the leader has exited. It waits with
// WNOWAIT, so the leader stays an unreaped zombie that pins the group's
// number until finish reaps it.
func (w *watcher) checkLeader() {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PIDFD, w.pidfd, &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil)
	if err == unix.EINTR || (err == nil && info.Signo == 0) { // si_signo stays 0 while nothing has exited
		return
	}
	_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, w.pidfd, nil)
	w.pidfd = -1
	// The barrier's end of the release socket is gone with it: nothing
	// more to learn there (the end of file may still be unread).
	w.closeRelease()
	close(w.leaderDone)
}

// checkExecd reads the release socket: at its end of file (or a reset) the
// barrier's end is closed, which happens at the execve of the entrypoint
// (close-on-exec) or at the barrier's exit; execd is closed then. The
// barrier never writes, so there is nothing else to read.
func (w *watcher) checkExecd() {
	if w.relfd < 0 {
		return
	}
	var b [1]byte
	for {
		n, err := unix.Read(w.relfd, b[:])
		switch {
		case err == unix.EINTR || (err == nil && n > 0):
			continue
		case err == unix.EAGAIN:
			return
		}
		break
	}
	close(w.execd)
	w.closeRelease()
}

// closeRelease stops watching the release socket and closes the copy.
func (w *watcher) closeRelease() {
	if w.relfd < 0 {
		return
	}
	_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, w.relfd, nil)
	unix.Close(w.relfd)
	w.relfd = -1
}

// fallBack ends a watcher whose epoll instance failed (it cannot, short of
// a bug): the streams are closed as if cut, and the leader's exit is awaited
// in a blocking waitid, which keeps leaderDone true to the process.
func (w *watcher) fallBack() {
	w.closeStream(tagStdout)
	w.closeStream(tagStderr)
	w.closeRelease()
	if w.pidfd < 0 {
		return
	}
	var info unix.Siginfo
	for unix.Waitid(unix.P_PIDFD, w.pidfd, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
	w.pidfd = -1
	close(w.leaderDone)
}
