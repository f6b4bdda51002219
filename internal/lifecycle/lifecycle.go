// Package lifecycle holds the home-local lifecycle lock (CONTRACT [LIFE-1]).
//
// One lock per home serializes bind (resolution to publication),
// register-extension (resolution to registration publication) and retirement
// (dependency preflight to exact binding removal). It is an flock(2) on
// data/extensions/lifecycle.lock: the kernel releases it when the holder dies,
// so a waiter never has to guess whether a holder is alive and never steals
// the lock from a live one. The descriptor is close-on-exec, so a package
// process never inherits it.
//
// The lock is held only for short critical sections, never across a long poll:
// a running invocation pins its binding through its owner record instead.
package lifecycle

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
)

// Lock is a held lifecycle lock.
type Lock struct{ f *os.File }

// Acquire blocks until it holds the lifecycle lock of h. It creates
// data/extensions (0700) and the lock file (0600) when absent.
func Acquire(h *home.Home) (*Lock, error) {
	dir := h.Extensions()
	if err := home.EnsurePrivate(filepath.Dir(dir), false); err != nil {
		return nil, err
	}
	if err := home.EnsurePrivate(dir, false); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "lifecycle.lock")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, errcode.Wrap(errcode.LinkUnsafe, err, "open lifecycle lock %q", path)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() {
		unix.Close(fd)
		return nil, errcode.New(errcode.PathUnsafe, "lifecycle lock %q is not a regular file you own", path)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, errcode.Wrap(errcode.Internal, err, "lock %q", path)
	}
	return &Lock{f: os.NewFile(uintptr(fd), path)}, nil
}

// Release drops the lock.
func (l *Lock) Release() {
	if l != nil && l.f != nil {
		l.f.Close()
		l.f = nil
	}
}
