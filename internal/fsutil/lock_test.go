package fsutil

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
)

// The lock tests run real processes: this test binary re-executed as a
// holder (FM_LOCK_HOLD=<dir>: take the lock "l", a lock file with data when
// FM_LOCK_DATA is set, say "held", wait to be killed), as a worker (FM_LOCK_WORK=<dir>:<n>: n times, take the lock and
// increment the counter file "count" by a read, a pause and a write) or as a
// noisy neighbour (FM_LOCK_NOISE, see noise).
func TestMain(m *testing.M) {
	if dir := os.Getenv("FM_LOCK_HOLD"); dir != "" {
		d, err := os.Open(dir)
		if err != nil {
			os.Exit(3)
		}
		l, err := Lock(context.Background(), d, "l", LockOptions{Data: os.Getenv("FM_LOCK_DATA") != ""})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		os.Stdout.WriteString("held\n")
		time.Sleep(time.Minute)
		l.Release()
		os.Exit(0)
	}
	if spec := os.Getenv("FM_LOCK_NOISE"); spec != "" {
		os.Exit(noise(spec))
	}
	if spec := os.Getenv("FM_LOCK_WORK"); spec != "" {
		dir, n, _ := strings.Cut(spec, ":")
		count, _ := strconv.Atoi(n)
		os.Exit(work(dir, count))
	}
	os.Exit(m.Run())
}

func work(dir string, n int) int {
	d, err := os.Open(dir)
	if err != nil {
		return 3
	}
	counter := filepath.Join(dir, "count")
	for range n {
		l, err := Lock(context.Background(), d, "l", LockOptions{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		data, _ := os.ReadFile(counter)
		v, _ := strconv.Atoi(string(data))
		time.Sleep(200 * time.Microsecond)
		if err := os.WriteFile(counter, []byte(strconv.Itoa(v+1)), 0o600); err != nil {
			return 3
		}
		l.Release()
	}
	return 0
}

// noise is a noisy neighbour, a serve of many sources in another home:
// spec "<dir>:<fds>:<locks>" opens fds descriptors (of /dev/null) and holds
// the locks "n0" ... of dir, says "held", then for each line "relock <name>"
// on its stdin releases that lock and takes it again through a descriptor of
// another number, and says "ok <old number> <new number>"; for each line
// "lock <dir> <name>" it takes the lock name of dir as well and says
// "ok <number>".
func noise(spec string) int {
	parts := strings.Split(spec, ":")
	if len(parts) != 3 {
		return 3
	}
	fds, _ := strconv.Atoi(parts[1])
	n, _ := strconv.Atoi(parts[2])
	d, err := os.Open(parts[0])
	if err != nil {
		return 3
	}
	var keep []*os.File
	for range fds {
		f, err := os.Open(os.DevNull)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		keep = append(keep, f)
	}
	held := map[string]*Locked{}
	for i := range n {
		name := "n" + strconv.Itoa(i)
		if held[name], err = Lock(context.Background(), d, name, LockOptions{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
	}
	os.Stdout.WriteString("held\n")
	in := bufio.NewScanner(os.Stdin)
	var also []*Locked
	for in.Scan() {
		if spec, ok := strings.CutPrefix(in.Text(), "lock "); ok {
			dir, name, _ := strings.Cut(spec, " ")
			od, err := os.Open(dir)
			if err != nil {
				return 3
			}
			l, err := Lock(context.Background(), od, name, LockOptions{})
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 3
			}
			also = append(also, l)
			fmt.Printf("ok %d\n", l.File().Fd())
			continue
		}
		name, ok := strings.CutPrefix(in.Text(), "relock ")
		if !ok || held[name] == nil {
			return 3
		}
		was := held[name].File().Fd()
		held[name].Release()
		f, _ := os.Open(os.DevNull) // takes the lowest free number: the one just closed
		if held[name], err = Lock(context.Background(), d, name, LockOptions{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		keep = append(keep, f)
		fmt.Printf("ok %d %d\n", was, held[name].File().Fd())
	}
	return 0
}

// neighbour is a running noise process.
type neighbour struct {
	pid string
	in  io.Writer
	out *bufio.Reader
}

// startNoise starts a noisy neighbour holding locks "n0"... of dir, with fds
// more descriptors, until the test ends.
func startNoise(tb testing.TB, dir string, fds, locks int) *neighbour {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("FM_LOCK_NOISE=%s:%d:%d", dir, fds, locks))
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	n := &neighbour{pid: strconv.Itoa(cmd.Process.Pid), in: in, out: bufio.NewReader(out)}
	if line, err := n.out.ReadString('\n'); err != nil || line != "held\n" {
		tb.Fatalf("the neighbour did not take its locks: %q %v", line, err)
	}
	return n
}

func (n *neighbour) relock(t *testing.T, name string) {
	t.Helper()
	fmt.Fprintf(n.in, "relock %s\n", name)
	line, err := n.out.ReadString('\n')
	var was, now int
	if _, serr := fmt.Sscanf(line, "ok %d %d\n", &was, &now); err != nil || serr != nil {
		t.Fatalf("the neighbour did not relock %s: %q %v %v", name, line, err, serr)
	}
	if was == now {
		t.Fatalf("the neighbour relocked %s through the same descriptor %d", name, now)
	}
}

// countScans counts, until the test ends, the listings of /proc/<pid>/fd
// that the orphan look-up makes.
func countScans(t *testing.T, pid string) *atomic.Int64 {
	var n atomic.Int64
	fdScanned = func(p string) {
		if p == pid {
			n.Add(1)
		}
	}
	t.Cleanup(func() { fdScanned = func(string) {} })
	return &n
}

// lockRelease takes and drops the lock name of d, failing the test on error.
func lockRelease(t *testing.T, d *os.File, name string) {
	t.Helper()
	l, err := Lock(context.Background(), d, name, LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
}

// [LIFE-1] [RUN-2] [RUN-4] The orphan look-up's cost does not grow with the
// descriptors of other processes that hold flocks: beside a neighbour with
// 3,000 open descriptors and 300 held locks in the same directory, a warm
// Lock (four at once) lists its /proc/<pid>/fd no more (the uncached look-up lists it on
// every Lock), and the remembered descriptors still find that neighbour an
// orphaned holder once its lock file is removed or moved, and after it took
// a lock again through another descriptor.
func TestLockLookupScansNeighbourOnce(t *testing.T) {
	dir, d := openDir(t)
	os.Mkdir(filepath.Join(dir, "sub"), 0o700)
	nb := startNoise(t, dir, 3000, 300)
	scans := countScans(t, nb.pid)
	lockRelease(t, d, "mine") // warm-up: the neighbour's descriptors are listed once
	if got := scans.Load(); got != 1 {
		t.Fatalf("the first Lock listed the neighbour's descriptors %d times, want 1", got)
	}
	const locks = 20
	scans.Store(0)
	var wg sync.WaitGroup // as serve's runners do: four at once
	for i := range 4 {
		wg.Go(func() {
			for range locks / 4 {
				l, err := Lock(context.Background(), d, "mine"+strconv.Itoa(i), LockOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				l.Release()
			}
		})
	}
	wg.Wait()
	if got := scans.Load(); got != 0 {
		t.Fatalf("%d warm Locks listed the neighbour's descriptors %d times, want 0", locks, got)
	}
	lookupUncached = true
	for range locks {
		lockRelease(t, d, "mine")
	}
	lookupUncached = false
	if got := scans.Load(); got != locks {
		t.Fatalf("%d uncached Locks listed the neighbour's descriptors %d times, want %d", locks, got, locks)
	}
	scans.Store(0)
	try := func(name string) {
		t.Helper()
		if l, err := Lock(context.Background(), d, name, LockOptions{Try: true}); !errors.Is(err, ErrLocked) {
			l.Release()
			t.Fatalf("Try %s beside the neighbour holding its orphan: %v", name, err)
		}
		if held, err := Held(d, name, LockOptions{}); !held || err != nil {
			t.Fatalf("Held %s beside the neighbour holding its orphan: %v %v", name, held, err)
		}
	}
	os.Remove(filepath.Join(dir, "n0"))
	try("n0")
	os.Rename(filepath.Join(dir, "n1"), filepath.Join(dir, "sub", "n1"))
	try("n1")
	os.WriteFile(filepath.Join(dir, "n2.new"), nil, 0o600)
	os.Rename(filepath.Join(dir, "n2.new"), filepath.Join(dir, "n2"))
	try("n2")
	if got := scans.Load(); got != 0 {
		t.Fatalf("finding the orphans listed the neighbour's descriptors %d times, want 0", got)
	}
	nb.relock(t, "n3")
	os.Remove(filepath.Join(dir, "n3"))
	try("n3")
	if got := scans.Load(); got != 1 {
		t.Fatalf("after the neighbour relocked, the look-up listed its descriptors %d times, want 1", got)
	}
}

// [LIFE-1] [RUN-4] A holder of locks on another file system is never
// listed: a lock file removed or moved stays on its file system, so Lock
// skips the /proc/locks entries on another device than its own lock's.
func TestLockLookupSkipsOtherDevice(t *testing.T) {
	dir, d := openDir(t)
	other, err := os.MkdirTemp("/dev/shm", "fm-lock-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	var a, b syscall.Stat_t
	if syscall.Stat(dir, &a) != nil || syscall.Stat(other, &b) != nil || a.Dev == b.Dev {
		t.Skip("/dev/shm is on the file system of the test's directory")
	}
	nb := startNoise(t, other, 100, 10)
	scans := countScans(t, nb.pid)
	for range 5 {
		lockRelease(t, d, "mine")
	}
	if got := scans.Load(); got != 0 {
		t.Fatalf("Lock listed the descriptors of a holder on another file system %d times", got)
	}
}

// [LIFE-1] [RUN-4] A file of another file system mounted over a held lock
// file does not let a second holder in: the device filter is not used where
// the contender's own lock is on another device than its directory (root
// only: it mounts).
func TestLockHoldsWhenFileMountedOver(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir, d := openDir(t)
	other, err := os.MkdirTemp("/dev/shm", "fm-lock-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	over := filepath.Join(other, "over")
	if err := os.WriteFile(over, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	holdLock(t, dir)
	if out, err := exec.Command("mount", "--bind", over, filepath.Join(dir, "l")).CombinedOutput(); err != nil {
		t.Skipf("cannot bind-mount: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", filepath.Join(dir, "l")).Run() })
	if l, err := Lock(context.Background(), d, "l", LockOptions{Try: true}); !errors.Is(err, ErrLocked) {
		l.Release()
		t.Fatalf("Try beside the holder of the file under the mount: %v", err)
	}
}

// [LIFE-1] [RUN-4] The remembered descriptors of a holder are told apart by
// device, not by inode number alone: two file systems give the same inode
// numbers (two fresh tmpfs mounts do, by construction), and a neighbour that
// holds a lock on one and then the lock of the same inode number on the
// other, removed since, is still found an orphaned holder by Lock and Held
// (root only: it mounts).
func TestLockLookupInodeOnTwoDevices(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	_, top := openDir(t)
	var dirs [2]string
	for i := range dirs {
		dirs[i] = filepath.Join(top.Name(), strconv.Itoa(i))
		if err := os.Mkdir(dirs[i], 0o700); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "mode=0700", "fm-test", dirs[i]).CombinedOutput(); err != nil {
			t.Skipf("cannot mount a tmpfs: %v %s", err, out)
		}
		t.Cleanup(func() { exec.Command("umount", "-l", dirs[i]).Run() })
	}
	nb := startNoise(t, dirs[0], 0, 1) // holds n0 of the first tmpfs
	d0, err := os.Open(dirs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer d0.Close()
	lockRelease(t, d0, "mine") // remembers the neighbour's descriptor on n0
	fmt.Fprintf(nb.in, "lock %s n0\n", dirs[1])
	if line, err := nb.out.ReadString('\n'); err != nil || !strings.HasPrefix(line, "ok ") {
		t.Fatalf("the neighbour did not take the second lock: %q %v", line, err)
	}
	var a, b syscall.Stat_t
	if syscall.Stat(filepath.Join(dirs[0], "n0"), &a) != nil || syscall.Stat(filepath.Join(dirs[1], "n0"), &b) != nil || a.Ino != b.Ino || a.Dev == b.Dev {
		t.Skipf("the two tmpfs lock files are not one inode number on two devices: %d/%d %d/%d", a.Dev, a.Ino, b.Dev, b.Ino)
	}
	if err := os.Remove(filepath.Join(dirs[1], "n0")); err != nil {
		t.Fatal(err)
	}
	d1, err := os.Open(dirs[1])
	if err != nil {
		t.Fatal(err)
	}
	defer d1.Close()
	if held, err := Held(d1, "n0", LockOptions{}); err != nil || !held {
		t.Errorf("Held beside the orphaned holder of an inode number also held on another device: %v %v", held, err)
	}
	if l, err := Lock(context.Background(), d1, "n0", LockOptions{Try: true}); !errors.Is(err, ErrLocked) {
		l.Release()
		t.Fatalf("Try beside the orphaned holder of an inode number also held on another device: %v", err)
	}
}

// [LIFE-1] [RUN-4] [WAKE-1] A holder that locked the file through a bind
// mount of its directory names it by the mount's path, yet it is still
// found an orphaned holder once the file is removed: for a lock file with
// data (the wake queue), which has no tag to find it by, as for a tagged one
// (root only: it mounts).
func TestLockHoldsThroughBindMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	for _, data := range []bool{false, true} {
		t.Run(fmt.Sprintf("data %v", data), func(t *testing.T) {
			dir, d := openDir(t)
			mnt, _ := openDir(t)
			if out, err := exec.Command("mount", "--bind", dir, mnt).CombinedOutput(); err != nil {
				t.Skipf("cannot bind-mount: %v %s", err, out)
			}
			t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
			if data {
				t.Setenv("FM_LOCK_DATA", "1")
			}
			holder := holdLock(t, mnt)
			if err := os.Remove(filepath.Join(dir, "l")); err != nil {
				t.Fatal(err)
			}
			o := LockOptions{Data: data}
			if held, err := Held(d, "l", o); !held || err != nil {
				t.Errorf("Held beside a holder through a bind mount of the removed lock file: %v %v", held, err)
			}
			o.Try = true
			if l, err := Lock(context.Background(), d, "l", o); !errors.Is(err, ErrLocked) {
				l.Release()
				t.Fatalf("Try beside a holder through a bind mount of the removed lock file: %v", err)
			}
			holder.Process.Kill()
			holder.Wait()
			l, err := Lock(context.Background(), d, "l", o)
			if err != nil {
				t.Fatalf("after the holder was gone: %v", err)
			}
			l.Release()
		})
	}
}

// [LIFE-1] [RUN-4] An orphaned holder is found while other locks come and go
// (serve's polls take and drop claims all the time): /proc/locks lists the
// newest lock first, so a read of it in pieces can skip the orphan's line
// when locks listed before it are dropped in between. A neighbour holds 20
// locks, 30 goroutines take and drop locks of their own names, and 8
// contenders make 25 Try each beside the orphaned holder.
func TestLockOrphanAmidChurn(t *testing.T) {
	dir, d := openDir(t)
	holdLock(t, dir)
	if err := os.Remove(filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	startNoise(t, dir, 0, 20)
	done := make(chan struct{})
	var churn sync.WaitGroup
	for g := range 30 {
		churn.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				lockRelease(t, d, "c"+strconv.Itoa(g))
			}
		})
	}
	var wg sync.WaitGroup
	var taken atomic.Int64
	for range 8 {
		wg.Go(func() {
			for range 25 {
				if l, err := Lock(context.Background(), d, "l", LockOptions{Try: true}); !errors.Is(err, ErrLocked) {
					taken.Add(1)
					l.Release()
				}
			}
		})
	}
	wg.Wait()
	close(done)
	churn.Wait()
	if n := taken.Load(); n > 0 {
		t.Fatalf("%d of 200 Try took the lock beside the orphaned holder", n)
	}
}

// holdLock starts a process that holds the lock "l" of dir until it is killed.
func holdLock(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FM_LOCK_HOLD="+dir)
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "held\n" {
		t.Fatalf("the holder did not take the lock: %q %v", line, err)
	}
	return cmd
}

func openDir(t *testing.T) (string, *os.File) {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return dir, d
}

// [LIFE-1] [RUN-2] [RUN-4] [WAKE-1] A lock is held only on the file at its
// name, and removing or replacing that file never lets a second holder in:
// with a live holder, a Try finds the lock held, a wait ends only with its
// context (process-failed, ErrInterrupted), and Held sees the holder, both
// while the file is in place and after it was removed or replaced; once the
// holder dies the lock is free at once.
func TestLockHoldsWhenFileSpoiled(t *testing.T) {
	for _, spoil := range []string{"", "removed", "replaced"} {
		t.Run("file "+spoil, func(t *testing.T) {
			dir, d := openDir(t)
			holder := holdLock(t, dir)
			path := filepath.Join(dir, "l")
			switch spoil {
			case "removed":
				os.Remove(path)
			case "replaced":
				os.WriteFile(path+".new", nil, 0o600)
				os.Rename(path+".new", path)
			}
			if l, err := Lock(context.Background(), d, "l", LockOptions{Try: true}); !errors.Is(err, ErrLocked) {
				l.Release()
				t.Fatalf("Try beside a live holder: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			start := time.Now()
			l, err := Lock(ctx, d, "l", LockOptions{What: "test lock"})
			cancel()
			if !errcode.Is(err, errcode.ProcessFailed) || !errors.Is(err, ErrInterrupted) || !strings.Contains(err.Error(), "test lock") {
				l.Release()
				t.Fatalf("a wait beside a live holder: %v", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("the cancelled wait took %s", d)
			}
			if held, err := Held(d, "l", LockOptions{}); !held || err != nil {
				t.Fatalf("Held: %v %v", held, err)
			}
			holder.Process.Kill()
			holder.Wait()
			if held, err := Held(d, "l", LockOptions{}); held || err != nil {
				t.Fatalf("Held after the holder died: %v %v", held, err)
			}
			l, err = Lock(context.Background(), d, "l", LockOptions{Try: true})
			if err != nil {
				t.Fatalf("after the holder died: %v", err)
			}
			l.Release()
		})
	}
}

// [LIFE-1] [RUN-4] [WAKE-1] Mutual exclusion holds while the lock file is
// removed and replaced every 1-5 ms: 4 worker processes each increment a
// counter 25 times under the lock, by read, pause and write, while this
// process keeps removing the lock file and renaming new files over it. No
// increment is lost.
func TestLockExclusiveUnderSwaps(t *testing.T) {
	dir, _ := openDir(t)
	const workers, each = 4, 25
	stop := swapLoop(dir, time.Millisecond)
	var cmds []*exec.Cmd
	for range workers {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("FM_LOCK_WORK=%s:%d", dir, each))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("worker: %v", err)
		}
	}
	swaps := stop()
	data, _ := os.ReadFile(filepath.Join(dir, "count"))
	if got, _ := strconv.Atoi(string(data)); got != workers*each {
		t.Fatalf("the counter is %d after %d increments under the lock (%d swaps): two workers held it at once", got, workers*each, swaps)
	}
	t.Logf("%d increments, %d removals and replacements of the lock file, none lost", workers*each, swaps)
}

// swapLoop keeps removing the lock file "l" of dir and renaming new files
// over it, pausing 1 to 5 times unit in between, until stop is called;
// stop returns the number of swaps.
func swapLoop(dir string, unit time.Duration) (stop func() int) {
	done := make(chan struct{})
	var swaps int
	var wg sync.WaitGroup
	wg.Go(func() {
		path := filepath.Join(dir, "l")
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if i%2 == 0 {
				os.Remove(path)
			} else {
				os.WriteFile(path+".new", nil, 0o600)
				os.Rename(path+".new", path)
			}
			swaps++
			time.Sleep(time.Duration(1+i%5) * unit)
		}
	})
	return func() int {
		close(done)
		wg.Wait()
		return swaps
	}
}

// [LIFE-1] [RUN-4] [WAKE-1] Mutual exclusion holds between the goroutines of
// one process too (serve takes claims from many at once) while the lock file
// is removed and replaced every 0.1-0.5 ms: 16 goroutines each take the lock
// 100 times, and never two are inside at once. Two Locks of one process
// could otherwise both find no lock of the process on the name, one on the
// file just replaced, and both return.
func TestLockExclusiveUnderSwapsInProcess(t *testing.T) {
	dir, d := openDir(t)
	stop := swapLoop(dir, 100*time.Microsecond)
	var inside, most atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 100 {
				l, err := Lock(context.Background(), d, "l", LockOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(20 * time.Microsecond)
				inside.Add(-1)
				l.Release()
			}
		})
	}
	wg.Wait()
	swaps := stop()
	if n := most.Load(); n != 1 {
		t.Fatalf("%d goroutines held the lock at once (%d swaps)", n, swaps)
	}
	t.Logf("1,600 locks, %d removals and replacements of the lock file, never two inside", swaps)
}

// [LIFE-1] [HOME-3] The lock file rule: created 0600 whatever the umask; a
// symlink, a FIFO, a directory or a file of another mode at the name is
// refused, never followed or used.
func TestLockFileRule(t *testing.T) {
	dir, d := openDir(t)
	old := syscall.Umask(0o077 | 0o200)
	l, err := Lock(context.Background(), d, "new", LockOptions{})
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	if fi, err := os.Lstat(filepath.Join(dir, "new")); err != nil || fi.Mode() != 0o600 {
		t.Fatalf("created lock file: %v %v", fi, err)
	}
	os.WriteFile(filepath.Join(dir, "target"), nil, 0o600)
	os.Symlink(filepath.Join(dir, "target"), filepath.Join(dir, "link"))
	syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600)
	os.WriteFile(filepath.Join(dir, "wide"), nil, 0o644)
	os.Chmod(filepath.Join(dir, "wide"), 0o644)
	os.Mkdir(filepath.Join(dir, "sub"), 0o700)
	for name, code := range map[string]errcode.Code{"link": errcode.LinkUnsafe, "fifo": errcode.PathUnsafe, "wide": errcode.ModeUnsafe, "sub": errcode.Internal} {
		if l, err := Lock(context.Background(), d, name, LockOptions{}); errcode.Of(err) != code {
			l.Release()
			t.Errorf("%s: %v, want %s", name, err, code)
		}
	}
	if held, err := Probe(d, "link", LockOptions{}); held || !errcode.Is(err, errcode.LinkUnsafe) {
		t.Errorf("Probe of a link: %v %v", held, err)
	}
	if held, err := Probe(d, "absent", LockOptions{}); held || err != nil {
		t.Errorf("Probe of an absent file: %v %v", held, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "absent")); !os.IsNotExist(err) {
		t.Error("Probe created the file")
	}
}

// BenchmarkLock is one uncontended Lock and Release: open, flock, the
// identity proof and the orphan look-up through /proc/locks.
func BenchmarkLock(b *testing.B) {
	dir, err := os.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer dir.Close()
	for b.Loop() {
		l, err := Lock(context.Background(), dir, "l", LockOptions{})
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
	}
}

// BenchmarkLockNeighbour is BenchmarkLock beside no other holder and beside
// a noisy neighbour (a serve of 1,000 sources: 8,000 descriptors and 1,000
// held locks, in another directory of the same file system), with the orphan
// look-up as before its cache (uncached: every descriptor of every other
// holder is stat'ed on each Lock) and as now.
func BenchmarkLockNeighbour(b *testing.B) {
	for _, noisy := range []bool{false, true} {
		for _, uncached := range []bool{true, false} {
			name := fmt.Sprintf("neighbour=%v/uncached=%v", noisy, uncached)
			b.Run(name, func(b *testing.B) {
				if noisy {
					startNoise(b, b.TempDir(), 8000, 1000)
				}
				dir, err := os.Open(b.TempDir())
				if err != nil {
					b.Fatal(err)
				}
				defer dir.Close()
				lookupUncached = uncached
				defer func() { lookupUncached = false }()
				for b.Loop() {
					l, err := Lock(context.Background(), dir, "l", LockOptions{})
					if err != nil {
						b.Fatal(err)
					}
					l.Release()
				}
			})
		}
	}
}

// [LIFE-1] [RUN-2] [RUN-4] A lock file moved to another name while held
// (mv serve.lock serve.lock.old, in its directory or out of it) never lets a
// second holder in: a Try finds the lock held and Held sees the holder, for a
// holder in another process and for one in this process, and once the holder
// is gone the lock is free. An empty lock file of an earlier fm gets its tag
// when it is next held, so that it too is found once moved.
func TestLockHoldsWhenFileMoved(t *testing.T) {
	for _, c := range []struct{ name, to string }{{"in its directory", "l.old"}, {"out of it", "sub/l"}, {"empty, earlier fm", "l.old"}} {
		for _, here := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, holder in this process %v", c.name, here), func(t *testing.T) {
				dir, d := openDir(t)
				os.Mkdir(filepath.Join(dir, "sub"), 0o700)
				if c.name == "empty, earlier fm" {
					os.WriteFile(filepath.Join(dir, "l"), nil, 0o600)
				}
				var release func()
				if here {
					l, err := Lock(context.Background(), d, "l", LockOptions{})
					if err != nil {
						t.Fatal(err)
					}
					release = l.Release
				} else {
					holder := holdLock(t, dir)
					release = func() { holder.Process.Kill(); holder.Wait() }
				}
				if err := os.Rename(filepath.Join(dir, "l"), filepath.Join(dir, c.to)); err != nil {
					t.Fatal(err)
				}
				if l, err := Lock(context.Background(), d, "l", LockOptions{Try: true}); !errors.Is(err, ErrLocked) {
					l.Release()
					t.Fatalf("Try beside a live holder of the moved lock file: %v", err)
				}
				if held, err := Held(d, "l", LockOptions{}); !held || err != nil {
					t.Fatalf("Held beside a live holder of the moved lock file: %v %v", held, err)
				}
				release()
				l, err := Lock(context.Background(), d, "l", LockOptions{Try: true})
				if err != nil {
					t.Fatalf("after the holder was gone: %v", err)
				}
				l.Release()
			})
		}
	}
}
