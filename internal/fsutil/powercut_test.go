package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"firstmate.dev/fm/internal/powercut"
)

// The durable-file layer on a file system that forgets what was not synced
// (internal/powercut, strict model): each test cuts the power at every
// operation of one call and checks what the call promises.

// cutMount mounts a powercut file system, or skips where FUSE cannot be
// mounted.
func cutMount(t *testing.T) *powercut.FS {
	t.Helper()
	base := t.TempDir()
	mnt, work := filepath.Join(base, "mnt"), filepath.Join(base, "work")
	for _, d := range []string{mnt, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f, err := powercut.Mount(mnt, work, "", powercut.Strict)
	if errors.Is(err, powercut.ErrUnavailable) {
		t.Skipf("needs FUSE: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// everyCut runs setup, then call cut before each of its operations in
// turn and once after it, and check after each cut (done: call returned
// nil before the cut).
func everyCut(t *testing.T, setup func(dir string), call func(dir string) error, check func(t *testing.T, dir string, done bool)) {
	t.Helper()
	for k := 1; ; k++ {
		f := cutMount(t)
		setup(f.Dir())
		f.Arm(k)
		err := call(f.Dir())
		last := !f.CutHappened()
		if err := f.Cut(); err != nil {
			t.Fatal(err)
		}
		check(t, f.Dir(), err == nil)
		f.Close()
		if last {
			return
		}
	}
}

// TestMoveNoReplaceSurvivesEveryCut: a moved entry is at its old name or
// its new one after a cut at any point, and at the new one once the move
// returned. Syncing the source directory before the destination (as
// retire-binding did) loses it to a cut between the two syncs: a retired
// binding is enabled or retained, never neither [LIFE-2].
func TestMoveNoReplaceSurvivesEveryCut(t *testing.T) {
	everyCut(t, func(dir string) {
		for _, d := range []string{"a", "b"} {
			if err := MkdirAllSync(filepath.Join(dir, d), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		d, err := OpenDir(filepath.Join(dir, "a"), DirRule{Perm: 0o700})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if err := CreateAt(d, "x", []byte("X")); err != nil {
			t.Fatal(err)
		}
	}, func(dir string) error {
		return MoveNoReplace(filepath.Join(dir, "a", "x"), filepath.Join(dir, "b", "y"))
	}, func(t *testing.T, dir string, done bool) {
		old, oerr := os.ReadFile(filepath.Join(dir, "a", "x"))
		moved, merr := os.ReadFile(filepath.Join(dir, "b", "y"))
		switch {
		case done && (merr != nil || string(moved) != "X"):
			t.Fatalf("after a returned move: b/y %q, %v", moved, merr)
		case oerr == nil && merr == nil:
			t.Fatalf("after a cut the entry is under both names")
		case oerr != nil && merr != nil:
			t.Fatalf("after a cut the entry is under neither name: %v; %v", oerr, merr)
		case oerr == nil && string(old) != "X", merr == nil && string(moved) != "X":
			t.Fatalf("after a cut the entry holds %q / %q, want X", old, moved)
		}
	})
}

// TestMkdirAtSurvivesACut: a directory MkdirAt created is there after a
// cut once the call returned: procevent's registry and inbox directories,
// without which a printed registration is lost [REG-2].
func TestMkdirAtSurvivesACut(t *testing.T) {
	everyCut(t, func(string) {}, func(dir string) error {
		d, err := os.Open(dir)
		if err != nil {
			return err
		}
		defer d.Close()
		return MkdirAt(d, "n", 0o700)
	}, func(t *testing.T, dir string, done bool) {
		if _, err := os.Stat(filepath.Join(dir, "n")); done && err != nil {
			t.Fatalf("after a returned MkdirAt: %v", err)
		}
	})
}

// TestSyncFSOnFUSE: on FUSE, where syncfs(2) reaches no daemon, SyncFS
// still makes the tree under its directory durable (bind's store copy,
// whole once bind reports it [BIND-5]).
func TestSyncFSOnFUSE(t *testing.T) {
	everyCut(t, func(dir string) {
		if err := MkdirAllSync(filepath.Join(dir, "t", "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"t/f", "t/sub/g"} {
			if err := os.WriteFile(filepath.Join(dir, p), []byte(p), 0o444); err != nil {
				t.Fatal(err)
			}
		}
	}, func(dir string) error {
		d, err := os.Open(filepath.Join(dir, "t"))
		if err != nil {
			return err
		}
		defer d.Close()
		return SyncFS(d)
	}, func(t *testing.T, dir string, done bool) {
		for _, p := range []string{"t/f", "t/sub/g"} {
			if data, err := os.ReadFile(filepath.Join(dir, p)); done && string(data) != p {
				t.Fatalf("after a returned SyncFS %s holds %q, %v", p, data, err)
			}
		}
	})
}
