package fsutil

import (
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// holdDirSyncs makes every fsyncDir sync of the directory with inode ino
// wait for release, and counts the syncs of it.
func holdDirSyncs(t *testing.T, ino uint64) (count *atomic.Int32, started chan struct{}, release func()) {
	count, started = new(atomic.Int32), make(chan struct{}, 100)
	gate := make(chan struct{})
	dirSynced = func(fd int) {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil && st.Ino == ino {
			count.Add(1)
			started <- struct{}{}
			<-gate
		}
	}
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(func() { release(); dirSynced = nil })
	return count, started, release
}

func openTestDir(t *testing.T) (*os.File, uint64) {
	t.Helper()
	f, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return f, st.Ino
}

// [CAP-1] Concurrent writers of one directory share its fsyncs, but none
// is answered by a sync that began before it asked: a caller that asks
// while a sync is in progress waits for a sync of its own time, which the
// other callers of that time share. Another directory is never covered by
// this one's sync, nor held up by it. Nothing is left behind.
func TestDirSyncsShared(t *testing.T) {
	a, inoA := openTestDir(t)
	b, _ := openTestDir(t)
	count, started, release := holdDirSyncs(t, inoA)
	first := make(chan error, 1)
	go func() { first <- fsyncDir(int(a.Fd())) }()
	<-started // a sync of a is in progress, held

	later := make(chan error, 8)
	for range 8 {
		// A second descriptor of the same directory: shared by inode.
		go func() {
			f, err := os.Open(a.Name())
			if err != nil {
				later <- err
				return
			}
			defer f.Close()
			later <- fsyncDir(int(f.Fd()))
		}()
	}
	if err := fsyncDir(int(b.Fd())); err != nil {
		t.Fatalf("sync of another directory: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-later:
		t.Fatalf("a caller returned (%v) while the only sync of its directory had begun before it asked", err)
	default:
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range 8 {
		if err := <-later; err != nil {
			t.Fatal(err)
		}
	}
	if n := count.Load(); n < 2 || n > 3 {
		t.Fatalf("%d syncs of the directory for 9 callers, want 2 (the held one and one shared by the 8)", n)
	}
	dirSyncs.mu.Lock()
	defer dirSyncs.mu.Unlock()
	if len(dirSyncs.m) != 0 {
		t.Fatalf("%d directory entries left behind", len(dirSyncs.m))
	}
}
