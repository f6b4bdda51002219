package procevent

import (
	"context"
	"errors"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
)

// Claims [RUN-4].
//
// A runner claims a source by holding an exclusive flock(2) on
// <state>/procevent/<source-id>.claim for the whole poll, capture and
// verdicts. The kernel drops the lock when the runner dies, so a dead
// runner's claim is released without help and a stale claim can never block;
// a live runner's lock cannot be taken by anyone, so a live claim is never
// stolen. A second runner that finds the claim held does not wait: it
// reports "already owned". Registration and retirement take the same claim,
// so a generation never changes under a running poll.
//
// Stopping a running poll. A retire that finds the claim held asks the runner
// to stop by holding an exclusive flock on <source-id>.stop while it waits for
// the claim, and touches the file's mode so that the runner's registry watch
// (watch.go) reports it. The runner looks for that lock on that event (and
// every safetyPoll, or every stopPoll without a watch); when it sees it,
// it cancels its poll, which makes the launch supervision stop the poll's
// exact process group (TERM, then KILL) and prove it gone, and then releases
// the claim without capturing anything. Because the request is itself a lock,
// a retire that dies withdraws its request with it, and a stale request can
// never stop a later poll.
//
// Lock files exist only for registered sources [CAP-6]: a runner reads the
// registration (and checks the external boundary) before it touches any lock
// file, so `start` of an unknown source creates nothing; registration
// creates the claim; and whoever ends a source's registration while holding
// its claim (a retire, a terminal verdict) removes both lock files before
// releasing it. Every lock here is taken through fsutil.Lock, whose rule
// makes this safe: a lock is held only while its file is still the entry at
// its name and no holder of a removed file of that name still runs, so two
// parties never believe they hold "the" claim through two different inodes,
// whether fm removed the file (as above) or anyone else removed or replaced
// it. A party that finds the source gone once it holds the claim removes the
// lock files it may have created.

const (
	claimSuffix = ".claim"
	stopSuffix  = ".stop"
	// stopPoll is how often a running poll looks for a stop request when
	// it cannot watch the registry (see watch.go).
	stopPoll = 100 * time.Millisecond
	// stopWait bounds how long a retire waits for a running poll to stop.
	stopWait = 15 * time.Second
)

// safetyPoll is how often the registry watch makes every poll look for a
// stop request anyway (a variable for tests).
var safetyPoll = 5 * time.Second

// errStopped is the cause of a poll cancelled by a retire's stop request.
var errStopped = errors.New("a retire stopped the poll")

type claim struct{ l *fsutil.Locked }

// claim takes the claim of id without waiting; nil means a live runner holds
// it. It creates the lock file when absent, so call it only for a source that
// is registered (or is being registered); see removeLocks.
func (d *dirs) claim(id string) (*claim, error) {
	l, err := fsutil.Lock(context.Background(), d.reg, id+claimSuffix, fsutil.LockOptions{Try: true})
	switch {
	case errors.Is(err, fsutil.ErrLocked):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return &claim{l: l}, nil
}

// removeLocks removes id's claim and stop-request files. The caller holds the
// claim and has found the source unregistered: the next claim of a new
// registration creates them again, and anyone still holding one of the
// removed files finds it unlinked (fsutil.Lock) and starts again.
func (d *dirs) removeLocks(id string) {
	for _, n := range []string{id + claimSuffix, id + stopSuffix} {
		_, _ = fsutil.UnlinkAt(d.reg, n)
	}
}

func (c *claim) release() { c.l.Release() }

// awaitClaim asks the runner holding id's claim to stop and waits up to
// stopWait for the claim. The returned release function drops both the
// claim and the stop request. Both waits (for the stop request, which
// another retire may hold, and for the claim) end when ctx does
// (process-failed, nothing held).
func (d *dirs) awaitClaim(ctx context.Context, id string) (release func(), err error) {
	stop, err := fsutil.Lock(ctx, d.reg, id+stopSuffix, fsutil.LockOptions{})
	if errors.Is(err, fsutil.ErrInterrupted) {
		return nil, interrupted(ctx, id)
	}
	if err != nil {
		return nil, err
	}
	// Wake the runner's registry watch (watch.go): the mode stays what it is.
	_ = stop.File().Chmod(0o600)
	deadline := time.Now().Add(stopWait)
	for {
		c, err := d.claim(id)
		if err != nil {
			stop.Release()
			return nil, err
		}
		if c != nil {
			return func() { c.release(); stop.Release() }, nil
		}
		if time.Now().After(deadline) {
			stop.Release()
			return nil, errcode.New(errcode.SourceActive, "source %q: its running poll did not stop within %s; nothing was retired, retry", id, stopWait)
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			stop.Release()
			return nil, interrupted(ctx, id)
		case <-t.C:
		}
	}
}

// interrupted is the error of a wait for id's claim that ctx ended.
func interrupted(ctx context.Context, id string) error {
	return errcode.Wrap(errcode.ProcessFailed, context.Cause(ctx), "interrupted while waiting for the claim of source %q; nothing was retired", id)
}

// watchStop returns a context derived from ctx that is cancelled with
// errStopped as soon as a retire requests that id's poll stop, and a function
// that ends the watch. An error probing the request file is returned at
// once: a runner that could not be stopped must not start. The probe is
// fsutil.Probe on the file at the name (a retire holds its request there;
// see fsutil.Lock): it creates nothing.
func (d *dirs) watchStop(ctx context.Context, id string) (context.Context, func(), error) {
	probe := func() (bool, error) { return fsutil.Probe(d.reg, id+stopSuffix, fsutil.LockOptions{}) }
	first, err := probe()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	requested := func() bool {
		held, err := probe()
		return held && err == nil
	}
	look := func() {
		if requested() {
			cancel(errStopped)
		}
	}
	if first {
		cancel(errStopped)
	}
	// With the registry watch, the watch looks on every event and every
	// safetyPoll (watch.go). Look once more after subscribing, so no request
	// falls in between.
	if w, err := watchRegistry(d.reg); err == nil {
		end := w.onStop(id, look)
		look()
		return ctx, func() { end(); w.release(); cancel(nil) }, nil
	}
	go func() {
		t := time.NewTicker(stopPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if requested() {
					cancel(errStopped)
					return
				}
			}
		}
	}()
	return ctx, func() { close(done); cancel(nil) }, nil
}
