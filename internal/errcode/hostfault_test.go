package errcode

import (
	"errors"
	"os"
	"runtime/debug"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// [OP-3] [CLI-3] every host resource errno, wrapped as any call site wraps
// it, under any code, is host-resource; other errnos keep the site's code,
// and EAGAIN is a host fault only from a process start.
func TestHostFaultErrnos(t *testing.T) {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOSPC, syscall.EDQUOT, syscall.ENOMEM, syscall.EFBIG} {
		cause := &os.PathError{Op: "open", Path: "/x", Err: e}
		for _, code := range []Code{PathUnsafe, PackageInvalid, HomeInvalid, IntegrityMismatch, ProcessFailed, Internal} {
			if got := Of(Wrap(code, cause, "x")); got != HostResource {
				t.Errorf("%v under %s: %s", e, code, got)
			}
		}
		if got := Of(cause); got != HostResource {
			t.Errorf("uncoded %v: %s", e, got)
		}
		if got := Of(&Error{Code: ProcessFailed, Msg: "x", Err: cause}); got != HostResource {
			t.Errorf("literal error with %v: %s", e, got)
		}
	}
	for _, e := range []syscall.Errno{syscall.EACCES, syscall.ENOENT, syscall.EAGAIN, syscall.EINTR} {
		if got := Of(Wrap(PathUnsafe, e, "x")); got != PathUnsafe {
			t.Errorf("%v: %s, want path-unsafe", e, got)
		}
	}
	for _, e := range []syscall.Errno{syscall.EAGAIN, syscall.EBADF} {
		if got := Of(Wrap(ProcessFailed, Spawn(e), "fork")); got != HostResource {
			t.Errorf("%v from a spawn: %s", e, got)
		}
	}
	if got := Of(Wrap(Internal, syscall.EBADF, "x")); got != Internal {
		t.Errorf("EBADF elsewhere: %s", got)
	}
	if got := Of(Wrap(ProcessFailed, Spawn(syscall.ENOENT), "fork")); got != ProcessFailed {
		t.Errorf("ENOENT from a spawn: %s", got)
	}
	if Spawn(nil) != nil {
		t.Error("Spawn(nil) is not nil")
	}
	if err := Wrap(PathUnsafe, syscall.EMFILE, "x"); err.Code != HostResource {
		t.Errorf("Wrap kept code %s", err.Code)
	}
}

// [OP-3] EAGAIN on fork for real: under RLIMIT_NPROC of 1 (as a user the
// limit binds: root is exempt) a fork fails with EAGAIN, and marked as a
// spawn it is host-resource.
func TestSpawnEAGAINForReal(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root is exempt from RLIMIT_NPROC; run as uid 65534 (scripts/test-unprivileged.sh)")
	}
	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &orig); err != nil {
		t.Fatal(err)
	}
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no new runtime threads in the window
	lim := orig
	lim.Cur = 1
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &lim); err != nil {
		t.Fatal(err)
	}
	_, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{})
	if rerr := unix.Setrlimit(unix.RLIMIT_NPROC, &orig); rerr != nil {
		t.Fatal(rerr)
	}
	if !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("fork under RLIMIT_NPROC 1: %v, want EAGAIN", err)
	}
	if got := Of(Wrap(ProcessFailed, Spawn(err), "start")); got != HostResource {
		t.Fatalf("got %s", got)
	}
}
