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
	"context"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
)

// Lock is a held lifecycle lock.
type Lock struct{ f *os.File }

// pollMax caps the back-off between two attempts at a held lock.
const pollMax = 50 * time.Millisecond

// Acquire waits until it holds the lifecycle lock of h, or until ctx is done
// (process-failed, nothing held): a command interrupted by SIGTERM or SIGINT
// while another holds the lock stops at once. It creates data/extensions
// (0700) and the lock file (0600) when absent.
//
// The wait tries the lock without blocking (LOCK_NB) with a short back-off,
// up to pollMax, instead of blocking in flock(2), which no signal the
// runtime handles would interrupt. A waiter can only get the lock once the
// holder has dropped it or died; it never steals it.
func Acquire(ctx context.Context, h *home.Home) (*Lock, error) {
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
		return nil, errcode.New(errcode.PathUnsafe, "lifecycle lock %q is not a regular file you own; remove it while no fm command runs (fm creates it again)", path)
	}
	for delay := time.Millisecond; ; delay = min(2*delay, pollMax) {
		switch err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err {
		case nil:
			return &Lock{f: os.NewFile(uintptr(fd), path)}, nil
		case unix.EWOULDBLOCK, unix.EINTR:
		default:
			unix.Close(fd)
			return nil, errcode.Wrap(errcode.Internal, err, "lock %q", path)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			unix.Close(fd)
			return nil, errcode.Wrap(errcode.ProcessFailed, context.Cause(ctx), "interrupted while waiting for the lifecycle lock %q (another bind, registration or retirement holds it); nothing was changed", path)
		case <-t.C:
		}
	}
}

// Release drops the lock.
func (l *Lock) Release() {
	if l != nil && l.f != nil {
		l.f.Close()
		l.f = nil
	}
}
