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
