package freshlook

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A caller is never answered by a look that started before it asked: with
// a look held in progress, a caller that asks then waits for it and gets
// the answer of a look of its own (or of one that started after it asked),
// while the held look's caller gets the held answer.
func TestNeverAnswersFromAStaleLook(t *testing.T) {
	var s Look[int]
	var state atomic.Int64 // what a look sees
	looked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.After = func() {
		once.Do(func() {
			close(looked)
			<-release
		})
	}
	held := make(chan int)
	go func() { held <- s.Get(func() int { return int(state.Load()) }) }()
	select {
	case <-looked:
	case <-time.After(10 * time.Second):
		t.Fatal("the first caller made no look")
	}
	state.Store(1) // the world changes while the held look is in progress
	fresh := make(chan int)
	go func() { fresh <- s.Get(func() int { return int(state.Load()) }) }()
	time.Sleep(50 * time.Millisecond) // the fresh caller asks while the held look is in progress
	close(release)
	if got := <-held; got != 0 {
		t.Errorf("the held look answered %d, want 0 (what it saw)", got)
	}
	if got := <-fresh; got != 1 {
		t.Fatalf("a caller that asked after the change was answered %d, want 1", got)
	}
}

// Concurrent callers share looks: 200 callers released together make far
// fewer than 200 looks, and each gets an answer at least as new as the
// state when it asked.
func TestConcurrentCallersShareLooks(t *testing.T) {
	var s Look[int64]
	var looks, state atomic.Int64
	do := func() int64 {
		looks.Add(1)
		v := state.Load()
		time.Sleep(time.Millisecond)
		return v
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 200 {
		wg.Go(func() {
			<-start
			asked := state.Add(1)
			if got := s.Get(do); got < asked {
				t.Errorf("asked at state %d, answered from state %d", asked, got)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := looks.Load(); n >= 100 {
		t.Fatalf("200 concurrent callers made %d looks", n)
	}
	t.Logf("200 callers, %d looks", looks.Load())
}
