package procevent

import (
	"errors"
	"os"
	"path/filepath"

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

// unpinInbox closes the inbox pin, so the next openInbox pins the inbox
// that is there then.
func (d *dirs) unpinInbox() {
	if d.inbox != nil {
		d.inbox.Close()
		d.inbox = nil
	}
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
		if err := fsutil.MkdirAt(d.state, name, 0o700); err != nil && err != unix.EEXIST {
			return nil, errcode.Wrap(errcode.PathUnsafe, err, "create directory %q", path)
		}
	} else if _, err := os.Lstat(path); os.IsNotExist(err) {
		return nil, errAbsent
	}
	f, err := home.OpenPrivate(path, d.strict)
	if err != nil {
		return nil, err
	}
	if err := fsutil.SameEntry(d.state, name, f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
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
		if err := fsutil.Recheck(f, home.PrivateRule(d.strict)); err != nil {
			return err
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
