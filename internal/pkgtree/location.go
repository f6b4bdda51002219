package pkgtree

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// CheckLocation checks where an operator's package directory dir lies, before
// Scan looks inside it. home is the effective home.
//
// [PKG-1]: dir must be absolute and canonical: resolving it as the kernel
// does (symlinks first, then "..") must give back its own spelling after
// filepath.Clean, so no path component is a link that could later point
// somewhere else (path-unsafe). It must exist (package-missing) and be a
// directory (package-invalid).
//
// [PKG-2]: it must not be the home nor inside it, comparing canonical paths,
// and neither it nor any ancestor up to / may hold a ".git" entry of any type
// (a work tree, a linked work tree's .git file, a task copy): a package is
// bound from outside every project, never discovered in one (path-unsafe).
func CheckLocation(dir, home string) error {
	if !filepath.IsAbs(dir) {
		return errcode.New(errcode.PathUnsafe, "package %s: path is not absolute", dir)
	}
	clean := filepath.Clean(dir)
	st, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
		return errcode.New(errcode.PackageMissing, "package %s: no such directory", dir)
	}
	if err != nil {
		return errcode.Wrap(errcode.PackageInvalid, err, "package %s: cannot stat", dir)
	}
	canon, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return errcode.Wrap(errcode.PathUnsafe, err, "package %s: cannot resolve its path", dir)
	}
	if canon != clean {
		return errcode.New(errcode.PathUnsafe, "package %s: path is not canonical (resolves to %s); pass the real path", dir, canon)
	}
	if !st.IsDir() {
		return errcode.New(errcode.PackageInvalid, "package %s: not a directory", dir)
	}
	h, err := filepath.EvalSymlinks(home)
	if err != nil {
		return errcode.Wrap(errcode.HomeInvalid, err, "home %s: cannot resolve its path", home)
	}
	if canon == h || strings.HasPrefix(canon, strings.TrimSuffix(h, "/")+"/") {
		return errcode.New(errcode.PathUnsafe, "package %s: inside the home %s; copy it outside the home", dir, h)
	}
	for d := canon; ; d = filepath.Dir(d) {
		g := filepath.Join(d, ".git")
		_, err := os.Lstat(g)
		if err == nil {
			return errcode.New(errcode.PathUnsafe, "package %s: inside a git work tree (%s exists); copy it outside the project", dir, g)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return errcode.Wrap(errcode.PathUnsafe, err, "package %s: cannot check for %s", dir, g)
		}
		if d == "/" {
			return nil
		}
	}
}
