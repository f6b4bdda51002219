package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// TestMkdirAllSync checks what can be checked of the durable directory
// creation behind [HOME-4]'s layout (home.EnsurePrivate, the staging and
// retired-staging paths of [XFER-3]/[XFER-6], retired-bindings of [LIFE-2]):
// every missing component is created with exactly the given mode whatever
// the umask, the parent of every new directory (and only of new ones) is
// fsynced, in creation order, and a second call changes and fsyncs nothing.
// That the fsync makes the names survive a crash cannot be unit-tested.
func TestMkdirAllSync(t *testing.T) {
	base := t.TempDir()
	var synced []string
	syncParent = func(dir string) error {
		synced = append(synced, dir)
		return syncDir(dir)
	}
	t.Cleanup(func() { syncParent = syncDir })
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })

	if err := os.Mkdir(filepath.Join(base, "a"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(base, "a"), 0o711); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(base, "a", "b", "c", "d")
	if err := MkdirAllSync(target, 0o755); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{
		filepath.Join(base, "a"):           0o711, // existing: untouched
		filepath.Join(base, "a", "b"):      0o755, // not 0700, although the umask is 077
		filepath.Join(base, "a", "b", "c"): 0o755,
		target:                             0o755,
	} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if !fi.IsDir() || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, want a directory of mode %o", p, fi.Mode(), want)
		}
	}
	wantSynced := []string{filepath.Join(base, "a"), filepath.Join(base, "a", "b"), filepath.Join(base, "a", "b", "c")}
	if !slices.Equal(synced, wantSynced) {
		t.Errorf("fsynced %q, want the parents of the new directories %q", synced, wantSynced)
	}

	synced = nil
	if err := os.Chmod(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAllSync(target, 0o755); err != nil {
		t.Fatalf("second call: %v", err)
	}
	if fi, _ := os.Lstat(target); fi.Mode().Perm() != 0o700 {
		t.Errorf("a second call changed the existing directory's mode to %v", fi.Mode())
	}
	if len(synced) != 0 {
		t.Errorf("a second call fsynced %q; nothing was created", synced)
	}

	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAllSync(filepath.Join(file, "x"), 0o700); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("a file on the way: %v, want ENOTDIR", err)
	}
	if _, err := os.Lstat(filepath.Join(file, "x")); err == nil {
		t.Error("created something below a file")
	}
}

// [HOME-4] IsTempName recognises exactly the names WriteTemp makes, so a
// re-run of fm home import removes the temporary files a kill left and
// nothing else.
func TestIsTempName(t *testing.T) {
	dir := t.TempDir()
	p, err := WriteTemp(dir, []byte("x"), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if !IsTempName(filepath.Base(p)) {
		t.Fatalf("%s is not recognised", p)
	}
	for _, n := range []string{".tmp-", ".tmp-12-34-5A5A5A5A5A5A5A5A", ".tmp-12-34-", ".tmp-12-34-" + strings.Repeat("5a", 17), ".tmp-12-34-5a5a5a5a5a5a5a5g", ".tmp-012-34-5a5a5a5a5a5a5a5a", ".tmp-12-5a5a5a5a5a5a5a5a", "tmp-12-34-5a5a5a5a5a5a5a5a", ".tmp-5a5a5a5a5a5a5a5a5a5a5a5a", "receipt.json"} {
		if IsTempName(n) {
			t.Errorf("%q is taken for a temporary file", n)
		}
	}
}
