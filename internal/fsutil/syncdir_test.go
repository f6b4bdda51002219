package fsutil

import (
	"os"
	"path/filepath"
	"strconv"
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

// [CAP-1] Hostile review of shared directory syncs: 2000 concurrent callers
// over four directories (each through its own descriptor), plus callers of
// directories removed while others of a reused name sync, all return; each
// returns only after a sync of its own directory that began after its change
// was published; and no entry is left behind.
func TestDirSyncsManyCallers(t *testing.T) {
	var clock atomic.Uint64
	var mu sync.Mutex
	latest := map[uint64]uint64{} // inode -> clock at the latest sync's start
	dirSynced = func(fd int) {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil {
			return
		}
		now := clock.Add(1)
		mu.Lock()
		latest[st.Ino] = max(latest[st.Ino], now)
		mu.Unlock()
	}
	t.Cleanup(func() { dirSynced = nil })
	root := t.TempDir()
	var dirs []string
	for i := range 4 {
		d := filepath.Join(root, strconv.Itoa(i))
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 2000 {
		wg.Go(func() {
			<-start
			dir := dirs[i%len(dirs)]
			if i%10 == 9 {
				// A directory made, published into, removed: its inode
				// may be reused by the next one of that name.
				dir = filepath.Join(root, "gone"+strconv.Itoa(i%7))
				if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
					t.Error(err)
					return
				}
			}
			f, err := os.Open(dir)
			if err != nil {
				if !os.IsNotExist(err) {
					t.Error(err)
				}
				return
			}
			defer f.Close()
			var st unix.Stat_t
			if err := unix.Fstat(int(f.Fd()), &st); err != nil {
				t.Error(err)
				return
			}
			if err := unix.Mkdirat(int(f.Fd()), "e"+strconv.Itoa(i), 0o700); err != nil && err != unix.ENOENT {
				t.Error(err)
				return
			}
			if i%10 == 9 {
				os.RemoveAll(dir)
			}
			published := clock.Add(1)
			if err := fsyncDir(int(f.Fd())); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			synced := latest[st.Ino]
			mu.Unlock()
			if synced < published {
				t.Errorf("caller %d returned with no sync of its directory begun after its change (%d < %d)", i, synced, published)
			}
		})
	}
	close(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("2000 callers still waiting after 2 minutes")
	}
	dirSyncs.mu.Lock()
	defer dirSyncs.mu.Unlock()
	if len(dirSyncs.m) != 0 {
		t.Fatalf("%d directory entries left behind", len(dirSyncs.m))
	}
}
