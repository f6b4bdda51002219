package launch

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/testpkg"
)

// holdPipes opens pipes until a new one is given less than the default
// 64 KiB (the user is then past fs.pipe-user-pages-soft), and returns how
// small a new pipe is, or 0 when none got smaller (root is exempt). The
// pipes are closed when the test ends.
func holdPipes(t *testing.T) int {
	var fds []int
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	for range 1500 {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatalf("pipe2 after %d pipes: %v", len(fds)/2, err)
		}
		size, err := unix.FcntlInt(uintptr(p[1]), unix.F_GETPIPE_SZ, 0)
		fds = append(fds, p[0], p[1])
		if err != nil {
			t.Fatal(err)
		}
		if size < 65536 {
			return size
		}
	}
	return 0
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// fdNames lists the open descriptors but pipes, for a failure message.
func fdNames() []string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var names []string
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && !strings.HasPrefix(l, "pipe:") {
			names = append(names, e.Name()+"->"+l)
		}
	}
	return names
}

// [INV-2] [GRP-2]: with the pipes a user past fs.pipe-user-pages-soft gets
// (one or two pages, so even a 4097-byte request leaves a rest for the
// writer), the package still reads the whole request, then end of file; a
// package that never reads it, reads one byte, closes stdin at once, or is
// killed ends like any other; a prepared invocation with a filled pipe
// aborted before its release leaves nothing. No descriptor or goroutine of
// the host outlives any of them.
func TestStdinRestThroughSmallPipe(t *testing.T) {
	f := newFixture(t)
	// One launch first, so the runtime's poller (an epoll and an eventfd,
	// made at first use) is counted before.
	if _, err := Run(context.Background(), f.spec("quick")); err != nil {
		t.Fatal(err)
	}
	before, routines := openFDs(t), runtime.NumGoroutine()
	t.Logf("before: %v", fdNames())
	small := holdPipes(t)
	t.Logf("a new pipe holds %d bytes (0: the default, root is exempt)", small)
	held := openFDs(t) - before
	for _, size := range []int{1, 4096, 4097, 65536, 200000} {
		s := f.spec("stdin")
		s.Stdin = make([]byte, size)
		rand.Read(s.Stdin)
		res, err := Run(context.Background(), s)
		if err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		want := fmt.Sprintf("fifo=true n=%d sha256=%x err=<nil>", size, sha256.Sum256(s.Stdin))
		if string(res.Stdout) != want {
			t.Errorf("stdin: %s\nwant   %s", res.Stdout, want)
		}
	}
	for _, mode := range []string{"quick", "one-byte", "close-stdin"} {
		s := f.spec(mode)
		s.Stdin = bytes.Repeat([]byte("x"), 200000)
		if _, err := Run(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
	}
	s := f.spec("selfkill")
	s.Stdin = bytes.Repeat([]byte("k"), 200000)
	if _, err := Run(context.Background(), s); !errcode.Is(err, errcode.ProcessFailed) {
		t.Fatalf("killed package: %v, want process-failed", err)
	}
	s = f.spec("stdin")
	s.Stdin = bytes.Repeat([]byte("y"), 200000)
	p, err := Prepare(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Abort(); err != nil {
		t.Fatal(err)
	}
	assertNoRecords(t, f.records)
	deadline := time.Now().Add(10 * time.Second)
	for openFDs(t)-held != before || runtime.NumGoroutine() > routines {
		if time.Now().After(deadline) {
			t.Logf("%d goroutines, %d before", runtime.NumGoroutine(), routines)
			t.Fatalf("%d descriptors open, %d before (plus %d held pipes); now %v", openFDs(t)-held, before, held, fdNames())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// [OP-3] [GRP-2]: with only a few descriptors left under the file limit, each
// of the launch's pipes in turn is the one that cannot be made: the launch
// then fails as a host fault (never the package's failure), leaves no record
// and no descriptor, or it succeeds with the whole request read. Not
// parallel: it lowers this process's file limit.
func TestPipesAtFileLimit(t *testing.T) {
	f := newFixture(t)
	if _, err := Run(context.Background(), f.spec("quick")); err != nil {
		t.Fatal(err)
	}
	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	// Fill the gaps below the highest descriptor, so the limit alone
	// says how many are free.
	top := testpkg.TopFD(t)
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if fd > top {
			unix.Close(fd)
			break
		}
		t.Cleanup(func() { unix.Close(fd) })
	}
	before := openFDs(t)
	faults := 0
	for free := 0; free <= 14; free++ {
		s := f.spec("good")
		s.Stdin = bytes.Repeat([]byte("z"), 100000) // more than a pipe holds: a rest
		s.StdoutLimit = 1 << 20
		lim := orig
		lim.Cur = uint64(top + 1 + free)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
		res, err := Run(context.Background(), s)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
			t.Fatal(err)
		}
		switch {
		case err != nil && !errcode.HostFault(err):
			t.Fatalf("%d descriptors free: %v, want a host fault", free, err)
		case err != nil:
			faults++
			t.Logf("%d descriptors free: %v", free, err)
		case !bytes.HasPrefix(res.Stdout, append([]byte("ok:"), s.Stdin...)):
			t.Fatalf("%d descriptors free: stdout %.40q...", free, res.Stdout)
		}
		assertNoRecords(t, f.records)
		if n := openFDs(t); n != before {
			t.Fatalf("%d descriptors free: %d descriptors open after, %d before; now %v", free, n, before, fdNames())
		}
	}
	if faults == 0 {
		t.Fatal("no launch met the file limit")
	}
}

// [GRP-5] [INV-2]: a child that escapes the group with setsid, keeping only
// stdin and never reading it, while the host still holds a rest of the
// request to write: the writer is cut off once the group is gone, so the
// invocation ends at once (no wait for the escaped reader) and the escaped
// process is not signalled.
func TestStdinRestHeldByEscapedChild(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.spec("setsid-stdin")
	s.Stdin = bytes.Repeat([]byte("e"), 200000)
	start := time.Now()
	_, err := Run(context.Background(), s)
	took := time.Since(start)
	escaped := f.reported(t, "escaped")
	t.Cleanup(func() {
		syscall.Kill(escaped.PID, syscall.SIGKILL)
		reapOrphans(t, escaped)
	})
	if err != nil {
		t.Fatal(err)
	}
	if took > 5*time.Second {
		t.Errorf("Run took %v with an escaped holder of stdin", took)
	}
	if live, _ := alive(escaped); !live {
		t.Error("escaped process was signalled")
	}
	assertGroupGone(t, f.reported(t, "leader").PID)
	assertNoRecords(t, f.records)
}
