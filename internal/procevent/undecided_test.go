package procevent_test

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// [CAP-2] [OP-3] a result whose runner never decided its announcement (it
// died while asking the silent verdict, or failed to append its wake on a
// full disk, which prints "fm procevent reconcile announces it") is
// announced by the next reconcile at the default re-announce interval, not
// one interval later; a second reconcile does not announce it again.
func TestUndecidedResultAnnouncedByNextReconcile(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("src1")
	f.mode("silent", "slow-true")
	run, _, _ := f.background("procevent", "start", "src1")
	waitFor(t, 10*time.Second, "the silent verdict to be asked", func() bool { return len(f.log("silent")) == 1 })
	run.Process.Signal(syscall.SIGKILL)
	run.Wait()
	if !contains(f.inbox(), "src1.1.pending") {
		t.Fatal("setup: the killed runner left no pending marker")
	}
	f.mode("silent", "false")
	f.mode("poll", "no-result")
	for i, want := range []string{" reannounced=1\n", " reannounced=0\n"} {
		if out := f.ok("procevent", "reconcile"); !strings.HasSuffix(out, want) {
			t.Fatalf("reconcile %d printed %q, want %q", i+1, out, want)
		}
	}
	if ws := f.wakes(); len(ws) != 1 || ws[0].Key != "procevent:src1:1" {
		t.Fatalf("wakes %+v", ws)
	}
}
