package pkgtree

import (
	"os"
	"path/filepath"
	"testing"

	"firstmate.dev/fm/internal/errcode"
)

// canonicalTemp returns a canonical temp directory with no ".git" above it,
// the setting the location cases need.
func canonicalTemp(t *testing.T) string {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	must(t, err)
	for d := base; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
			t.Skipf("the temp directory %s is inside a git work tree (%s)", base, d)
		}
		if d == "/" {
			return base
		}
	}
}

// TestCheckLocation covers [PKG-1] (canonical absolute path, real directory)
// and [PKG-2] (outside the home, outside every Git work tree).
func TestCheckLocation(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, base string) (dir, home string)
		want  errcode.Code
	}{
		{name: "plain package accepted", setup: func(t *testing.T, base string) (string, string) {
			return filepath.Join(base, "pkg"), filepath.Join(base, "home")
		}},
		{name: "sibling of the home sharing its prefix accepted", setup: func(t *testing.T, base string) (string, string) {
			writeTree(t, base, node{path: "home2/pkg/"})
			return filepath.Join(base, "home2/pkg"), filepath.Join(base, "home")
		}},
		{name: "unclean spelling of the canonical path accepted", setup: func(t *testing.T, base string) (string, string) {
			return base + "/./x/../pkg/", filepath.Join(base, "home")
		}},
		{name: "[PKG-1] relative path", want: errcode.PathUnsafe, setup: func(t *testing.T, base string) (string, string) {
			return "pkg", filepath.Join(base, "home")
		}},
		{name: "[PKG-1] symlinked path component", want: errcode.PathUnsafe, setup: func(t *testing.T, base string) (string, string) {
			writeTree(t, base, node{path: "real/pkg/"})
			must(t, os.Symlink("real", filepath.Join(base, "link")))
			return filepath.Join(base, "link/pkg"), filepath.Join(base, "home")
		}},
		{name: "[PKG-1] the package dir is a symlink", want: errcode.PathUnsafe, setup: func(t *testing.T, base string) (string, string) {
			must(t, os.Symlink("pkg", filepath.Join(base, "alias")))
			return filepath.Join(base, "alias"), filepath.Join(base, "home")
		}},
		{name: "[PKG-1] dot-dot after a symlink", want: errcode.PathUnsafe, setup: func(t *testing.T, base string) (string, string) {
			// The kernel resolves link/.. to real, not to base: base/link/../pkg
			// opens base/real/pkg although it is spelled like base/pkg.
			writeTree(t, base, node{path: "real/sub/"}, node{path: "real/pkg/"})
			must(t, os.Symlink("real/sub", filepath.Join(base, "link")))
			return base + "/link/../pkg", filepath.Join(base, "home")
		}},
		{name: "[PKG-1] missing", want: errcode.PackageMissing, setup: func(t *testing.T, base string) (string, string) {
			return filepath.Join(base, "nope"), filepath.Join(base, "home")
		}},
		{name: "[PKG-1] not a directory", want: errcode.PackageInvalid, setup: func(t *testing.T, base string) (string, string) {
			writeTree(t, base, node{path: "file", data: "x"})
			return filepath.Join(base, "file"), filepath.Join(base, "home")
		}},
		{name: "[PKG-2] inside the home", want: errcode.PathUnsafe, setup: func(t *testing.T, base string) (string, string) {
			writeTree(t, base, node{path: "home/pkgs/pkg/"})
			return filepath.Join(base, "home/pkgs/pkg"), filepath.Join(base, "home")
		}},
		{name: "[PKG-2] the home itself", want: errcode.PathUnsafe, setup: func(t *testing.T, base string) (string, string) {
			return filepath.Join(base, "home"), filepath.Join(base, "home")
		}},
		{name: "[PKG-2] inside the home spelled through a symlink", want: errcode.PathUnsafe, setup: func(t *testing.T, base string) (string, string) {
			writeTree(t, base, node{path: "home/pkg/"})
			must(t, os.Symlink("home", filepath.Join(base, "home-link")))
			return filepath.Join(base, "home/pkg"), filepath.Join(base, "home-link")
		}},
		{name: "[PKG-2] .git directory in an ancestor", want: errcode.PathUnsafe, setup: func(t *testing.T, base string) (string, string) {
			writeTree(t, base, node{path: "proj/.git/"}, node{path: "proj/sub/pkg/"})
			return filepath.Join(base, "proj/sub/pkg"), filepath.Join(base, "home")
		}},
		{name: "[PKG-2] .git file in an ancestor (linked work tree)", want: errcode.PathUnsafe, setup: func(t *testing.T, base string) (string, string) {
			writeTree(t, base, node{path: "wt/pkg/"}, node{path: "wt/.git", data: "gitdir: /elsewhere\n"})
			return filepath.Join(base, "wt/pkg"), filepath.Join(base, "home")
		}},
		{name: "[PKG-2] dangling .git symlink in an ancestor", want: errcode.PathUnsafe, setup: func(t *testing.T, base string) (string, string) {
			writeTree(t, base, node{path: "task/pkg/"})
			must(t, os.Symlink("/nonexistent", filepath.Join(base, "task/.git")))
			return filepath.Join(base, "task/pkg"), filepath.Join(base, "home")
		}},
		{name: "[PKG-2] .git in the package itself", want: errcode.PathUnsafe, setup: func(t *testing.T, base string) (string, string) {
			writeTree(t, base, node{path: "pkg/.git/"})
			return filepath.Join(base, "pkg"), filepath.Join(base, "home")
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := canonicalTemp(t)
			writeTree(t, base, node{path: "pkg/"}, node{path: "home/"}, node{path: "x/"})
			dir, home := c.setup(t, base)
			wantCode(t, CheckLocation(dir, home), c.want)
		})
	}
}
