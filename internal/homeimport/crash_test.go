package homeimport

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"firstmate.dev/fm/internal/testpkg"
)

// [HOME-4] A kill can land inside a write, not only after a durable change:
// between a temporary file's creation and its rename, the journal's or a
// kept copy's temporary file is left in data/imported or in the run. The
// re-run removes them, so its home is exactly the one an uninterrupted
// import gives.
func TestImportRerunRemovesTornTemporaries(t *testing.T) {
	f := newFixture(t)
	restore, want := f.importedOnce()
	temp := func(dir string, data string) {
		f.must(os.MkdirAll(dir, 0o700))
		f.write(filepath.Join(dir, ".tmp-4242-1-"+strings.Repeat("5a", 8)), []byte(data), 0o600)
	}

	// Killed while publishing the journal: no journal, its temporary file.
	restore()
	temp(filepath.Join(f.h.Dir, "data", "imported"), "20260101T000000Z\n")
	f.fm(0, "home", "import")
	if d := diff(want, f.snapshot()); d != "" {
		t.Fatalf("after a kill inside the journal's write:\n%s", d)
	}

	// Killed while keeping copies: a journal, its run, temporary files in
	// the run (beside a kept copy, and in a kept directory).
	restore()
	c := exec.Command(os.Args[0])
	c.Env = append(append([]string{}, f.env...), killEnv+"=8")
	if out, err := c.CombinedOutput(); err == nil {
		t.Fatalf("the import was not killed: %s", out)
	}
	run, err := readJournal(f.h)
	if err != nil || run == "" {
		t.Fatalf("no run after a kill at point 8: %q %v", run, err)
	}
	runDir := filepath.Join(f.h.Dir, "data", "imported", run)
	temp(runDir, "x")
	temp(filepath.Join(runDir, "state", "procevent", ".lifecycle-owner.1"), "y")
	f.fm(0, "home", "import")
	if d := diff(want, f.snapshot()); d != "" {
		t.Fatalf("after a kill inside a kept copy's write:\n%s", d)
	}
}

// [HOME-4] A re-run removes the import's own temporary files of a killed run
// (.fm-import-<16 hex>, regular files), and nothing else that merely starts
// so: a directory, or a file with another name, is left with its contents.
func TestImportRemovesOnlyItsOwnTemporaries(t *testing.T) {
	f := newFixture(t)
	own := filepath.Join(f.h.State, ".fm-import-"+strings.Repeat("ab", 8))
	f.write(own, []byte("torn"), 0o600)
	vdir := filepath.Dir(f.unit())
	ownUnit := filepath.Join(vdir, ".fm-import-"+strings.Repeat("cd", 8))
	f.write(ownUnit, []byte("torn"), 0o600)
	keep := []string{
		filepath.Join(f.h.State, ".fm-import-notes"),
		filepath.Join(f.h.State, ".fm-import-"+strings.Repeat("ef", 8)+"x"),
		filepath.Join(f.h.State, ".fm-import-"+strings.Repeat("12", 8), "precious"),
		filepath.Join(vdir, ".fm-import-"+strings.Repeat("34", 8), "precious"),
	}
	for _, p := range keep {
		f.must(os.MkdirAll(filepath.Dir(p), 0o700))
		f.write(p, []byte("mine"), 0o600)
	}
	f.fm(0, "home", "import")
	for _, p := range []string{own, ownUnit} {
		if exists(p) {
			t.Errorf("the import's own temporary file %s is left", p)
		}
	}
	for _, p := range keep {
		if data, err := os.ReadFile(p); err != nil || string(data) != "mine" {
			t.Errorf("%s was removed or changed: %q %v", p, data, err)
		}
	}
}

// [HOME-4] [LIFE-2] [CAP-1] Crash injection at every step: the import is
// SIGKILLed right after each of its durable changes in turn. After each kill
// every fm reader works or refuses with home-import-needed and fm doctor says
// to run the import; then fm home import, run again, completes, and the home
// is exactly the one an uninterrupted import gives.
func TestImportCrashAtEveryStep(t *testing.T) {
	f := newFixture(t)
	restore, want := f.importedOnce()
	for n := 1; ; n++ {
		restore()
		c := exec.Command(os.Args[0])
		c.Env = append(append([]string{}, f.env...), killEnv+"="+strconv.Itoa(n))
		out, err := c.CombinedOutput()
		if err == nil {
			if !strings.Contains(string(out), "completed") {
				t.Fatalf("kill point %d: %s", n, out)
			}
			if n < 30 {
				t.Fatalf("only %d kill points: the import makes more durable changes than that", n-1)
			}
			t.Logf("%d kill points", n-1)
			break
		}
		if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("kill point %d: the child did not die of SIGKILL: %v\n%s", n, err, out)
		}
		for _, args := range [][]string{{"procevent", "inbox"}, {"procevent", "list"}, {"wake", "list"}, {"extension", "list"}} {
			if o, e, code := f.run("", args...); code != 0 && !strings.HasPrefix(e, "error[home-import-needed]: ") {
				t.Fatalf("kill point %d: fm %s: exit %d: %s%s", n, strings.Join(args, " "), code, o, e)
			}
		}
		if d := f.fm(1, "doctor"); !strings.Contains(d, "[home-import-needed]") {
			t.Fatalf("kill point %d: doctor does not ask for the import:\n%s", n, d)
		}
		f.fm(0, "home", "import")
		if d := diff(want, f.snapshot()); d != "" {
			t.Fatalf("kill point %d: the re-run's home differs from an uninterrupted import's:\n%s", n, d)
		}
	}
}

// importedOnce snapshots the fixture's home of the earlier implementation,
// imports it uninterrupted and returns what that import gives (want) and a
// function that puts the unimported home back for the next attempt.
func (f *fixture) importedOnce() (restore func(), want map[string]string) {
	f.t.Helper()
	snap := filepath.Join(f.t.TempDir(), "snap")
	f.t.Cleanup(func() { testpkg.Unlock(snap) })
	f.must(copyAll(f.base, snap))
	restore = func() {
		testpkg.Unlock(f.base)
		f.must(os.RemoveAll(f.base))
		f.must(copyAll(snap, f.base))
	}
	f.fm(0, "home", "import")
	return restore, f.snapshot()
}
