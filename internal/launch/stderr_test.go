package launch

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"firstmate.dev/fm/internal/errcode"
)

// [INV-4]: a caller that asks for stderr (Spec.Stderr: an operator's direct
// call) gets at most StderrLimit bytes of it and the count of all, once the
// group is gone, whatever the outcome: here a flood over the bound, which
// still stops the invocation as stderr-oversized.
func TestStderrHandedToCaller(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.spec("flood-err")
	var kept []byte
	var total int64
	calls := 0
	s.Stderr = func(b []byte, n int64) { kept, total = bytes.Clone(b), n; calls++ }
	_, err := Run(context.Background(), s)
	assertCode(t, err, errcode.StderrOversized)
	if calls != 1 || len(kept) != s.StderrLimit || total <= int64(s.StderrLimit) || !bytes.Equal(kept, bytes.Repeat([]byte("e"), s.StderrLimit)) {
		t.Fatalf("Stderr called %d times with %d bytes of %d; want once, %d bytes of more", calls, len(kept), total, s.StderrLimit)
	}
	assertNoRecords(t, f.records)
}

// [GRP-2]: a non-zero exit carries its status as an ExitStatus cause, for a
// caller that explains a status (126/127: the program could not be run).
func TestExitStatusCause(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, err := Run(context.Background(), f.spec("exit7"))
	var st ExitStatus
	if !errors.As(err, &st) || st != 7 || errcode.Of(err) != errcode.ProcessFailed {
		t.Fatalf("got %v (%s), want process-failed with ExitStatus 7", err, errcode.Of(err))
	}
}
