package errcode

import (
	"errors"
	"syscall"
)

// Host faults ([OP-3], [CLI-3]).
//
// When the host itself runs out of a resource, whatever fm was doing fails
// with an errno that says so, and that failure is the host's, never the
// package's or the home's: the same call succeeds once the resource is back.
// Every errno-to-code mapping of fm goes through Wrap (or reaches Of
// uncoded), so this is the one place that routes these errnos to
// HostResource, whatever code the call site would have chosen
// (path-unsafe for a directory check, package-invalid for a package read,
// integrity-mismatch for a revalidation, process-failed for a launch): a
// poll that failed this way is never captured as evidence against a valid
// package, and serve backs off instead of announcing it.

// hostErrnos are always resource exhaustion: the process or system file
// table (EMFILE, ENFILE), disk space or quota (ENOSPC, EDQUOT), memory
// (ENOMEM), the file size limit (EFBIG: RLIMIT_FSIZE, ulimit -f, which
// bounds every file fm writes, an owner record or a captured result).
var hostErrnos = []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOSPC, syscall.EDQUOT, syscall.ENOMEM, syscall.EFBIG}

// spawnError marks the failure of creating a process, where EAGAIN means
// the process limit (RLIMIT_NPROC) or the kernel's task table (elsewhere
// EAGAIN only means "try again": a non-blocking read, a busy flock), and
// EBADF means the new process could not place the descriptors it inherits
// below its open-files limit (Go's child moves them up with dup3, which
// fails with EBADF past RLIMIT_NOFILE): both are the host's limits.
type spawnError struct{ err error }

func (e *spawnError) Error() string { return e.err.Error() }
func (e *spawnError) Unwrap() error { return e.err }

// Spawn marks err, the failure of fork, clone or the start of a process, so
// that EAGAIN and EBADF in it count as host faults. Nil stays nil.
func Spawn(err error) error {
	if err == nil {
		return nil
	}
	return &spawnError{err}
}

// HostFault reports whether err's chain holds the host's own resource
// exhaustion: one of hostErrnos, or EAGAIN or EBADF from a Spawn-marked
// start.
func HostFault(err error) bool {
	for _, e := range hostErrnos {
		if errors.Is(err, e) {
			return true
		}
	}
	var s *spawnError
	return errors.As(err, &s) && (errors.Is(s.err, syscall.EAGAIN) || errors.Is(s.err, syscall.EBADF))
}
