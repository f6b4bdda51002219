package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"firstmate.dev/fm/internal/errcode"
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

// [HOME-4] IsTempName recognises exactly the names TempName makes, so a
// re-run of fm home import removes the temporary files a kill left and
// nothing else.
func TestIsTempName(t *testing.T) {
	if p := TempName(); !IsTempName(p) {
		t.Fatalf("%s is not recognised", p)
	}
	for _, n := range []string{".tmp-", ".tmp-12-34-5A5A5A5A5A5A5A5A", ".tmp-12-34-", ".tmp-12-34-" + strings.Repeat("5a", 17), ".tmp-12-34-5a5a5a5a5a5a5a5g", ".tmp-012-34-5a5a5a5a5a5a5a5a", ".tmp-12-5a5a5a5a5a5a5a5a", "tmp-12-34-5a5a5a5a5a5a5a5a", ".tmp-5a5a5a5a5a5a5a5a5a5a5a5a", "receipt.json"} {
		if IsTempName(n) {
			t.Errorf("%q is taken for a temporary file", n)
		}
	}
}

// [BND-4] [OP-3] A private file that loses its last link between the open
// and the check was removed or replaced by a writer, not found with the
// wrong number of links: the name is opened again, so the reader gets the
// file there now (a rename over the name) or os.ErrNotExist (a removal),
// never link-unsafe. A file with two links stays link-unsafe. The race is
// injected deterministically through the open function of reopening.
func TestReadPrivateVanished(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.json")
	write := func(p, data string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	opens := 0
	openThen := func(race func()) func() (*os.File, error) {
		opens = 0
		return func() (*os.File, error) {
			f, err := OpenNoFollow(path)
			if opens++; err == nil && opens == 1 {
				race() // between the open and the fstat
			}
			return f, err
		}
	}

	write(path, "old")
	_, err := reopening(path, openThen(func() { os.Remove(path) }), 64)
	if !errors.Is(err, os.ErrNotExist) || opens != 2 {
		t.Errorf("removed after the open: %v after %d opens, want os.ErrNotExist after 2", err, opens)
	}

	write(path, "old")
	data, err := reopening(path, openThen(func() {
		write(path+".new", "new")
		os.Rename(path+".new", path)
	}), 64)
	if err != nil || string(data) != "new" || opens != 2 {
		t.Errorf("replaced after the open: %q, %v after %d opens, want the new content after 2", data, err, opens)
	}

	if err := os.Link(path, path+".second"); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPrivateFile(path, 64); errcode.Of(err) != errcode.LinkUnsafe {
		t.Errorf("two links: %v, want link-unsafe", err)
	}
	os.Remove(path + ".second")

	// A name that is replaced at every open is bounded, not a loop.
	opens = 0
	_, err = reopening(path, func() (*os.File, error) {
		f, err := OpenNoFollow(path)
		opens++
		write(path+".new", "again")
		os.Rename(path+".new", path)
		return f, err
	}, 64)
	if errcode.Of(err) != errcode.Internal || opens != reopenBound {
		t.Errorf("replaced at every open: %v after %d opens, want internal after %d", err, opens, reopenBound)
	}
}

// [INV-1] [HOME-4] Canonical is the canonical-path check of the installed
// package root, the store and the home's private directories: it answers
// exactly as filepath.EvalSymlinks(p) == filepath.Clean(p) would, for a
// symlink as the last component, in the middle, behind "..", as the target
// of "..", for absent entries, files, relative paths and unclean spellings.
func TestCanonical(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"real/sub", "other"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(base, "real/file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for link, to := range map[string]string{"link": "real", "real/up": "../other", "dangling": "absent", "abs": base + "/real"} {
		if err := os.Symlink(to, filepath.Join(base, link)); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(base)
	cases := []struct {
		p    string
		want bool
	}{
		{base, true},
		{base + "/real", true},
		{base + "/real/sub", true},
		{base + "/real/file", true},
		{base + "/real/sub/", true},
		{base + "//real/./sub", true},
		{base + "/real/sub/../sub", true},
		{"real/sub", true},
		{".", true},
		{base + "/link", false},
		{base + "/link/sub", false},
		{base + "/abs/sub", false},
		{base + "/real/up", false},
		{base + "/real/up/..", false},
		{base + "/dangling", false},
		{base + "/absent", false},
		{base + "/real/file/x", false},
		{base + "/real/file/..", false},
		{base + "/link/../real", true}, // and resolves "link" only to drop it
		{"link/sub", false},
		{"", true}, // EvalSymlinks reads "" as "."
	}
	for _, c := range cases {
		ev, err := filepath.EvalSymlinks(c.p)
		evalSays := err == nil && ev == filepath.Clean(c.p)
		if got := Canonical(c.p); got != c.want || got != evalSays {
			t.Errorf("Canonical(%q) = %v, want %v (EvalSymlinks says %v)", c.p, got, c.want, evalSays)
		}
	}
}
