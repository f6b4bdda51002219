package cli

import (
	"bytes"
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// [GRP-2] fm catches its stop signals alongside its start-up, and writes
// nothing before it catches them: SIGPIPE is one of them, and a write to a
// closed stdout must fail with EPIPE rather than end fm. The writers Main
// gives its verbs wait for that.
func TestWritesWaitForSignals(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	caught := make(chan struct{})
	w := afterSignals(&buf, caught)
	wrote := make(chan struct{})
	go func() {
		w.Write([]byte("x"))
		close(wrote)
	}()
	select {
	case <-wrote:
		t.Fatal("a write went out before the signals were caught")
	case <-time.After(50 * time.Millisecond):
	}
	close(caught)
	<-wrote
	if buf.String() != "x" {
		t.Fatalf("wrote %q, want %q", buf.String(), "x")
	}
}

// [GRP-2] A stop signal cancels the run's context with the signal as its
// cause, and a second one, while fm stops its groups, is caught too rather
// than ending fm. Not parallel: the signals go to this process.
func TestSignalContextCancels(t *testing.T) {
	ctx, _, caught, stop := signalContext(true)
	defer stop()
	select {
	case <-caught:
	case <-time.After(10 * time.Second):
		t.Fatal("stop signals never caught")
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM did not cancel the run")
	}
	if got := context.Cause(ctx).Error(); !strings.Contains(got, "terminated") {
		t.Fatalf("cause %q, want the signal named", got)
	}
	// Still caught: without that, this would end the test binary.
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
}
