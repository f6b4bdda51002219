// Package lifecycle holds the home-local lifecycle lock (CONTRACT [LIFE-1]).
//
// One lock per home serializes bind (resolution to publication),
// register-extension (resolution to registration publication) and retirement
// (dependency preflight to exact binding removal). It is the lock file
// data/extensions/lifecycle.lock, taken through fsutil.Lock, whose rule is
// that of every lock of fm: the kernel releases it when the holder dies (a
// waiter never guesses whether a holder is alive and never steals from a
// live one), the descriptor is close-on-exec (a package process never
// inherits it), and it is held only while it is the file at that name and no
// holder of a removed lifecycle.lock still runs, so removing or replacing the
// file under a running bind never lets a second one run alongside.
//
// The lock is held only for short critical sections, never across a long poll:
// a running invocation pins its binding through its owner record instead.
package lifecycle

import (
	"context"
	"errors"
	"path/filepath"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
)

// Lock is a held lifecycle lock.
type Lock struct{ l *fsutil.Locked }

// Acquire waits until it holds the lifecycle lock of h, or until ctx is done
// (process-failed, nothing held): a command interrupted by SIGTERM or SIGINT
// while another holds the lock stops at once. It creates data/extensions
// (0700) and the lock file (0600) when absent.
func Acquire(ctx context.Context, h *home.Home) (*Lock, error) {
	dir := h.Extensions()
	if err := home.EnsurePrivate(filepath.Dir(dir), false); err != nil {
		return nil, err
	}
	if err := home.EnsurePrivate(dir, false); err != nil {
		return nil, err
	}
	d, err := home.OpenPrivate(dir, false)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	l, err := fsutil.Lock(ctx, d, "lifecycle.lock", fsutil.LockOptions{What: "lifecycle lock"})
	if errors.Is(err, fsutil.ErrInterrupted) {
		return nil, errcode.Wrap(errcode.ProcessFailed, context.Cause(ctx), "interrupted while waiting for the lifecycle lock %q (another bind, registration or retirement holds it); nothing was changed", filepath.Join(dir, "lifecycle.lock"))
	}
	if err != nil {
		return nil, err
	}
	return &Lock{l: l}, nil
}

// Release drops the lock.
func (l *Lock) Release() {
	if l != nil {
		l.l.Release()
	}
}
