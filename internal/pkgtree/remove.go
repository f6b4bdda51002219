package pkgtree

import (
	"errors"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// RemoveInstalled removes the store copy dst after package code ran in it
// (a bind whose handshake changed the copy it had just installed). Package
// code may have left anything there, and a process that escaped its group
// may still be changing it, so nothing is followed: every directory is
// opened relative to its parent's descriptor with O_NOFOLLOW, given back
// the owner's bits through that descriptor (a 0555 directory's entries
// cannot be removed otherwise), and every entry is removed by name relative
// to it; a symlink is removed, never its target. A directory its owner
// cannot even open (package code chmodded it to 0000) is first opened as a
// path only (O_PATH, O_NOFOLLOW) and given the owner's bits through that
// descriptor's /proc/self/fd link, which names that very directory.
func RemoveInstalled(dst string) error {
	if !filepath.IsAbs(dst) || filepath.Clean(dst) != dst {
		return errcode.New(errcode.PathUnsafe, "store directory %q is not an absolute clean path", dst)
	}
	parent, err := unix.Open(filepath.Dir(dst), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil // package code removed the copy with its parent
	}
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "open %s", filepath.Dir(dst))
	}
	defer unix.Close(parent)
	if err := removeAt(parent, filepath.Base(dst)); err != nil {
		return errcode.Wrap(errcode.Internal, err, "remove %s", dst)
	}
	return nil
}

// removeAt removes the entry name of the directory dirfd and, for a
// directory, everything in it first.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, err := openDirAt(dirfd, name)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return err
	}
	names, err := readDirNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := removeAt(fd, n); err != nil {
			return err
		}
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// openDirAt opens the directory name of dirfd for reading, following no
// link; one its owner may not read is given the owner's bits first (see
// RemoveInstalled).
func openDirAt(dirfd int, name string) (int, error) {
	const flags = unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|flags, 0)
	if !errors.Is(err, unix.EACCES) {
		return fd, err
	}
	p, err := unix.Openat(dirfd, name, unix.O_PATH|flags, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(p)
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(p), 0o700); err != nil {
		return -1, err
	}
	return unix.Openat(p, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// readDirNames lists the names in the directory fd (without "." and "..").
func readDirNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}
