package launch

import (
	"context"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
)

// [OP-3] [CLI-3] a launch barrier that is gone before its release (under
// RLIMIT_AS the barrier, a whole fm process, dies in the Go runtime's start-up
// with "out of memory"; here it is killed) ran no package code: Run's error
// is host-resource, never an error that a runner would capture as evidence
// against the package (it was internal: "write |1: broken pipe").
func TestBarrierGoneBeforeReleaseIsHostFault(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p, err := Prepare(context.Background(), f.spec("good"))
	if err != nil {
		t.Fatal(err)
	}
	barrier := *onlyRecord(t, f.records).Leader
	if err := syscall.Kill(barrier.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let it die; it stays our unreaped child
	_, err = p.Run(context.Background())
	assertCode(t, err, errcode.HostResource)
	assertNoRecords(t, f.records)
	if f.hasReport("leader") {
		t.Fatal("package code ran")
	}
}
