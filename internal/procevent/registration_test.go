package procevent_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// [HOME-5] [LIFE-1]: register-extension on a fresh home, where nothing binds
// the adapter, is refused with nothing created, not even the lifecycle lock.
func TestRegisterExtensionFreshHomeCreatesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.fails("adapter-unbound", "procevent", "register-extension", "sig", "s1", "--config-ref", "x")
	ents, err := os.ReadDir(f.h.Dir)
	if err != nil || len(ents) != 0 {
		t.Fatalf("a refused register-extension left %v in the home (%v)", ents, err)
	}
}

// [LIFE-1]: a command waiting for the lifecycle lock stops on SIGTERM: it
// exits promptly, changing nothing, while the holder keeps the lock.
func TestLifecycleWaitStopsOnTERM(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	hold(t, filepath.Join(f.h.Extensions(), "lifecycle.lock"))
	cmd, _, errs := f.background("procevent", "register-extension", "sig", "s1", "--config-ref", "x")
	time.Sleep(500 * time.Millisecond) // it is waiting for the lock now
	stopsOnTerm(t, cmd, errs)
	if out := f.ok("procevent", "list"); out != "no process-event sources\n" {
		t.Fatalf("list printed %q", out)
	}
}
