package fsutil

import (
	"sync"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/freshlook"
)

// Shared directory syncs.
//
// fsync(2) of a directory makes durable every change of its entries made
// before the call began, whichever descriptor of the directory it is called
// on. So concurrent writers of one directory (serve's passes, each
// publishing into the one inbox, the registry and the records directory)
// need not each sync it: a sync that began after a writer's change covers
// that change. fsyncDir shares syncs among the callers for one directory
// (by device and inode) by the freshlook rule: each caller gets the result
// of a sync that began after it asked, never an older one, so each returns
// only when its own change is as durable as a sync of its own would have
// made it. An error of the shared sync is every sharer's. And since the
// kernel reports a write error once per open file description (errseq), a
// sharer whose sync was made through another descriptor then collects its
// own descriptor's unreported error with sync_file_range(WAIT_BEFORE), which
// waits for writeback without a device flush and reports the descriptor's
// error as fsync would: an error already reported through the leader's
// descriptor is still reported through this one.
//
// The key is exact: every caller holds a descriptor of its directory, which
// keeps the inode from being freed and reused while its entry exists.
var dirSyncs struct {
	mu sync.Mutex
	m  map[[2]uint64]*dirSync
}

type dirSync struct {
	refs int // callers in fsyncDir; under dirSyncs.mu
	look freshlook.Look[error]
}

// dirSynced, when set (by tests), is called with the descriptor of every
// sync fsyncDir makes.
var dirSynced func(fd int)

// retryEINTR calls f again while it is interrupted (as os.File.Sync does: a
// FUSE or NFS sync can be).
func retryEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// fsyncDir fsyncs the directory open as fd, or waits for a sync of it that
// began after this call did.
func fsyncDir(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	key := [2]uint64{st.Dev, st.Ino}
	dirSyncs.mu.Lock()
	if dirSyncs.m == nil {
		dirSyncs.m = map[[2]uint64]*dirSync{}
	}
	s := dirSyncs.m[key]
	if s == nil {
		s = &dirSync{}
		dirSyncs.m[key] = s
	}
	s.refs++
	dirSyncs.mu.Unlock()
	led := false
	err := s.look.Get(func() error {
		led = true
		if dirSynced != nil {
			dirSynced(fd)
		}
		return retryEINTR(func() error { return unix.Fsync(fd) })
	})
	if err == nil && !led {
		err = retryEINTR(func() error { return unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WAIT_BEFORE) })
	}
	dirSyncs.mu.Lock()
	if s.refs--; s.refs == 0 {
		delete(dirSyncs.m, key)
	}
	dirSyncs.mu.Unlock()
	return err
}
