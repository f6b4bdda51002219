package launch

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// [INV-5]: the bound runs from the execve of the entrypoint, not from the
// release. The barrier (fm itself) is stopped across its release for half
// the bound, as a host too busy to run it would leave it; the package then
// takes five eighths of the bound to answer. Charged from the release
// that is more than the bound; charged from the execve it is well within,
// and the call succeeds. Running is called at the execve, after the stop.
func TestBoundStartsWhenThePackageRuns(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.spec("sleep-answer")
	s.Timeout = 4 * time.Second
	stall, work := s.Timeout/2, s.Timeout*5/8
	s.Env = append(s.Env, envSleep+"="+strconv.Itoa(int(work.Milliseconds())))
	var running atomic.Int64
	s.Running = func() { running.Store(time.Now().UnixNano()) }
	p, err := Prepare(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	// The barrier is this test's unreaped child until Run has proved its
	// group gone, which cannot happen while it is stopped: its pid is
	// pinned for both signals.
	barrier := p.inv.g.pgid
	if err := unix.Kill(barrier, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	go func() {
		time.Sleep(stall)
		unix.Kill(barrier, unix.SIGCONT)
	}()
	res, err := p.Run(context.Background())
	if err != nil {
		t.Fatalf("[INV-5] a package that answered within its bound, counted from its execve, failed: %v", err)
	}
	if string(res.Stdout) != "ok" {
		t.Fatalf("stdout %q", res.Stdout)
	}
	if at := time.Unix(0, running.Load()); at.Sub(released) < stall {
		t.Errorf("[INV-5] Running was called %v after the release, before the barrier was let go (%v)", at.Sub(released), stall)
	}
	assertNoRecords(t, f.records)
}

// [INV-5]: a barrier that does not execute the entrypoint within the bound
// of its release (here, stopped throughout) is the host's failure,
// host-resource, never the package's timeout; the group is still proved
// gone and the record removed, and Running is never called.
func TestStalledBarrierIsHostResource(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.spec("good")
	s.Timeout = 500 * time.Millisecond
	var ran atomic.Bool
	s.Running = func() { ran.Store(true) }
	p, err := Prepare(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	barrier := p.inv.g.pgid
	if err := unix.Kill(barrier, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	_, err = p.Run(context.Background())
	assertCode(t, err, errcode.HostResource)
	if ran.Load() {
		t.Error("Running was called for an entrypoint never executed")
	}
	assertGroupGone(t, barrier)
	assertNoRecords(t, f.records)
}

// [INV-5]: the gate admits at most Size callers at once, and all of them in turn;
// leave is idempotent; a caller whose context ends while it waits is
// refused (process-failed) and takes no slot; a context without a gate is
// not bounded.
func TestGateBoundsStartUps(t *testing.T) {
	t.Parallel()
	g := NewGate(2)
	ctx := WithGate(context.Background(), g)
	first, err := Enter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Enter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := Enter(short); !errcode.Is(err, errcode.ProcessFailed) {
		t.Fatalf("a caller past its deadline in a full gate: %v, want process-failed", err)
	}
	first()
	first() // gives back nothing more
	var inside, most, admitted atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			leave, err := Enter(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			n := inside.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(5 * time.Millisecond)
			inside.Add(-1)
			admitted.Add(1)
			leave()
			leave()
		})
	}
	wg.Wait()
	// second still holds its slot: the eight shared the other one.
	if m := most.Load(); m != 1 || admitted.Load() != 8 {
		t.Errorf("%d admitted, at most %d at once beside a held slot of a gate of 2, want 8 and 1", admitted.Load(), m)
	}
	second()
	if len(g.slots) != 0 {
		t.Errorf("%d slots held after everyone left", len(g.slots))
	}
	if leave, err := Enter(context.Background()); err != nil || leave == nil {
		t.Errorf("a context without a gate: %v", err)
	}
}
