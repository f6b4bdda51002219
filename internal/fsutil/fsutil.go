// Package fsutil is the one layer for pinned directories, durable files and
// locks; no other package opens a private directory, publishes a file or
// takes a lock by itself.
//
//   - Pinned directories (dir.go): OpenDir opens a directory as a handle
//     (O_DIRECTORY|O_NOFOLLOW) and checks it under the one private-directory
//     rule, DirRule: not a symlink, owned by the effective uid, permission
//     bits as the rule's Perm says. SameEntry and Recheck prove a handle
//     still is what its path names.
//   - Files by handle (at.go): NewAt starts a file in a pinned directory;
//     Create (no replace), Replace and Exchange publish it; CreateAt,
//     ReplaceAt, RemoveAt, UnlinkAt (not durable), ExistsAt and NamesAt work
//     relative to the handle.
//   - Private files (this file): ReadPrivateFile and ReadPrivateAt read a
//     file that must be regular, one link, owned, mode 0600 and bounded,
//     opened without following a link.
//   - The two atomic renames (RenameNoReplace, Exchange): this file is the
//     only one that calls renameat2(2).
//   - Locks (Lock: lock.go is the only file that calls flock(2); its rule is
//     stated there).
//   - Temp names and their sweep (temp.go).
//
// Durability rule, stated once: a durable file is written in the same
// directory as its final name (unnamed with O_TMPFILE, or under a temp name
// that temp.go or its owner can sweep; with NewOptions.Final, in a directory
// of the same file system that readers do not scan), fsynced, then given its
// name by link or rename, and the directory (both, with Final) is fsynced.
// After a crash either the old state or the whole new file is there, never a
// torn one, and once the call returns the name survives a crash. A removal
// is durable the same way (unlink, fsync the directory), and so is a
// directory fm creates on the way (MkdirAllSync: its parent is fsynced after
// the mkdir). Every publish is durable except the invocation records of
// package launch (NewOptions.NoSync, UnlinkAt): a record only has to outlive
// the process that wrote it, which the page cache already guarantees, and a
// record that a machine crash loses or brings back names an earlier boot,
// which launch's Cleanup clears (launch's package doc).
package fsutil

import (
	"errors"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// ReadPrivateFile reads path, which must be one regular file (not a link, one
// hard link), owned by the user, mode exactly 0600, at most max bytes.
//
// A file that has no link left once opened was removed, or replaced by a
// rename over its name, between the open and the check: that is not a file
// with the wrong number of links, so the name is opened again (at most
// reopenBound times). A reader gets what is at the name now, or an error
// wrapping os.ErrNotExist, never link-unsafe for a race with a writer or a
// retirement; two or more links stay link-unsafe.
func ReadPrivateFile(path string, max int64) ([]byte, error) {
	return reopening(path, func() (*os.File, error) { return OpenNoFollow(path) }, max)
}

// reopenBound bounds how often a reader opens a name again whose file lost
// its last link while it was opened.
const reopenBound = 100

// errUnlinked is readPrivate's answer for a file with no link left.
var errUnlinked = errors.New("file unlinked while it was opened")

// reopening reads the private file that open opens, opening it again while
// the file it got had lost its last link (see ReadPrivateFile).
func reopening(path string, open func() (*os.File, error), max int64) ([]byte, error) {
	return reopeningAs(path, open, max, true)
}

// reopeningAs is reopening with the owner, mode and link-count part of the
// private-file rule applied only when private is set.
func reopeningAs(path string, open func() (*os.File, error), max int64, private bool) ([]byte, error) {
	for range reopenBound {
		f, err := open()
		if err == errUnlinked {
			continue
		}
		if err != nil {
			return nil, err
		}
		data, err := readPrivate(f, path, max, private)
		f.Close()
		if err != errUnlinked {
			return data, err
		}
	}
	return nil, errcode.New(errcode.Internal, "%q kept being replaced while it was read (%d times); retry", path, reopenBound)
}

// ReadPrivateAt is ReadPrivateFile for name inside the open directory dir: it
// opens name relative to dir's descriptor without following a link, so a
// directory path swapped after dir was opened and checked cannot redirect the
// read. Errors name dir's path joined with name. What it returns was at name
// when it was read (holdAt).
func ReadPrivateAt(dir *os.File, name string, max int64) ([]byte, error) {
	return readAt(dir, name, max, true)
}

// ReadAt is ReadPrivateAt without the owner, mode and link-count rule: a
// regular file, not a link, at most max bytes. It is for files that are
// the reader's own data rather than fm's trust state (the SDK's replay
// records, which an adapter may have written under any umask and kept
// with a second link), where refusing would lose an event.
func ReadAt(dir *os.File, name string, max int64) ([]byte, error) {
	return readAt(dir, name, max, false)
}

func readAt(dir *os.File, name string, max int64, private bool) ([]byte, error) {
	path := filepath.Join(dir.Name(), name)
	return reopeningAs(path, func() (*os.File, error) {
		fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		switch {
		case err == unix.ELOOP:
			return nil, errcode.New(errcode.LinkUnsafe, "%q is a symlink; fm reads only a regular file there: replace the link with the file itself", path)
		case err == unix.ENOENT:
			return nil, &os.PathError{Op: "open", Path: path, Err: os.ErrNotExist}
		case err != nil:
			return nil, errcode.Wrap(errcode.Internal, err, "open %q", path)
		}
		// fm's own files only: ReadAt's (the SDK's replay records) are
		// never kept as spares, and an adapter may lock its own files.
		if private {
			if err := holdAt(dir, name, fd); err != nil {
				unix.Close(fd)
				return nil, err
			}
		}
		return os.NewFile(uintptr(fd), path), nil
	}, max, private)
}

// holdAt keeps the file fd, just opened as name in dir by ReadPrivateAt, from being reused
// while it is read: a shared open-file-description lock, which a writer
// reusing a spare (openSpare) must get exclusively, and then a check that
// name still holds this file. A file kept as a spare stays linked under
// a temporary name and may be rewritten with another name's bytes (see
// "Spare files"), so the link count alone does not tell a reader that
// its file left the name: once the lock is held the file cannot be
// rewritten, and while it is at name its bytes are name's. errUnlinked
// (open name again) when a writer holds the file or name holds another;
// on a file system without such locks only the name is checked.
func holdAt(dir *os.File, name string, fd int) error {
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: io.SeekStart}
	switch err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk); err {
	case nil:
	case unix.EAGAIN, unix.EACCES:
		return errUnlinked
	}
	var held, named unix.Stat_t
	if unix.Fstat(fd, &held) != nil || unix.Fstatat(int(dir.Fd()), name, &named, unix.AT_SYMLINK_NOFOLLOW) != nil ||
		held.Dev != named.Dev || held.Ino != named.Ino {
		return errUnlinked
	}
	return nil
}

// readPrivate applies the private-file rule of ReadPrivateFile to an open
// file; without private, only its type and size parts.
func readPrivate(f *os.File, path string, max int64, private bool) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "stat %q", path)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, errcode.New(errcode.LinkUnsafe, "%q is not a regular file; move it aside", path)
	case st.Nlink == 0:
		return nil, errUnlinked
	case !private:
	case st.Nlink != 1:
		return nil, errcode.New(errcode.LinkUnsafe, "%q has %d hard links; it must have exactly one: remove the other names of it", path, st.Nlink)
	case int(st.Uid) != os.Geteuid():
		return nil, errcode.New(errcode.OwnerMismatch, "%q is owned by uid %d, not by you (uid %d): chown it, or run fm as its owner", path, st.Uid, os.Geteuid())
	case st.Mode&0o7777 != 0o600:
		return nil, errcode.New(errcode.ModeUnsafe, "%q has mode %04o; it must be 0600 (chmod 600)", path, st.Mode&0o7777)
	case st.Size > max:
		return nil, errcode.New(errcode.JSONOversized, "%q is larger than its bound of %d bytes; fm never writes one that large: restore it or move it aside", path, max)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read %q", path)
	}
	if int64(len(data)) > max {
		return nil, errcode.New(errcode.JSONOversized, "%q is larger than its bound of %d bytes; fm never writes one that large: restore it or move it aside", path, max)
	}
	return data, nil
}

// OpenNoFollow opens path read-only, refusing a symlink as the final component.
func OpenNoFollow(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		switch {
		case err == unix.ELOOP:
			return nil, errcode.New(errcode.LinkUnsafe, "%q is a symlink; fm reads only a regular file there: replace the link with the file itself", path)
		case os.IsNotExist(err):
			return nil, &os.PathError{Op: "open", Path: path, Err: os.ErrNotExist}
		}
		return nil, errcode.Wrap(errcode.Internal, err, "open %q", path)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// Canonical reports whether p names an existing entry through no symlink in
// any component, the last one included: filepath.EvalSymlinks(p) would
// return filepath.Clean(p). The kernel proves it in one openat2(2) with
// RESOLVE_NO_SYMLINKS (an O_PATH open, so no permission beyond the search of
// p's directories is needed, and nothing is read), instead of an lstat(2)
// per component and their allocations: the home, the store and every
// installed package root are checked this way before every invocation
// [INV-1]. Whenever the kernel refuses (a symlink, an absent entry, a kernel
// without openat2), EvalSymlinks decides, so the answer is always exactly
// EvalSymlinks'; only a proof that no symlink lies on the way skips it.
func Canonical(p string) bool {
	fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if err == nil {
		unix.Close(fd)
		return true
	}
	c, err := filepath.EvalSymlinks(p)
	return err == nil && c == filepath.Clean(p)
}

// RenameNoReplace renames old in the directory olddir to new in newdir
// (directory descriptors, or unix.AT_FDCWD for paths) atomically and without
// replacing anything: unix.EEXIST when new exists. This file is the only one
// that calls renameat2(2); errors are the raw errno, for the caller to judge
// and wrap.
func RenameNoReplace(olddir int, old string, newdir int, new string) error {
	return unix.Renameat2(olddir, old, newdir, new, unix.RENAME_NOREPLACE)
}

// Exchange atomically swaps the entries old of olddir and new of newdir,
// which must both exist (RENAME_EXCHANGE): a reader of either name sees one
// file or the other, never none. Errors are the raw errno.
func Exchange(olddir int, old string, newdir int, new string) error {
	return unix.Renameat2(olddir, old, newdir, new, unix.RENAME_EXCHANGE)
}

// SyncDir fsyncs a directory so the names in it are durable.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "open directory %q", dir)
	}
	defer f.Close()
	if dropped("sync-dir") {
		return nil
	}
	if err := fsyncDir(int(f.Fd())); err != nil {
		return errcode.Wrap(errcode.Internal, err, "sync directory %q", dir)
	}
	return nil
}

// MkdirAllSync creates path and every missing parent as os.MkdirAll does,
// but makes each directory it creates durable: the new directory gets
// exactly mode perm (chmod after mkdir, so the umask does not change it)
// and its parent is fsynced right after, so after a crash the name of every
// directory this call created is either there or the call never returned.
// Components that already exist are left as they are (their mode is not
// changed and nothing is fsynced for them), so a call for an existing
// directory costs one stat. Existing components may be symlinks to
// directories, as for os.MkdirAll; callers that need a canonical path check
// it afterwards. A component created concurrently by another process is
// accepted and its parent fsynced as well.
//
// Durability itself cannot be shown by a unit test (it needs a crash between
// the mkdir and the disk); the tests check what can be checked: the modes,
// the idempotence and the refusal of a non-directory component. Errors are
// the underlying *os.PathError values, for the caller to wrap.
func MkdirAllSync(path string, perm os.FileMode) error {
	path = filepath.Clean(path)
	var missing []string
	for p := path; ; {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return &os.PathError{Op: "mkdir", Path: p, Err: unix.ENOTDIR}
			}
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		missing = append(missing, p)
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	for i := len(missing) - 1; i >= 0; i-- {
		d := missing[i]
		err := os.Mkdir(d, perm)
		switch {
		case err == nil:
			if err := os.Chmod(d, perm); err != nil {
				return err
			}
		case errors.Is(err, os.ErrExist):
			if fi, serr := os.Stat(d); serr != nil || !fi.IsDir() {
				return err
			}
		default:
			return err
		}
		if err := syncParent(filepath.Dir(d)); err != nil {
			return err
		}
	}
	return nil
}

// syncParent is the fsync of MkdirAllSync; a variable so that a test can see
// which directories are fsynced.
var syncParent = syncDir

// syncDir is SyncDir with the underlying error, for MkdirAllSync. A parent
// the user may search and write but not read (mode 0300, say) cannot be
// opened for the fsync; mkdir in it still succeeded, as with os.MkdirAll, so
// that one case is accepted without the fsync rather than refused.
func syncDir(dir string) error {
	if dropped("mkdir-parent") {
		return nil
	}
	f, err := os.Open(dir)
	if errors.Is(err, os.ErrPermission) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := fsyncDir(int(f.Fd())); err != nil {
		return &os.PathError{Op: "fsync", Path: dir, Err: err}
	}
	return nil
}
