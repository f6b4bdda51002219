package fsutil

import (
	"path/filepath"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// OnParentMount proves that the directory p is on the same mount as its
// parent directory: not a mount point, neither of another filesystem nor a
// bind mount of a directory elsewhere. fd, when not -1, is p opened (the
// check is then made on the open descriptor, as the rest of OpenDir's).
//
// This is the one check of the capture boundary's mount rule ([HOME-3],
// [CAP-6]): a directory fm writes a home's private files in lies on the
// mount of the directory that holds it, so a mount made over it (by root,
// or by a user in a mount namespace) cannot redirect fm's writes out of the
// home while every path still reads as the home's. Mounts are told apart by
// statx's mount id (STATX_MNT_ID, Linux 5.8); where the kernel does not
// report it, by st_dev, which still tells a mount of another filesystem
// apart (a bind mount of the same filesystem then goes unseen).
func OnParentMount(p string, fd int, what string) error {
	var self, parent unix.Statx_t
	var err error
	if fd >= 0 {
		err = unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &self)
	} else {
		err = unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &self)
	}
	if err != nil {
		return errcode.Wrap(errcode.PathUnsafe, err, "statx %s %q", what, p)
	}
	up := filepath.Dir(p)
	if err := unix.Statx(unix.AT_FDCWD, up, 0, unix.STATX_MNT_ID, &parent); err != nil {
		return errcode.Wrap(errcode.PathUnsafe, err, "statx the parent of %s %q", what, p)
	}
	same := self.Dev_major == parent.Dev_major && self.Dev_minor == parent.Dev_minor
	if self.Mask&parent.Mask&unix.STATX_MNT_ID != 0 {
		same = self.Mnt_id == parent.Mnt_id
	}
	if !same {
		return errcode.New(errcode.PathUnsafe, "%s %q is a mount point (another mount than its parent %q): fm keeps a home's directories on the mount that holds them, so that no mount redirects what it writes; unmount it, or mount at the home (FM_HOME) or state root's parent instead", what, p, up)
	}
	return nil
}
