package launch

import (
	"context"
	"sync/atomic"
)

// Stop signals and package code [GRP-2].
//
// A host that runs package code catches its stop signals (TERM, INT, HUP,
// QUIT), so that on any of them it stops every group it runs and proves
// each gone before it exits. Until it catches them, such a signal ends it
// outright, which its records survive as they survive a crash [GRP-3]; that
// is harmless while no package code runs, and only then. Catching them costs
// fm ~0.3 ms of its start (the Go runtime hands each signal to a dedicated
// thread and waits for it), so fm does it alongside the rest of its start-up
// and says so with AfterSignals; every Prepare then waits for it before it
// reserves an owner record, so no barrier (and no package code) ever starts
// in a process that does not yet catch them. Whatever else starts a process
// that only fm's stop-signal handling stops (fm on's secondmate command, in
// a process group of its own) waits for them too, with AwaitSignals.

// signalsCaught is the channel given to AfterSignals last, nil when none was.
var signalsCaught atomic.Pointer[<-chan struct{}]

// AfterSignals makes every later Prepare in this process wait until caught
// is closed, which its caller does once the process catches its stop
// signals (signals are the process's, and so is this). A later call
// replaces the channel; one that is never closed holds every launch.
func AfterSignals(caught <-chan struct{}) { signalsCaught.Store(&caught) }

// AwaitSignals waits until the stop signals are caught (see AfterSignals)
// or ctx is done, and reports whether they are.
func AwaitSignals(ctx context.Context) bool {
	c := signalsCaught.Load()
	if c == nil {
		return true
	}
	select {
	case <-*c:
		return true
	case <-ctx.Done():
		return false
	}
}
