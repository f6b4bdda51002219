package adapter

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// guardStdout keeps file descriptor 1 away from the response while a
// handler runs. When stdout is the process's own fd 1 (as Serve passes it),
// it moves the response channel to a private close-on-exec duplicate and
// points fd 1 at stderr, and os.Stdout at a file of its own on a duplicate
// of that: a fmt.Println in a handler, a log package writing to os.Stdout,
// or a child process that inherits fd 1 then writes a line of log (counted
// against the host's stderr bound) instead of corrupting the one response
// document, and a handler that closes os.Stdout closes neither stderr nor
// fd 1. restore undoes it; Serve never calls it, since a goroutine of the
// handler may go on printing until the process exits.
//
// Any other writer (a test's buffer) is returned unchanged. Should a step
// fail (no free descriptor), stdout is kept as it is: the response is still
// written, only unprotected.
func guardStdout(stdout io.Writer) (response io.Writer, restore func()) {
	unguarded := func() (io.Writer, func()) { return stdout, func() {} }
	f, ok := stdout.(*os.File)
	if !ok || f.Fd() != 1 {
		return unguarded()
	}
	private, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return unguarded()
	}
	if err := unix.Dup2(2, 1); err != nil {
		// No stderr to point at: send stray writes nowhere.
		null, nerr := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		if nerr == nil {
			err = unix.Dup2(int(null.Fd()), 1)
			null.Close()
		}
		if nerr != nil || err != nil {
			unix.Close(private)
			return unguarded()
		}
	}
	alias, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		unix.Dup2(private, 1)
		unix.Close(private)
		return unguarded()
	}
	saved := os.Stdout
	diverted := os.NewFile(uintptr(alias), "/dev/stdout")
	os.Stdout = diverted
	resp := os.NewFile(uintptr(private), "response")
	return resp, func() {
		unix.Dup2(private, 1)
		os.Stdout = saved
		diverted.Close()
		resp.Close()
	}
}
