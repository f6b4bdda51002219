package fsutil

import (
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// MoveNoReplace durably moves src to dst (paths) without replacing
// anything: RenameNoReplace, then an fsync of dst's directory, then of
// src's. The order is the rule: once dst's directory is synced the entry
// has its new name on disk, so a crash between the two syncs leaves it
// under both names (its old one not yet removed), never under neither.
// A failed rename is returned as its raw errno (unix.EEXIST when dst
// exists), for the caller to judge; a failed sync is an errcode error.
func MoveNoReplace(src, dst string) error {
	if err := RenameNoReplace(unix.AT_FDCWD, src, unix.AT_FDCWD, dst); err != nil {
		return err
	}
	if err := SyncDir(filepath.Dir(dst)); err != nil {
		return err
	}
	if filepath.Dir(src) == filepath.Dir(dst) {
		return nil
	}
	return SyncDir(filepath.Dir(src))
}

// MkdirAt durably creates the directory name (mode perm, less the umask) in the
// pinned directory dir: mkdirat, then an fsync of dir, so the new name
// survives a crash once the call returns. An existing entry is
// unix.EEXIST, with nothing synced; errors of the mkdir are the raw errno.
func MkdirAt(dir *os.File, name string, perm uint32) error {
	if err := unix.Mkdirat(int(dir.Fd()), name, perm); err != nil {
		return err
	}
	return SyncAt(dir)
}

// SyncSites names every fsync call site of this package, for the
// power-loss sweep's mutation proof (mutate_on.go): "file" (a published
// file's bytes), "publish-dir" (the directory it is published in),
// "publish-temp-dir" (the directory it was written in, with
// NewOptions.Final), "sync-at" (SyncAt: removals, MkdirAt), "sync-dir"
// (SyncDir: moves), "mkdir-parent" (MkdirAllSync) and "tree" (SyncFS on
// FUSE).
func SyncSites() []string {
	return []string{"file", "publish-dir", "publish-temp-dir", "sync-at", "sync-dir", "mkdir-parent", "tree"}
}

// fuseMagic is the f_type statfs(2) reports for a FUSE file system.
const fuseMagic = 0x65735546

// SyncFS makes every file and directory of the file system that dir is on
// durable, for a tree written under dir in one go: one syncfs(2), which
// writes back and waits for every dirty page and inode of that file system
// (see pkgtree's flush for why that is the store copy's barrier). On FUSE
// the kernel sends syncfs to no daemon (only virtiofs gets FUSE_SYNCFS), so
// the call makes nothing durable there: on a FUSE file system every file
// and directory under dir is fsynced instead, files first, each
// directory after its entries.
func SyncFS(dir *os.File) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(dir.Fd()), &st); err != nil {
		return errcode.Wrap(errcode.Internal, err, "statfs %s", dir.Name())
	}
	if st.Type != fuseMagic {
		if err := unix.Syncfs(int(dir.Fd())); err != nil {
			return errcode.Wrap(errcode.Internal, err, "syncfs %s", dir.Name())
		}
		return nil
	}
	var dirs []string
	err := filepath.WalkDir(dir.Name(), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return syncPath(p)
	})
	for i := len(dirs) - 1; err == nil && i >= 0; i-- {
		err = syncPath(dirs[i])
	}
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "sync the tree %s", dir.Name())
	}
	return nil
}

// syncPath fsyncs the file or directory p (opened read-only, links not
// followed).
func syncPath(p string) error {
	if dropped("tree") {
		return nil
	}
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return retryEINTR(func() error { return unix.Fsync(fd) })
}
