package fsutil

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// DirRule is the private-directory rule, stated once: a directory fm writes
// private files in is a real directory (not a symlink, checked on the opened
// descriptor, never on a path that may change), owned by the effective uid,
// and its permission bits pass Perm. With Canonical, its path also names
// itself (no component is a symlink). Every pinned directory of fm is opened
// by OpenDir under one of these rules; which one a directory gets is its
// owner's decision (home: [HOME-3]/[CAP-6]; launch: [HOME-4]).
type DirRule struct {
	// What names the directory in errors; "directory" when empty.
	What string
	// Perm is what the permission bits may be.
	Perm DirPerm
	// Canonical also requires that the path has no symlinked component.
	Canonical bool
	// SameMount also requires that the directory is on its parent's mount
	// (OnParentMount).
	SameMount bool
}

// DirPerm is the permission part of a DirRule.
type DirPerm int

const (
	// NoGroupWrite: no group or other write bit ([HOME-3]).
	NoGroupWrite DirPerm = iota
	// OwnerOnly: no group or other bit at all (the invocation records).
	OwnerOnly
	// Exact0700: exactly 0700 (the external boundary of [CAP-6]).
	Exact0700
	// AnyPerm: any bits; only for a directory whose mode is not fm's to
	// judge: a kept copy of fm home import, where the mode is data, and the
	// SDK's replay store, which is the adapter's own.
	AnyPerm
)

func (r DirRule) what() string {
	if r.What == "" {
		return "directory"
	}
	return r.What
}

// OpenDir opens the directory path as a pinned handle: O_DIRECTORY|O_NOFOLLOW,
// close-on-exec, checked under r on the descriptor itself, so every *At call
// through it stays in that exact directory even if the path is swapped
// afterwards. A missing directory is path-unsafe and wraps os.ErrNotExist.
func OpenDir(path string, r DirRule) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ELOOP || err == unix.ENOTDIR {
			// O_NOFOLLOW|O_DIRECTORY reports a link as either: say which.
			var st unix.Stat_t
			if unix.Lstat(path, &st) == nil {
				if cerr := r.check(path, &st, -1); cerr != nil {
					return nil, cerr
				}
			}
			return nil, errcode.New(errcode.LinkUnsafe, "%s %q is a symlink or not a directory; replace it with a real directory, mode 0700", r.what(), path)
		}
		return nil, r.openErr(path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, errcode.Wrap(errcode.PathUnsafe, err, "stat %s %q", r.what(), path)
	}
	if err := r.check(path, &st, fd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// CheckDir checks the directory at path under r without opening it (lstat):
// for a check before a path-based operation, or to prove again that a
// pinned path still passes. Prefer OpenDir and operations by handle.
func CheckDir(path string, r DirRule) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return r.openErr(path, err)
		}
		// Nothing was opened: the words of the home's check before the
		// layer, "directory <path>: <errno>".
		return errcode.Wrap(errcode.PathUnsafe, err, "%s %q", r.what(), path)
	}
	return r.check(path, &st, -1)
}

func (r DirRule) openErr(path string, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return &errcode.Error{Code: errcode.PathUnsafe, Msg: fmt.Sprintf("%s %q is missing", r.what(), path), Err: os.ErrNotExist}
	}
	return errcode.Wrap(errcode.PathUnsafe, err, "open %s %q", r.what(), path)
}

// check applies r to st, the status of the directory path (open as fd, or
// -1).
func (r DirRule) check(p string, st *unix.Stat_t, fd int) error {
	w, mode := r.what(), st.Mode&0o7777
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return errcode.New(errcode.LinkUnsafe, "%s %q is a symlink; replace it with a real directory, mode 0700", w, p)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return errcode.New(errcode.PathUnsafe, "%q is not a directory; fm keeps a directory there: move it aside", p)
	case int(st.Uid) != os.Geteuid():
		return errcode.New(errcode.OwnerMismatch, "%s %q is owned by uid %d, not by you (uid %d): chown it, or run fm as its owner", w, p, st.Uid, os.Geteuid())
	case r.Perm == Exact0700 && mode != 0o700:
		return errcode.New(errcode.ModeUnsafe, "%s %q has mode %04o; it must be 0700 (chmod 700)", w, p, mode)
	case r.Perm == OwnerOnly && mode&0o077 != 0:
		return errcode.New(errcode.ModeUnsafe, "%s %q has mode %04o; it must be private (chmod go-rwx)", w, p, mode)
	case r.Perm != AnyPerm && mode&0o022 != 0:
		return errcode.New(errcode.ModeUnsafe, "%s %q is group- or world-writable (mode %04o); chmod go-w it", w, p, mode)
	}
	if r.Canonical {
		if !Canonical(p) {
			return errcode.New(errcode.PathUnsafe, "%s %q is not canonical (a path component is a symlink); use the path without links (FM_HOME, FM_STATE_OVERRIDE)", w, p)
		}
	}
	if r.SameMount {
		return OnParentMount(p, fd, w)
	}
	return nil
}

// SameEntry proves that the pinned directory child is still the entry name
// of the pinned directory parent (same device and inode as
// fstatat(parent, name, AT_SYMLINK_NOFOLLOW)): a child opened by path, then
// proved this way, was not swapped between its parent's pin and its own.
func SameEntry(parent *os.File, name string, child *os.File) error {
	return sameAs(int(parent.Fd()), name, child, "while it was being opened; refusing to use it")
}

// sameAs proves that the pinned directory f is the entry name of the
// directory dirfd (unix.AT_FDCWD: name is a path); when it is not, the
// error says f was replaced, then when.
func sameAs(dirfd int, name string, f *os.File, when string) error {
	var a, b unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &a, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return errcode.Wrap(errcode.PathUnsafe, err, "directory %q", f.Name())
	}
	if err := unix.Fstat(int(f.Fd()), &b); err != nil {
		return errcode.Wrap(errcode.PathUnsafe, err, "directory %q", f.Name())
	}
	if a.Dev != b.Dev || a.Ino != b.Ino {
		return errcode.New(errcode.PathUnsafe, "directory %q was replaced %s", f.Name(), when)
	}
	return nil
}

// Recheck proves, right before a write that matters, that the path of the
// pinned directory dir still names dir and still passes r (checked on the
// path; the same inode then carries the same owner and mode). A substitution
// made since the pin refuses here; one made after cannot redirect a write
// that goes through the handle.
func Recheck(dir *os.File, r DirRule) error {
	if err := CheckDir(dir.Name(), r); err != nil {
		return err
	}
	return sameAs(unix.AT_FDCWD, dir.Name(), dir, "after it was checked; refusing to write (restore it, then retry)")
}
