package procevent_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/procevent"
)

// spoil removes the lock file at path, or replaces it by renaming a new 0600
// file over it: the two ways a file at a lock's name stops being the one its
// holder locked.
func (f *fixture) spoil(path string, replace bool) {
	f.t.Helper()
	if !replace {
		if err := os.Remove(path); err != nil {
			f.t.Fatal(err)
		}
		return
	}
	f.write(path+".new", "", 0o600)
	if err := os.Rename(path+".new", path); err != nil {
		f.t.Fatal(err)
	}
}

var spoils = []struct {
	name    string
	replace bool
}{{"removed", false}, {"replaced", true}}

// [RUN-2] One serve per home, even when serve.lock is removed or replaced
// while a serve holds it: a second serve started then refuses
// (source-active) and exits, and the status still sees the first serving.
func TestServeLockHoldsWhenFileSpoiled(t *testing.T) {
	t.Parallel()
	for _, s := range spoils {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			first, _ := f.serve()
			// A capture proves the first serve is past its lock.
			f.ok("procevent", "register", "file-watch", "w1", "--", "/bin/echo", "x")
			lock := filepath.Join(f.h.Registrations(), "serve.lock")
			waitFor(t, 20*time.Second, "the first serve to capture", func() bool { return len(f.inbox()) > 0 })
			f.spoil(lock, s.replace)
			second, errs := f.serve()
			// [STAT-5] the refusal names the running serve's pid.
			if code := waitExit(t, second, 10*time.Second); code != 1 || !strings.HasPrefix(errs.String(), fmt.Sprintf("error[source-active]: another fm procevent serve (pid %d) is running", first.Process.Pid)) {
				t.Fatalf("second serve: exit %d %q", code, errs)
			}
			if st, err := procevent.ReadStatus(f.h); err != nil || !st.Serving {
				t.Fatalf("status after the second serve: %+v %v", st, err)
			}
			first.Process.Signal(syscall.SIGTERM)
			if code := waitExit(t, first, 10*time.Second); code != 0 {
				t.Fatalf("first serve exited %d", code)
			}
			// Its holder gone, the lock at the name is free again.
			third, _ := f.serve()
			time.Sleep(time.Second)
			if third.ProcessState != nil {
				t.Fatal("a serve after the holder's exit did not start")
			}
		})
	}
}

// [RUN-4] A live claim is never taken, even when the claim file is removed or
// replaced while a runner polls: a second start reports "already owned" and
// runs no poll; once the first runner is done, the source polls again.
func TestClaimHoldsWhenFileSpoiled(t *testing.T) {
	t.Parallel()
	for _, s := range spoils {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.bind()
			f.registerExt("s1")
			run := f.startGated("s1")
			f.spoil(filepath.Join(f.h.Registrations(), "s1.claim"), s.replace)
			second, out, _ := f.background("procevent", "start", "s1")
			if code := waitExit(t, second, 10*time.Second); code != 0 || out.String() != "already owned: s1\n" {
				t.Fatalf("second start: exit %d %q", code, out)
			}
			if n := len(f.log("poll")); n != 1 {
				t.Fatalf("%d polls ran; only the holder's may", n)
			}
			f.release()
			if code := waitExit(t, run, 20*time.Second); code != 0 {
				t.Fatalf("the first runner exited %d", code)
			}
			f.mode("poll", "no-result")
			if out := f.ok("procevent", "start", "s1"); out != "no-result: s1\n" {
				t.Fatalf("after the holder: %q", out)
			}
		})
	}
}

// [RUN-4] [LIFE-1] A retire waiting for a source's stop request (held by
// another retire) stops waiting on SIGTERM: it exits at once with
// process-failed, retiring nothing.
func TestRetireClaimWaitStopsOnTERM(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ok("procevent", "register", "file-watch", "w1", "--", "/bin/true")
	hold(t, filepath.Join(f.h.Registrations(), "w1.stop"))
	cmd, _, errs := f.background("procevent", "retire", "w1")
	time.Sleep(500 * time.Millisecond) // it is waiting for the stop request now
	if cmd.ProcessState != nil {
		t.Fatalf("retire did not wait: %q", errs)
	}
	stopsOnTerm(t, cmd, errs)
	if out := f.ok("procevent", "list"); !strings.Contains(out, "w1") {
		t.Fatalf("the source was retired: %q", out)
	}
}

// [CAP-6]: no lock file is created for a source that is not registered, nor
// before the boundary check of an external source; a retire removes the
// source's lock files.
func TestLockFilesOnlyForRegisteredSources(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.ok("procevent", "register", "file-watch", "b1", "--", "/bin/true")
	f.fails("source-missing", "procevent", "start", "nosuch")
	for _, n := range []string{"nosuch.claim", "nosuch.stop"} {
		if contains(f.registry(), n) {
			t.Fatalf("start of an unknown source created %s", n)
		}
	}
	f.ok("procevent", "start", "b1")
	f.ok("procevent", "retire", "b1")
	for _, n := range f.registry() {
		if strings.HasPrefix(n, "b1.") {
			t.Fatalf("a retire left %s", n)
		}
	}

	f.registerExt("e1")
	if err := os.Chmod(f.h.Registrations(), 0o750); err != nil {
		t.Fatal(err)
	}
	f.fails("mode-unsafe", "procevent", "start", "e1")
	if contains(f.registry(), "e1.stop") {
		t.Fatal("a start refused by the boundary created e1.stop")
	}
}

// registry lists the names in state/procevent.
func (f *fixture) registry() []string {
	f.t.Helper()
	ents, err := os.ReadDir(f.h.Registrations())
	if err != nil {
		f.t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
