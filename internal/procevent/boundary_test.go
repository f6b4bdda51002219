package procevent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// swapForLink renames dir aside (to dir+".orig") and puts a symlink to target
// in its place; it returns the renamed original.
func (f *fixture) swapForLink(dir, target string) string {
	f.t.Helper()
	if err := os.MkdirAll(target, 0o700); err != nil {
		f.t.Fatal(err)
	}
	orig := dir + ".orig"
	if err := os.Rename(dir, orig); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Symlink(target, dir); err != nil {
		f.t.Fatal(err)
	}
	return orig
}

func (f *fixture) restore(dir, orig string) {
	f.t.Helper()
	if err := os.Remove(dir); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(orig, dir); err != nil {
		f.t.Fatal(err)
	}
}

func empty(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != 0 {
		t.Fatalf("%s must be untouched and empty: %v %v", dir, err, ents)
	}
}

// [CAP-6]: procevent-inbox or procevent replaced by a symlink after the
// registration makes the external poll refuse before any write; the link's
// target is never written.
func TestBoundarySwapAfterRegistration(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	for _, dir := range []string{f.h.Inbox(), f.h.Registrations()} {
		target := filepath.Join(f.work, "target-"+filepath.Base(dir))
		if dir == f.h.Registrations() {
			// A look-alike registry holding the same registration.
			f.write(filepath.Join(target, "s1.source"), f.read(filepath.Join(dir, "s1.source")), 0o600)
			os.Chmod(target, 0o700)
		}
		orig := f.swapForLink(dir, target)
		before, _ := os.ReadDir(target)
		f.fails("link-unsafe", "procevent", "start", "s1")
		after, _ := os.ReadDir(target)
		if len(after) != len(before) {
			t.Fatalf("%s: the link's target was written: %v", dir, after)
		}
		f.restore(dir, orig)
	}
	if len(f.inbox()) != 0 || len(f.log("poll")) != 0 || len(f.wakes()) != 0 {
		t.Fatalf("a refused poll ran or wrote: inbox %v log %v", f.inbox(), f.log("poll"))
	}

	// Mode and owner drift refuse the external poll too ([CAP-6] exactly 0700).
	os.Chmod(f.h.Inbox(), 0o750)
	f.fails("mode-unsafe", "procevent", "start", "s1")
	os.Chmod(f.h.Inbox(), 0o700)
	os.Chmod(f.h.State, 0o711)
	f.fails("mode-unsafe", "procevent", "start", "s1")
	os.Chmod(f.h.State, 0o700)
	f.ok("procevent", "start", "s1")

	// The built-in path keeps its plain behaviour: a 0750 inbox is accepted.
	sig := filepath.Join(f.work, "signal")
	f.ok("procevent", "register", "file-watch", "b1", "--", filepath.Join(f.h.Root, "bin", "fm-procevent-file-watch.sh"), "poll", sig, "0")
	os.Chmod(f.h.Inbox(), 0o750)
	f.write(sig, "hello", 0o600)
	if out := f.ok("procevent", "start", "b1"); !strings.HasPrefix(out, "captured: ") {
		t.Fatalf("built-in start printed %q", out)
	}
}

// [CAP-6]: a substitution made while the poll runs is refused before the
// capture: nothing lands in the link's target, nor in the pinned original;
// the source's sequence is not consumed, so the next poll repeats the id.
func TestBoundarySwapMidPoll(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	for _, dir := range []string{f.h.Inbox(), f.h.Registrations()} {
		run := f.startGated("s1")
		target := filepath.Join(f.work, "mid-"+filepath.Base(dir))
		orig := f.swapForLink(dir, target)
		f.release()
		run.Wait()
		if errs := run.Stderr.(*strings.Builder).String(); !strings.HasPrefix(errs, "error[link-unsafe]: ") && !strings.HasPrefix(errs, "error[path-unsafe]: ") {
			t.Fatalf("%s swapped mid-poll: start said %q / %q", dir, run.Stdout, errs)
		}
		empty(t, target)
		f.restore(dir, orig)
		if len(f.inbox()) != 0 || len(f.wakes()) != 0 {
			t.Fatalf("%s swapped mid-poll: the pinned inbox got %v", dir, f.inbox())
		}
	}
	ids := ids(f.log("poll"))
	if len(ids) != 2 || ids[0] != ids[1] {
		t.Fatalf("refused captures must not consume the sequence: %v", ids)
	}
	f.mode("poll", "result")
	if out := f.ok("procevent", "start", "s1"); !strings.HasSuffix(out, "/s1.1.result\n") {
		t.Fatalf("start after restoring printed %q", out)
	}
}
