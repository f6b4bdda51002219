package procevent

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Registry events [RUN-2], [REG-4].
//
// A running poll must learn of a retire's stop request, and serve of a new or
// retired registration, without looking again and again: with hundreds of
// sources in flight, a look every 100 ms per poll was most of an idle serve's
// CPU. So every process watches each registry directory it works in with one
// inotify(7) instance, shared by all its polls and its supervisor:
//
//   - a retire that holds a source's stop lock (see claim.go) changes the stop
//     file's mode bits to what they already are (fchmod 0600), which the
//     kernel reports as IN_ATTRIB of "<id>.stop": the watchers of id look at
//     the lock at once;
//   - a registration created, moved in or out, or removed wakes serve's
//     rescan (claim and stop lock files come and go with every poll; they
//     do not).
//
// Events only say "look now": every decision is still made from the lock or
// the directory itself, so a spurious event costs one look and nothing else.
// A lost event (the kernel's queue overflowed) wakes every watcher; a watcher
// that could not be set up (no inotify, no descriptor left) falls back to
// looking every stopPoll. The watch also makes every stop watcher look every
// safetyPoll, so even an event the kernel never sent is seen within that
// bound.

// regWatch is the inotify watch of one registry directory in this process.
type regWatch struct {
	key  [2]uint64 // the directory's device and inode
	f    *os.File  // the inotify descriptor, read through the runtime poller
	refs int       // under watchMu

	mu      sync.Mutex
	stops   map[string]map[*func()]struct{} // source id -> stop watchers' looks
	changes map[chan struct{}]struct{}      // rescan watchers
	quit    chan struct{}                   // closed by the last release
}

var (
	watchMu sync.Mutex
	watches = map[[2]uint64]*regWatch{}
)

// watchRegistry returns this process's watch of the registry directory reg,
// starting it on first use; release it when done.
func watchRegistry(reg *os.File) (*regWatch, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(reg.Fd()), &st); err != nil {
		return nil, err
	}
	key := [2]uint64{st.Dev, st.Ino}
	watchMu.Lock()
	defer watchMu.Unlock()
	if w := watches[key]; w != nil {
		w.refs++
		return w, nil
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	// The pinned handle names the exact directory, whatever its path is now.
	path := "/proc/self/fd/" + strconv.Itoa(int(reg.Fd()))
	mask := uint32(unix.IN_ATTRIB | unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_DELETE | unix.IN_ONLYDIR)
	if _, err := unix.InotifyAddWatch(fd, path, mask); err != nil {
		unix.Close(fd)
		return nil, err
	}
	w := &regWatch{key: key, f: os.NewFile(uintptr(fd), "inotify"), refs: 1,
		stops: map[string]map[*func()]struct{}{}, changes: map[chan struct{}]struct{}{}, quit: make(chan struct{})}
	watches[key] = w
	go w.run()
	go w.safety()
	return w, nil
}

// release drops one use of w; the last one stops it.
func (w *regWatch) release() {
	watchMu.Lock()
	defer watchMu.Unlock()
	if w.refs--; w.refs == 0 {
		delete(watches, w.key)
		close(w.quit) // ends safety
		w.f.Close()   // ends run
	}
}

// onStop makes w call look whenever a stop request for id may have been
// made, and every safetyPoll; it returns the function that ends that. The
// calls are made one at a time, never after end returns, from the watch's
// own goroutines, so a poll needs no goroutine of its own to wait for a stop
// request: look must be quick and must not block.
func (w *regWatch) onStop(id string, look func()) (end func()) {
	p := &look
	w.mu.Lock()
	if w.stops[id] == nil {
		w.stops[id] = map[*func()]struct{}{}
	}
	w.stops[id][p] = struct{}{}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.stops[id], p)
		if len(w.stops[id]) == 0 {
			delete(w.stops, id)
		}
	}
}

// safety calls every look each safetyPoll, until the last release.
func (w *regWatch) safety() {
	t := time.NewTicker(safetyPoll)
	defer t.Stop()
	for {
		select {
		case <-w.quit:
			return
		case <-t.C:
			w.wakeAll()
		}
	}
}

// onChange returns a channel that receives when an entry of the registry may
// have appeared or gone, and a function that ends the subscription.
func (w *regWatch) onChange() (<-chan struct{}, func()) {
	c := make(chan struct{}, 1)
	w.mu.Lock()
	w.changes[c] = struct{}{}
	w.mu.Unlock()
	return c, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.changes, c)
	}
}

// notify wakes c without blocking; one pending wake is enough.
func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// run reads events until the descriptor is closed. Should reading fail for
// another reason, every watcher is woken and falls back to its safety look.
func (w *regWatch) run() {
	buf := make([]byte, 4096)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			w.wakeAll()
			return
		}
		w.dispatch(buf[:n])
	}
}

// dispatch wakes the watchers that the events in b concern.
func (w *regWatch) dispatch(b []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	changed := false
	lost := false
	inotifyEvents(b, func(mask uint32, name string) bool {
		if mask&(unix.IN_Q_OVERFLOW|unix.IN_IGNORED) != 0 {
			lost = true
			return false
		}
		if id, ok := strings.CutSuffix(name, stopSuffix); ok {
			for look := range w.stops[id] {
				(*look)()
			}
		} else if strings.HasSuffix(name, sourceSuffix) {
			changed = true
		}
		return true
	})
	if lost {
		w.wakeAllLocked()
		return
	}
	if changed {
		for c := range w.changes {
			notify(c)
		}
	}
}

// inotifyEvents calls f with the mask and the name of each whole event in b
// (as read(2) returns them from an inotify descriptor), in order, while f
// returns true. It reports false if b ends in a partial event.
func inotifyEvents(b []byte, f func(mask uint32, name string) bool) bool {
	for len(b) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := unix.SizeofInotifyEvent + int(ev.Len)
		if end > len(b) {
			return false
		}
		name := strings.TrimRight(string(b[unix.SizeofInotifyEvent:end]), "\x00")
		b = b[end:]
		if !f(ev.Mask, name) {
			return true
		}
	}
	return true
}

func (w *regWatch) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wakeAllLocked()
}

func (w *regWatch) wakeAllLocked() {
	for _, looks := range w.stops {
		for look := range looks {
			(*look)()
		}
	}
	for c := range w.changes {
		notify(c)
	}
}
