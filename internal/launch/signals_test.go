package launch

import (
	"context"
	"errors"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
)

// [GRP-2] No barrier starts, and so no package code runs, in a host that
// does not yet catch its stop signals: Prepare waits for AfterSignals'
// channel before it reserves a record, and gives up with process-failed
// when its context ends first. Not parallel: the gate is the process's.
func TestPrepareWaitsForSignals(t *testing.T) {
	defer signalsCaught.Store(nil)
	f := newFixture(t)
	caught := make(chan struct{})
	AfterSignals(caught)

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := Prepare(ctx, f.spec("good"))
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	assertNoRecords(t, f.records)
	cancel()
	err := <-errc
	assertCode(t, err, errcode.ProcessFailed)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Prepare cancelled while waiting for the signals: %v, want it to wrap context.Canceled", err)
	}
	assertNoRecords(t, f.records)

	type prepared struct {
		p   *Pending
		err error
	}
	done := make(chan prepared, 1)
	go func() {
		p, err := Prepare(context.Background(), f.spec("good"))
		done <- prepared{p, err}
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("Prepare returned (%v) before the signals were caught", r.err)
	default:
	}
	assertNoRecords(t, f.records)
	close(caught)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if _, err := r.p.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertNoRecords(t, f.records)
}
