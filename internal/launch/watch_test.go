package launch

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
)

// [INV-4] [GRP-2] A running invocation costs its caller's goroutine and one
// more, the watcher, which reads stdout and stderr and awaits the leader's
// exit: a serve with a thousand long polls keeps two goroutines for each,
// not one per descriptor. Cancelled, every invocation ends and leaves no
// goroutine behind.
func TestRunningInvocationGoroutines(t *testing.T) {
	if _, err := Run(context.Background(), newFixture(t).spec("quick")); err != nil {
		t.Fatal(err) // the fork thread's goroutine exists from here on
	}
	const n = 20
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, n)
	fs := make([]fixture, n)
	for i := range n {
		fs[i] = newFixture(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = Run(ctx, fs[i].spec("slow"))
		}()
	}
	for _, f := range fs {
		f.reported(t, "leader")
	}
	if got := runtime.NumGoroutine() - before; got > 2*n+2 {
		t.Fatalf("%d running invocations hold %d goroutines, want at most %d", n, got, 2*n+2)
	}
	cancel()
	wg.Wait()
	for i, err := range errs {
		if !errcode.Is(err, errcode.ProcessFailed) {
			t.Fatalf("invocation %d: %v, want process-failed (cancelled)", i, err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after every invocation ended, %d before", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// [GRP-2] [OP-3] Run returns holding no descriptor of its invocation: the
// watcher's epoll instance is closed by then, not a moment later by the
// watcher's goroutine. Else a host near its file limit finds a descriptor
// it counted free still taken (a launch right after another fails as a host
// fault), and TestPipesAtFileLimit's count sees it.
func TestRunReturnsWithoutDescriptors(t *testing.T) {
	f := newFixture(t)
	if _, err := Run(context.Background(), f.spec("quick")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the first watcher is surely done
	before := openFDs(t)
	for i := range 200 {
		if _, err := Run(context.Background(), f.spec("quick")); err != nil {
			t.Fatal(err)
		}
		if n := openFDs(t); n != before {
			t.Fatalf("run %d returned with %d descriptors open, %d before; now %v", i, n, before, fdNames())
		}
	}
}
