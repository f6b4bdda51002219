package procevent_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// bindMount mounts from over onto for the rest of the test (as root); it
// skips the test when that cannot be done here.
func bindMount(t *testing.T, from, onto string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root")
	}
	if out, err := exec.Command("mount", "--bind", from, onto).CombinedOutput(); err != nil {
		t.Skipf("mount --bind: %v %s", err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(onto, unix.MNT_DETACH); err != nil {
			t.Errorf("umount %s: %v", onto, err)
		}
	})
}

// [CAP-6] [HOME-3] A mount over a directory of the capture boundary (the
// inbox, the registry of sources, the state root, the invocation records,
// the binding registry) does not redirect a capture out of the home: fm
// refuses with path-unsafe and writes nothing in the mounted directory.
func TestCaptureBoundaryNoticesMount(t *testing.T) {
	for name, target := range map[string]func(f *fixture) string{
		"inbox":       func(f *fixture) string { return f.h.Inbox() },
		"registry":    func(f *fixture) string { return f.h.Registrations() },
		"state":       func(f *fixture) string { return f.h.State },
		"invocations": func(f *fixture) string { return f.h.Invocations() },
		"bindings":    func(f *fixture) string { return f.h.Bindings() },
		"config":      func(f *fixture) string { return filepath.Dir(f.h.Bindings()) },
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.bind()
			f.registerExt("s1")
			f.mode("poll", "text:REDIRECTED")
			dir := target(f)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			// The mounted directory is a copy of the real one, so that every
			// other rule (owner, mode, contents) passes.
			outside := filepath.Join(f.work, "outside")
			if out, err := exec.Command("cp", "-a", dir, outside).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v %s", err, out)
			}
			before, _ := os.ReadDir(outside)
			bindMount(t, outside, dir)
			if name == "bindings" || name == "config" {
				// The binding cannot be loaded: the poll fails, and its
				// failure is captured as evidence in the (real) inbox.
				if out := f.ok("procevent", "start", "s1"); out != "captured: "+filepath.Join(f.h.Inbox(), "s1.1.result")+" (evidence: path-unsafe)\n" {
					t.Fatalf("start printed %q", out)
				}
			} else {
				f.fails("path-unsafe", "procevent", "start", "s1")
			}
			after, _ := os.ReadDir(outside)
			if len(after) != len(before) {
				t.Fatalf("fm wrote into the mounted directory: %d entries, had %d", len(after), len(before))
			}
		})
	}
}

// Without a mount the same capture works (the rule refuses nothing else),
// as root and as any other user.
func TestCaptureBoundaryWithoutMount(t *testing.T) {
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.mode("poll", "text:HERE")
	f.ok("procevent", "start", "s1")
	if _, err := os.Stat(filepath.Join(f.h.Inbox(), "s1.1.result")); err != nil {
		t.Fatal(err)
	}
}
