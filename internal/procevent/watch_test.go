package procevent

import (
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// received reports whether c gets a wake within d.
func received(c <-chan struct{}, d time.Duration) bool {
	select {
	case <-c:
		return true
	case <-time.After(d):
		return false
	}
}

// [RUN-2], [REG-4] The registry watch wakes a poll's stop watcher when a
// retire touches the stop file's mode, and serve's rescan when a registration
// appears or goes, but not for the lock files every poll creates and closes.
func TestRegistryWatchEvents(t *testing.T) {
	// No safety look during the test: every wake below is an event's.
	dir, reg, w := watchedDir(t, time.Hour)
	w2, err := watchRegistry(reg) // a second user shares the one watch
	if err != nil {
		t.Fatal(err)
	}
	if w2 != w {
		t.Fatal("a second watch of the same directory was not shared")
	}
	w2.release()

	stopA, stopB := make(chan struct{}, 1), make(chan struct{}, 1)
	endA := w.onStop("a", func() { notify(stopA) })
	defer endA()
	endB := w.onStop("b", func() { notify(stopB) })
	defer endB()
	changed, endC := w.onChange()
	defer endC()

	// Lock files of a poll come and go: no wake.
	for _, n := range []string{"a.claim", "a.stop", "b.stop"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if received(changed, 300*time.Millisecond) {
		t.Fatal("creating lock files woke the rescan")
	}
	// Creating a.stop and b.stop may have woken their watchers (a look
	// costs nothing); drain, then only a's stop request must wake a.
	received(stopA, 100*time.Millisecond)
	received(stopB, 100*time.Millisecond)
	if err := os.Chmod(filepath.Join(dir, "a.stop"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !received(stopA, 10*time.Second) {
		t.Fatal("a stop request (fchmod of a.stop) did not wake a's watcher")
	}
	if received(stopB, 300*time.Millisecond) {
		t.Fatal("a's stop request woke b's watcher")
	}

	// A registration appearing (published by rename) and going wakes the
	// rescan.
	tmp := filepath.Join(dir, ".tmp-x")
	if err := os.WriteFile(tmp, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "x.source")); err != nil {
		t.Fatal(err)
	}
	if !received(changed, 10*time.Second) {
		t.Fatal("a new registration did not wake the rescan")
	}
	if err := os.Remove(filepath.Join(dir, "x.source")); err != nil {
		t.Fatal(err)
	}
	if !received(changed, 10*time.Second) {
		t.Fatal("a removed registration did not wake the rescan")
	}

	// An ended subscription is not woken (and does not block the watch).
	endA()
	if err := os.Chmod(filepath.Join(dir, "a.stop"), 0o600); err != nil {
		t.Fatal(err)
	}
	if received(stopA, 300*time.Millisecond) {
		t.Fatal("an ended subscription was woken")
	}
}

// [RUN-2] Without any event, the watch still makes every stop watcher look
// each safetyPoll: a request whose event was lost is seen within that bound.
func TestRegistryWatchSafetyLook(t *testing.T) {
	_, _, w := watchedDir(t, 50*time.Millisecond)
	looked := make(chan struct{}, 1)
	end := w.onStop("quiet", func() { notify(looked) })
	defer end()
	if !received(looked, 10*time.Second) {
		t.Fatal("no safety look without events")
	}
}

// [RUN-2], [REG-4] A lost event (the kernel's queue overflowed) or a watch the
// kernel dropped (the directory went) wakes every stop watcher and the
// rescan: the events that were lost may have been any of them.
func TestRegistryWatchOverflowWakesAll(t *testing.T) {
	_, _, w := watchedDir(t, time.Hour)
	for _, mask := range []uint32{unix.IN_Q_OVERFLOW, unix.IN_IGNORED} {
		stopA, stopB := make(chan struct{}, 1), make(chan struct{}, 1)
		endA := w.onStop("a", func() { notify(stopA) })
		endB := w.onStop("b", func() { notify(stopB) })
		changed, endC := w.onChange()
		ev := make([]byte, unix.SizeofInotifyEvent)
		(*unix.InotifyEvent)(unsafe.Pointer(&ev[0])).Wd = -1
		(*unix.InotifyEvent)(unsafe.Pointer(&ev[0])).Mask = mask
		w.dispatch(ev)
		if !received(stopA, time.Second) || !received(stopB, time.Second) || !received(changed, time.Second) {
			t.Errorf("event %#x did not wake every watcher", mask)
		}
		endA()
		endB()
		endC()
	}
}

// watchedDir opens a new directory and watches it as a registry, with the
// safety look every poll; the watch, the directory handle and safetyPoll
// are put back when the test ends. Not for parallel tests: safetyPoll is
// the package's.
func watchedDir(t *testing.T, poll time.Duration) (string, *os.File, *regWatch) {
	t.Helper()
	old := safetyPoll
	safetyPoll = poll
	t.Cleanup(func() { safetyPoll = old })
	dir := t.TempDir()
	reg, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	w, err := watchRegistry(reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.release)
	return dir, reg, w
}
