package testpkg

import (
	"os"
	"strconv"
	"syscall"
	"testing"
)

// TopFD returns the highest descriptor this process has open.
func TopFD(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	top := 0
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			t.Fatalf("/proc/self/fd entry %q", e.Name())
		}
		top = max(top, n)
	}
	return top
}

// StarveFiles leaves this process exactly spare free descriptors: it lowers
// the soft RLIMIT_NOFILE to just above the highest open descriptor and
// fills every lower hole with /dev/null, then closes spare of those. The
// returned function closes the fillers and restores the limit. The whole
// process is affected: call it only from a test that is not parallel, and
// keep the starved section short.
func StarveFiles(t testing.TB, spare int) func() {
	t.Helper()
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	lim := orig
	lim.Cur = uint64(TopFD(t) + 1)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	var fill []int
	for {
		fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			break
		}
		fill = append(fill, fd)
	}
	for range min(spare, len(fill)) {
		syscall.Close(fill[len(fill)-1])
		fill = fill[:len(fill)-1]
	}
	return func() {
		for _, fd := range fill {
			syscall.Close(fd)
		}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
			t.Fatal(err)
		}
	}
}
