package fsutil

import (
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Spare files.
//
// A long-running writer (fm procevent serve) replaces and removes small
// files in the same few directories hundreds of times a second: owner
// records, sequence counters, pending markers. Done with new files, every
// replace or removal frees an inode and every write allocates one, and on
// ext4 without a journal (as on the machines fm is measured on) allocating
// an inode searches past every inode freed in the last ~30 s (the kernel's
// recently_deleted): the cost of each create grows with the rate of frees
// itself, and would be serve's largest (docs/performance.md).
//
// So such a writer keeps the files it is done with as spares, for a
// directory it names (KeepSpares), and reuses them:
//   - Pending.ExchangeKeeping (and so ReplaceKeepingAt) leaves the replaced
//     file at the temporary name and keeps it, instead of unlinking it;
//   - RetireAt (and so RemoveKeepingAt) renames a removed file to a fresh
//     temporary name of this process and keeps it, instead of unlinking it;
//   - NewSpareAt (and so every CreateAt and ReplaceAt in the directory)
//     writes a spare, reopened with NewOptions.Reuse (only a plain file of
//     this user with one link and the mode asked, else it is unlinked and a
//     file created), rather than a new file.
//
// A spare is named as a temporary file of its process (TempName, or the
// directory's own form: KeepSpares' fresh), so every reader ignores it
// and the sweeps remove it once its process is dead. Durability is that of
// the operation it replaces: a spare is written, fsynced (unless NoSync)
// and renamed into place exactly as a new file would be.
//
// What changes for readers: a reader that opened a file by its name may
// hold it after it left the name, while it is rewritten as another file,
// and a name can even get its file back after the file held another
// name's bytes (a counter's spare reused for the next counter), so
// neither the link count nor a look at the name after reading tells. So
// only files whose readers cannot take a reused file's bytes for the old
// name's are kept (the Keeping calls are the only way in): files no reader
// opens (pending markers); files read through ReadPrivateAt (sequence
// counters), which holds what it reads (holdAt: a shared open-file-
// description lock that a writer reusing a spare must get exclusively,
// else the spare is dropped, and then a check that the name still holds
// the file); and owner records, whose names never come back, and whose
// reader checks after reading that the name still holds the file
// (launch). Every other replace and removal unlinks, as before.
//
// Every directory without a keeper, and every process that keeps none
// (one-shot commands, whose spares would outlive them until a sweep), works
// as before: a new file per write, an unlink per removal.

// spareMax bounds the spares kept per directory. It is sized for a burst:
// a serve whose sources answer at once retires one pending marker per
// source, and one or two owner records per poll, within milliseconds and
// before the next writes take them back, and a pool smaller than the burst
// unlinks the rest: inodes that every create for the next ~30 s searches
// past. 128 spares unlinked about one pending marker in three at 200
// sources (docs/performance.md, "Eighth pass").
const spareMax = 1024

// spareSize bounds the size of a file kept as a spare: bigger ones (a
// result, say) are unlinked, so spares never hold much disk: a full pool
// holds at most 4 MiB. Every file that is kept (an owner record, a
// sequence counter, a pending marker) is well under one block.
const spareSize = 4 << 10

// sparePool is the pool of spare files of one directory in this process.
type sparePool struct {
	mu    sync.Mutex
	users int
	names []string
	fresh func() (string, error)
}

// pools holds the pools by the name of their directory (os.File.Name of
// the pinned handle: the path it was opened by). A spare name is only
// used through a pinned directory and NewOptions.Reuse's checks, so a
// directory swapped at that path costs a fallback, not a mistake.
var pools struct {
	mu sync.Mutex
	m  map[string]*sparePool
}

// KeepSpares makes this process keep spares in the directory at path
// until the returned function is called; when the last keeper of path is
// done, its spares are unlinked. fresh names a file released into the
// pool (nil: TempName); the first keeper's fresh is the pool's. A
// long-running writer calls it for its lifetime and calls done before it
// exits.
func KeepSpares(path string, fresh func() (string, error)) (done func()) {
	pools.mu.Lock()
	if pools.m == nil {
		pools.m = map[string]*sparePool{}
	}
	s := pools.m[path]
	if s == nil {
		if fresh == nil {
			fresh = func() (string, error) { return TempName(), nil }
		}
		s = &sparePool{fresh: fresh}
		pools.m[path] = s
	}
	s.users++
	pools.mu.Unlock()
	return sync.OnceFunc(func() { dropSpares(path, s) })
}

// dropSpares ends one keeper of path; the last one unlinks the spares.
func dropSpares(path string, s *sparePool) {
	pools.mu.Lock()
	s.users--
	last := s.users == 0
	if last {
		delete(pools.m, path)
	}
	pools.mu.Unlock()
	if !last {
		return
	}
	s.mu.Lock()
	names := s.names
	s.names = nil
	s.mu.Unlock()
	if len(names) == 0 {
		return
	}
	dir, err := os.Open(path)
	if err != nil {
		return // gone: the sweeps remove what is left
	}
	defer dir.Close()
	for _, n := range names {
		_ = unix.Unlinkat(int(dir.Fd()), n, 0)
	}
}

// sparesOf returns the pool of dir, or nil when no one keeps spares there.
func sparesOf(dir *os.File) *sparePool {
	pools.mu.Lock()
	defer pools.mu.Unlock()
	return pools.m[dir.Name()]
}

// take returns a spare to write, or "" when there is none.
func (s *sparePool) take() string {
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.names) == 0 {
		return ""
	}
	name := s.names[len(s.names)-1]
	s.names = s.names[:len(s.names)-1]
	return name
}

// room reports whether the pool would keep one more spare.
func (s *sparePool) room() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.names) < spareMax
}

// keep keeps the file name of dir as a spare when the pool has room and
// the file is small, and unlinks it otherwise.
func (s *sparePool) keep(dir *os.File, name string) {
	if s.fits(dir, name) {
		s.mu.Lock()
		kept := len(s.names) < spareMax
		if kept {
			s.names = append(s.names, name)
		}
		s.mu.Unlock()
		if kept {
			return
		}
	}
	_ = unix.Unlinkat(int(dir.Fd()), name, 0)
}

// NewSpareAt starts a file in the pinned directory dir like NewAt, but on
// a spare of dir's pool when it has one fit to reuse (see "Spare files");
// o.Temp is the name of the file NewAt creates when there is none.
func NewSpareAt(dir *os.File, o NewOptions) (*Pending, error) {
	s := sparesOf(dir)
	for name := s.take(); name != ""; name = s.take() {
		r := o
		r.Temp, r.Stale, r.Reuse = name, false, true
		p, err := NewAt(dir, r)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, unix.ENOENT) {
			_ = unix.Unlinkat(int(dir.Fd()), name, 0) // not fit: not ours to keep
		}
	}
	return NewAt(dir, o)
}

// RetireAt removes the file name from the pinned directory dir, not
// durably (RemoveKeepingAt is the durable one): renamed to a fresh temporary
// name and kept as a spare when dir's pool has room (see "Spare files"),
// else unlinked. It reports false if name was already gone. Errors are the
// raw errno.
func RetireAt(dir *os.File, name string) (bool, error) {
	s := sparesOf(dir)
	if !s.fits(dir, name) {
		return UnlinkAt(dir, name)
	}
	fresh, err := s.freshName()
	if err != nil || fresh == "" {
		return UnlinkAt(dir, name)
	}
	switch err := RenameNoReplace(int(dir.Fd()), name, int(dir.Fd()), fresh); err {
	case nil:
		s.keep(dir, fresh)
		return true, nil
	case unix.ENOENT:
		return false, nil
	default:
		return UnlinkAt(dir, name)
	}
}

// fits reports whether the entry name of dir is one a spare may be made
// of: a regular file of at most spareSize bytes (anything else there, a
// planted directory say, is removed, or refused, as without spares).
func (s *sparePool) fits(dir *os.File, name string) bool {
	var st unix.Stat_t
	return s != nil && unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil &&
		st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size <= spareSize
}

// freshName is a name for a file released into the pool, or "" when the
// pool would not keep it.
func (s *sparePool) freshName() (string, error) {
	if !s.room() {
		return "", nil
	}
	return s.fresh()
}
