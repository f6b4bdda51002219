// Package fsutil holds the few durable-file primitives fm builds on: reading a
// private file without following links, and publishing a file durably either
// without replacing anything or by atomic replacement.
//
// Durability rule: a published file is written to a temp name, fsynced,
// renamed into place, and the directory is fsynced, so after a crash either
// the old state or the whole new file exists, never a torn one.
package fsutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// ErrExists is returned by PublishNoReplace when the final name exists.
var ErrExists = errors.New("file exists")

// ReadPrivateFile reads path, which must be one regular file (not a link, one
// hard link), owned by the user, mode exactly 0600, at most max bytes.
func ReadPrivateFile(path string, max int64) ([]byte, error) {
	f, err := OpenNoFollow(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readPrivate(f, path, max)
}

// ReadPrivateAt is ReadPrivateFile for name inside the open directory dir: it
// opens name relative to dir's descriptor without following a link, so a
// directory path swapped after dir was opened and checked cannot redirect the
// read. Errors name dir's path joined with name.
func ReadPrivateAt(dir *os.File, name string, max int64) ([]byte, error) {
	path := filepath.Join(dir.Name(), name)
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	switch {
	case err == unix.ELOOP:
		return nil, errcode.New(errcode.LinkUnsafe, "%q is a symlink", path)
	case err == unix.ENOENT:
		return nil, &os.PathError{Op: "open", Path: path, Err: os.ErrNotExist}
	case err != nil:
		return nil, errcode.Wrap(errcode.Internal, err, "open %q", path)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	return readPrivate(f, path, max)
}

// readPrivate applies the private-file rule of ReadPrivateFile to an open file.
func readPrivate(f *os.File, path string, max int64) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "stat %q", path)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, errcode.New(errcode.LinkUnsafe, "%q is not a regular file", path)
	case st.Nlink != 1:
		return nil, errcode.New(errcode.LinkUnsafe, "%q has %d hard links; it must have exactly one", path, st.Nlink)
	case int(st.Uid) != os.Geteuid():
		return nil, errcode.New(errcode.OwnerMismatch, "%q is owned by uid %d, not by you (uid %d)", path, st.Uid, os.Geteuid())
	case st.Mode&0o7777 != 0o600:
		return nil, errcode.New(errcode.ModeUnsafe, "%q has mode %04o; it must be 0600 (chmod 600)", path, st.Mode&0o7777)
	case st.Size > max:
		return nil, errcode.New(errcode.JSONOversized, "%q is larger than %d bytes", path, max)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read %q", path)
	}
	if int64(len(data)) > max {
		return nil, errcode.New(errcode.JSONOversized, "%q is larger than %d bytes", path, max)
	}
	return data, nil
}

// OpenNoFollow opens path read-only, refusing a symlink as the final component.
func OpenNoFollow(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		switch {
		case err == unix.ELOOP:
			return nil, errcode.New(errcode.LinkUnsafe, "%q is a symlink", path)
		case os.IsNotExist(err):
			return nil, &os.PathError{Op: "open", Path: path, Err: os.ErrNotExist}
		}
		return nil, errcode.Wrap(errcode.Internal, err, "open %q", path)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// WriteTemp writes data to a new temp file in dir with mode, fsynced, and
// returns its path.
func WriteTemp(dir string, data []byte, mode os.FileMode) (string, error) {
	var rnd [12]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, ".tmp-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "create %q", tmp)
	}
	if err := f.Chmod(mode); err == nil {
		if _, err = f.Write(data); err == nil {
			err = f.Sync()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", errcode.Wrap(errcode.Internal, err, "write %q", tmp)
	}
	return tmp, nil
}

// PublishNoReplace durably creates final with data, building the temp file in
// tmpDir (which must be on the same filesystem and should not be a directory
// that readers scan). If final exists, nothing changes and the error wraps
// ErrExists.
func PublishNoReplace(tmpDir, final string, data []byte, mode os.FileMode) error {
	tmp, err := WriteTemp(tmpDir, data, mode)
	if err != nil {
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE); err != nil {
		os.Remove(tmp)
		if err == unix.EEXIST {
			return errcode.Wrap(errcode.BindingExists, ErrExists, "%q already exists", final)
		}
		return errcode.Wrap(errcode.Internal, err, "publish %q", final)
	}
	if err := SyncDir(filepath.Dir(final)); err != nil {
		return err
	}
	if filepath.Dir(final) != tmpDir {
		return SyncDir(tmpDir)
	}
	return nil
}

// WriteAtomic durably replaces final with data (temp file in the same
// directory, fsync, rename, directory fsync).
func WriteAtomic(final string, data []byte, mode os.FileMode) error {
	tmp, err := WriteTemp(filepath.Dir(final), data, mode)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return errcode.Wrap(errcode.Internal, err, "publish %q", final)
	}
	return SyncDir(filepath.Dir(final))
}

// SyncDir fsyncs a directory so the names in it are durable.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "open directory %q", dir)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return errcode.Wrap(errcode.Internal, err, "sync directory %q", dir)
	}
	return nil
}
