package procevent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
)

// dirs are the pinned directory handles one operation works through: the
// state root, the registry <state>/procevent (nil for a reader when it does
// not exist) and, when opened, the inbox <state>/procevent-inbox. The
// registry and the inbox are pinned independently: a home whose registry is
// gone can still hold captured results, and a reader must see them.
//
// Every handle is opened without following a final link and checked on the
// descriptor itself (home.OpenPrivate), and each child is proved to be the
// very entry of its pinned parent (same device and inode as
// fstatat(parent, name, AT_SYMLINK_NOFOLLOW)). From then on every read, lock,
// write, link and rename goes through the descriptors (openat, linkat,
// renameat), so swapping a path for a link or another directory afterwards
// can never redirect a write: it lands in the pinned directory or, because
// recheck runs before every capture, it is refused.
//
// strict selects the external boundary of [CAP-6]: each directory must be
// exactly 0700. Otherwise the private-directory rule of [HOME-3] applies (not
// a link, canonical, owned, no group/other write): the plain built-in path.
type dirs struct {
	h      *home.Home
	strict bool
	state  *os.File
	reg    *os.File
	inbox  *os.File
}

// errAbsent reports that a directory a reader needs does not exist yet.
var errAbsent = errors.New("absent")

// openDirs pins the state root and the registry. With create, missing
// directories are created 0700 first; without, nothing is created: a missing
// state root is errAbsent, and a missing registry leaves d.reg nil (the
// inbox may still exist; see openInbox).
func openDirs(h *home.Home, strict, create bool) (*dirs, error) {
	if create {
		if err := home.EnsurePrivate(h.State, strict); err != nil {
			return nil, err
		}
	} else if _, err := os.Lstat(h.State); os.IsNotExist(err) {
		return nil, errAbsent
	}
	state, err := home.OpenPrivate(h.State, strict)
	if err != nil {
		return nil, err
	}
	d := &dirs{h: h, strict: strict, state: state}
	if d.reg, err = d.child(h.Registrations(), create); err == errAbsent {
		d.reg = nil
	} else if err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// openInbox pins the inbox as well (creating it when create is set).
func (d *dirs) openInbox(create bool) error {
	if d.inbox != nil {
		return nil
	}
	var err error
	d.inbox, err = d.child(d.h.Inbox(), create)
	return err
}

// tighten switches already pinned handles to the strict external boundary
// and checks them again under it.
func (d *dirs) tighten() error {
	d.strict = true
	return d.recheck()
}

// child pins the directory path, which must be an entry of the state root.
func (d *dirs) child(path string, create bool) (*os.File, error) {
	name := filepath.Base(path)
	if create {
		if err := unix.Mkdirat(int(d.state.Fd()), name, 0o700); err != nil && err != unix.EEXIST {
			return nil, errcode.Wrap(errcode.PathUnsafe, err, "create directory %q", path)
		}
	} else if _, err := os.Lstat(path); os.IsNotExist(err) {
		return nil, errAbsent
	}
	f, err := home.OpenPrivate(path, d.strict)
	if err != nil {
		return nil, err
	}
	if err := sameEntry(d.state, name, f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// sameEntry proves that f is the entry name of the directory parent.
func sameEntry(parent *os.File, name string, f *os.File) error {
	var a, b unix.Stat_t
	if err := unix.Fstatat(int(parent.Fd()), name, &a, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return errcode.Wrap(errcode.PathUnsafe, err, "directory %q", f.Name())
	}
	if err := unix.Fstat(int(f.Fd()), &b); err != nil {
		return errcode.Wrap(errcode.PathUnsafe, err, "directory %q", f.Name())
	}
	if a.Dev != b.Dev || a.Ino != b.Ino {
		return errcode.New(errcode.PathUnsafe, "directory %q was replaced while it was being opened; refusing to use it", f.Name())
	}
	return nil
}

// recheck proves, right before a write that matters (a capture, a
// registration), that each pinned path still names its pinned directory and
// still passes the directory rule (checked on the path; the same inode then
// carries the same owner and mode). A substitution made since the pin refuses
// here; one made after this check cannot redirect the write, which goes
// through the descriptors.
func (d *dirs) recheck() error {
	for _, f := range []*os.File{d.state, d.reg, d.inbox} {
		if f == nil {
			continue
		}
		if err := home.CheckPrivate(f.Name(), d.strict); err != nil {
			return err
		}
		var a, b unix.Stat_t
		if err := unix.Lstat(f.Name(), &a); err != nil {
			return errcode.Wrap(errcode.PathUnsafe, err, "directory %q", f.Name())
		}
		if err := unix.Fstat(int(f.Fd()), &b); err != nil {
			return errcode.Wrap(errcode.PathUnsafe, err, "directory %q", f.Name())
		}
		if a.Dev != b.Dev || a.Ino != b.Ino {
			return errcode.New(errcode.PathUnsafe, "directory %q was replaced after it was checked; refusing to write (restore it, then retry)", f.Name())
		}
	}
	return nil
}

func (d *dirs) close() {
	for _, f := range []*os.File{d.state, d.reg, d.inbox} {
		if f != nil {
			f.Close()
		}
	}
}

// The file primitives below work only relative to a pinned directory.

// writeTemp writes data into an unnamed O_TMPFILE inode of dir, mode 0600,
// fsynced. The caller gives it a name with linkAt. An unnamed file leaves
// nothing behind when the process dies before naming it.
func writeTemp(dir *os.File, data []byte) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), ".", unix.O_WRONLY|unix.O_TMPFILE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "create a file in %q", dir.Name())
	}
	f := os.NewFile(uintptr(fd), dir.Name())
	if err = unix.Fchmod(fd, 0o600); err == nil {
		if _, err = f.Write(data); err == nil {
			err = f.Sync()
		}
	}
	if err != nil {
		f.Close()
		return nil, errcode.Wrap(errcode.Internal, err, "write a file in %q", dir.Name())
	}
	return f, nil
}

// linkAt gives the unnamed file f the name name in dir; it fails with EEXIST
// rather than replacing anything.
func linkAt(f *os.File, dir *os.File, name string) error {
	return unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), int(dir.Fd()), name, unix.AT_SYMLINK_FOLLOW)
}

// createAt durably creates name in dir holding data: written and fsynced,
// published by link without replacing anything, directory fsynced. If name
// exists nothing changes and the error wraps fsutil.ErrExists.
func createAt(dir *os.File, name string, data []byte) error {
	f, err := writeTemp(dir, data)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := linkAt(f, dir, name); err != nil {
		if err == unix.EEXIST {
			return fmt.Errorf("%q: %w", filepath.Join(dir.Name(), name), fsutil.ErrExists)
		}
		return errcode.Wrap(errcode.Internal, err, "publish %q", filepath.Join(dir.Name(), name))
	}
	return syncDir(dir)
}

// replaceAt durably replaces name in dir with data: the file is written and
// fsynced unnamed, linked under a fresh temporary name, renamed over name,
// and the directory fsynced; a reader sees the old or the new file, never a
// torn one.
func replaceAt(dir *os.File, name string, data []byte) error {
	f, err := writeTemp(dir, data)
	if err != nil {
		return err
	}
	defer f.Close()
	tmp := fsutil.TempName() // swept if this process dies (fsutil.SweepTemps)
	if err := linkAt(f, dir, tmp); err != nil {
		return errcode.Wrap(errcode.Internal, err, "publish %q", filepath.Join(dir.Name(), name))
	}
	if err := unix.Renameat(int(dir.Fd()), tmp, int(dir.Fd()), name); err != nil {
		unix.Unlinkat(int(dir.Fd()), tmp, 0)
		return errcode.Wrap(errcode.Internal, err, "publish %q", filepath.Join(dir.Name(), name))
	}
	return syncDir(dir)
}

// removeAt durably removes name from dir; an absent name is not an error.
func removeAt(dir *os.File, name string) error {
	if err := unix.Unlinkat(int(dir.Fd()), name, 0); err != nil && err != unix.ENOENT {
		return errcode.Wrap(errcode.Internal, err, "remove %q", filepath.Join(dir.Name(), name))
	}
	return syncDir(dir)
}

// existsAt reports whether dir holds an entry name (links not followed).
func existsAt(dir *os.File, name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

func syncDir(dir *os.File) error {
	if err := unix.Fsync(int(dir.Fd())); err != nil {
		return errcode.Wrap(errcode.Internal, err, "sync directory %q", dir.Name())
	}
	return nil
}

// namesAt lists the entries of dir through its descriptor.
func namesAt(dir *os.File) ([]string, error) {
	fd, err := unix.Openat(int(dir.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read directory %q", dir.Name())
	}
	f := os.NewFile(uintptr(fd), dir.Name())
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil && err != io.EOF {
		return nil, errcode.Wrap(errcode.Internal, err, "read directory %q", dir.Name())
	}
	return names, nil
}
