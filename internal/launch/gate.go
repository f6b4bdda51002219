package launch

import (
	"context"
	"runtime"
	"sync"

	"firstmate.dev/fm/internal/errcode"
)

// Gate bounds how many calls are starting at once in one host [INV-5].
//
// A host that starts many calls together (serve at its start, or after a
// registry change; reconcile) would otherwise fork every barrier at once and
// let the kernel share the CPUs among all of them and their packages: each
// package's start-up then takes as long as all of them together, and a
// bound measured per package expires for packages that answer promptly.
// Through a gate the herd waits in fm, where no package's
// bound runs, and at most Size calls compete for the CPUs.
//
// A slot is held for a call's start-up: from before its package is verified
// and its first barrier forked until its operation's entrypoint has been
// executed (host.Invoke), or until its handshake has answered for a call
// that is only a handshake. That is the CPU-heavy part of every call; what
// follows, a package's long poll, waits without holding one.
//
// A Gate travels with the context of the calls it bounds (WithGate, Enter),
// like their cancellation, so every launch made for serve, however deep
// (polls, their handshakes, verdicts, built-in adapters), passes the same
// one; a context without a gate is not bounded (a single command-line call).
type Gate struct {
	slots chan struct{}
}

// NewGate returns a gate of n slots (at least one).
func NewGate(n int) *Gate {
	return &Gate{slots: make(chan struct{}, max(1, n))}
}

// GateSize is the number of slots a host's gate has: four per CPU this
// process may run on (runtime.GOMAXPROCS: the machine's CPUs, or fewer under
// a CPU affinity mask or a cgroup CPU limit). A start-up is a handful of
// processes run one after another (two barriers, the package's interpreter
// and what it starts), each waiting for the last, so one per CPU leaves the
// CPUs idle between them; and on a machine shared with other work the
// kernel shares the CPUs among runnable processes, so a host with one
// start-up per CPU got a sliver of them: at one per CPU, two busy loops and
// a loaded machine beside it, a serve of 100 sources got through fewer than
// one start-up a second, and sources waited minutes. Four per CPU keeps a
// herd's start-ups to a few dozen processes at once, where each takes
// milliseconds, not seconds.
func GateSize() int { return 4 * runtime.GOMAXPROCS(0) }

// Size is the number of slots.
func (g *Gate) Size() int { return cap(g.slots) }

// enter takes a slot, waiting for one unless ctx ends first. leave gives it back;
// it may be called more than once.
func (g *Gate) enter(ctx context.Context) (leave func(), err error) {
	select {
	case g.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, errcode.Wrap(errcode.ProcessFailed, context.Cause(ctx), "interrupted while waiting for a start-up slot (no package code ran)")
	}
	return sync.OnceFunc(func() { <-g.slots }), nil
}

type gateKey struct{}

// WithGate returns ctx carrying g: every Enter under it takes g's slots.
func WithGate(ctx context.Context, g *Gate) context.Context {
	return context.WithValue(ctx, gateKey{}, g)
}

// Enter takes a slot of ctx's gate for a call's start-up, and returns the
// function that gives it back (idempotent). Without a gate it returns at
// once. It fails (process-failed) only when ctx ends while it waits.
func Enter(ctx context.Context) (leave func(), err error) {
	g, _ := ctx.Value(gateKey{}).(*Gate)
	if g == nil {
		return func() {}, nil
	}
	return g.enter(ctx)
}
