package pkgtree_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/pkgtree"
)

// FuzzCheckLocation spells package directories as arbitrary paths over a
// fixed tree (a home, packages, a symlinked directory, a Git work tree, a
// file) and compares CheckLocation with [PKG-1] and [PKG-2] restated on the
// kernel's own resolution: a directory is accepted exactly when its spelling
// is absolute, resolving it (links first, then "..") gives its lexically
// clean spelling, it is a directory, it is neither the home nor inside it,
// and neither it nor an ancestor holds a .git entry. A refusal uses the
// contract's codes.
func FuzzCheckLocation(f *testing.F) {
	base, err := filepath.EvalSymlinks(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	for d := base; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
			f.Skipf("the temp directory %s is inside a git work tree", base)
		}
	}
	for _, d := range []string{"home/pkgs/p", "pkg/bin", "real/sub", "real/pkg", "repo/.git", "repo/pkg", "gitfile/pkg"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	for name, target := range map[string]string{"link": "real/sub", "homelink": "home", "loop": "loop", "abs": base + "/pkg"} {
		if err := os.Symlink(target, filepath.Join(base, name)); err != nil {
			f.Fatal(err)
		}
	}
	for _, file := range []string{"file", "gitfile/.git"} {
		if err := os.WriteFile(filepath.Join(base, file), nil, 0o644); err != nil {
			f.Fatal(err)
		}
	}
	home := filepath.Join(base, "home")
	for _, s := range []string{"pkg", "pkg/", "./pkg", "pkg/bin/..", "link/../pkg", "real/sub/../pkg", "link", "abs", "homelink/pkgs/p", "home", "home/pkgs/p",
		"home/../pkg", "repo/pkg", "gitfile/pkg", "file", "missing", "loop", "pkg//bin", "/", "/tmp/../" + base[1:] + "/pkg", "../" + filepath.Base(base) + "/pkg"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		dir := s
		if !strings.HasPrefix(s, "/") {
			dir = base + "/" + s
		}
		err := pkgtree.CheckLocation(dir, home)
		canon, rerr := filepath.EvalSymlinks(dir)
		st, serr := os.Stat(dir)
		want := rerr == nil && serr == nil && canon == filepath.Clean(dir) && st.IsDir() &&
			canon != home && !strings.HasPrefix(canon, home+"/") && !gitAbove(canon)
		if got := err == nil; got != want {
			t.Fatalf("CheckLocation(%q) accepts=%v (%v); [PKG-1]/[PKG-2] say %v (resolves to %q, %v)", dir, got, err, want, canon, rerr)
		}
		if err != nil {
			switch errcode.Of(err) {
			case errcode.PathUnsafe, errcode.PackageMissing, errcode.PackageInvalid:
			default:
				t.Fatalf("refused %q as %s: %v", dir, errcode.Of(err), err)
			}
		}
	})
}

// gitAbove reports whether dir or an ancestor holds a .git entry.
func gitAbove(dir string) bool {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(filepath.Join(d, ".git")); !errors.Is(err, fs.ErrNotExist) {
			return true
		}
		if d == "/" {
			return false
		}
	}
}
