package pkgtree

import (
	"os"
	"path/filepath"
	"testing"
)

// [BIND-6] [INV-1]: RemoveInstalled removes a store copy that package code
// ran in, whatever it left there (sealed 0555 directories, a 0000 file,
// symlinks to a directory and a file outside), and follows nothing: what the
// links name outside keeps its contents and its modes.
func TestRemoveInstalledFollowsNothing(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(base, "outside")
	mkdir := func(p string) {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p string, mode os.FileMode) {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	mkdir(filepath.Join(outside, "sub"))
	write(filepath.Join(outside, "keep"), 0o444)
	if err := os.Chmod(outside, 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(outside, 0o755) })

	dst := filepath.Join(base, "store", "id", "1.0.0", "abc")
	mkdir(filepath.Join(dst, "bin", "deep"))
	write(filepath.Join(dst, "bin", "deep", "f"), 0o000)
	write(filepath.Join(dst, "firstmate-extension.json"), 0o444)
	for link, target := range map[string]string{"dirlink": outside, "filelink": filepath.Join(outside, "keep"), "bin/up": ".."} {
		if err := os.Symlink(target, filepath.Join(dst, link)); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{filepath.Join(dst, "bin", "deep"), filepath.Join(dst, "bin"), dst} {
		if err := os.Chmod(d, 0o555); err != nil {
			t.Fatal(err)
		}
	}

	if err := RemoveInstalled(dst); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dst); !os.IsNotExist(err) {
		t.Fatalf("%s still exists: %v", dst, err)
	}
	for p, mode := range map[string]os.FileMode{outside: 0o555, filepath.Join(outside, "keep"): 0o444, filepath.Join(outside, "sub"): 0o755} {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode().Perm() != mode {
			t.Fatalf("%s outside the copy was touched: %v %v", p, fi, err)
		}
	}
	if err := RemoveInstalled(filepath.Join(base, "gone", "1.0.0", "abc")); err != nil {
		t.Fatalf("a copy removed with its parent: %v", err)
	}
	if err := RemoveInstalled("relative/dir"); err == nil {
		t.Fatal("a relative path was accepted")
	}
}

// [BIND-6] [INV-1]: package code can chmod the directories of its own store
// copy, the copy's root too, to 0000 (it owns them when fm runs
// unprivileged); RemoveInstalled still removes the copy, giving each
// directory back its owner's bits through a descriptor that follows no link.
func TestRemoveInstalledUnreadableDirs(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(base, "store", "id", "1.0.0", "abc")
	for _, d := range []string{filepath.Join(dst, "bin", "deep"), filepath.Join(dst, "closed")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dst, "bin", "deep", "f"), []byte("x"), 0o444); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Join(dst, "bin", "deep"), filepath.Join(dst, "bin"), filepath.Join(dst, "closed"), dst} {
		if err := os.Chmod(d, 0o000); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.Chmod(dst, 0o700) })
	if err := RemoveInstalled(dst); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dst); !os.IsNotExist(err) {
		t.Fatalf("%s still exists: %v", dst, err)
	}
}
