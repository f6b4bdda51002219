package fsutil

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/freshlook"
)

// Locks. Every lock of fm (the lifecycle lock, serve's lock, a source's claim
// and stop request, the wake queue) is taken here and nowhere else; this is
// the only file that calls flock(2). The rule, stated once:
//
// A lock is an flock(2) on the regular file at a name inside a pinned
// directory handle, and it is held only while the locked descriptor is the
// file at that name and no other process holds a lock on a removed file
// that had that name.
//
//   - The file is opened relative to the directory descriptor with
//     O_NOFOLLOW|O_CLOEXEC (a package process never inherits it), created
//     when absent with mode exactly 0600 (the directory is then fsynced), and
//     must be a regular file owned by the effective uid with mode 0600. A
//     lock file that holds no data (every lock but the wake queue, which
//     sets LockOptions.Data) holds its tag instead: "fm-lock <dev>:<ino>
//     <name>\n", naming the directory by device and inode and the file by
//     its name there, written when fm creates it (or, for an empty lock
//     file of an earlier fm, when fm next holds it).
//   - The flock is tried without blocking (LOCK_NB) with a back-off up to
//     lockPollMax, so every wait ends when its context does; a Try lock
//     returns ErrLocked when another holds it for longer than tryFor. The kernel
//     drops a dead holder's lock: a waiter never guesses whether a holder is
//     alive and never steals from a live one.
//   - Once flock succeeds, identity is proved: fstat of the descriptor and
//     fstatat(dir, name, AT_SYMLINK_NOFOLLOW) must give the same device and
//     inode. A file removed or replaced at the name between open and flock
//     (by fm itself, such as a retire removing a claim or a compaction
//     replacing the wake queue, or by anyone else) is dropped and the current
//     file tried again, at most maxLockSwaps times in all.
//   - Orphans: a holder keeps its lock when someone removes or replaces the
//     file at the name, and a later contender would create or find another
//     inode there and lock it alongside. So a contender that has proved its
//     identity then reads the holders of flock(2) locks in /proc/locks and
//     looks, through /proc/<pid>/fd, for a locked descriptor that names
//     "<dir>/<name> (deleted)", <dir> by this or any other path to the
//     same directory (a bind mount): such an orphaned holder counts as holding
//     the lock, and the contender drops its own and waits (or, with Try,
//     returns ErrLocked). A holder keeps its lock, too, when someone moves
//     the file to another name (mv serve.lock serve.lock.old): its
//     descriptor then names the new path, so a locked descriptor of a
//     regular file that holds this lock's tag counts as a holder as well,
//     wherever the file now is. A moved wake queue has no tag; its wakes
//     moved with it, and its holder's append with them.
//     The look-up costs no more with the descriptors of other holders:
//     their /proc/locks entries are kept only when on the device that
//     /proc/locks gives the contender's own lock, where that is the device
//     stat(2) gives the directory (a removed or moved lock file stays on
//     its file system; an overlay, a btrfs subvolume or a file mounted over
//     the name may disagree, and then all are kept, as by Held, which holds
//     nothing),
//     and the descriptors of another process on the inodes it holds
//     (device and inode number: two file systems reuse the same numbers) are
//     remembered from one listing of its /proc/<pid>/fd and proved current
//     by one stat each (an open descriptor pins its inode, so the number
//     cannot name another file of that inode number). A process is listed
//     again only when it holds an inode not remembered, or a remembered
//     descriptor no longer proves current; no negative answer is kept. So
//     a warm look-up costs a stat and a readlink per lock another process
//     holds on the file system, not a stat per descriptor it has open.
//     Only holders of the same effective uid can be seen
//     this way, and every lock file is owned by that uid; the holder must be
//     the process that took the lock, which for fm's close-on-exec
//     descriptors it always is. A directory moved away with its lock file
//     inside is not a removal at the name: the pinned handles of package
//     procevent and home refuse a moved directory before they write.
//
// The lock is held for as long as the Locked value lives; Release drops it.
type Locked struct {
	f    *os.File
	path string // "<directory as resolved when locked>/<name>"
}

// own is the set of locks this process holds, so that the orphan look-up
// checks them in memory rather than through every descriptor of
// /proc/self/fd (serve holds a claim and pipes for each running poll). A
// Lock registers here only when, under the mutex, no lock of the process
// has the name: two goroutines may each lock another inode of one name (one
// locked the file just replaced at it) and each find none before the other
// registers.
var own struct {
	sync.Mutex
	held map[string]int // Locked.path -> how many of this process's locks have it
}

// LockOptions select how a lock is taken. Every lock is exclusive: no caller
// needs a shared one (Probe and Held only look).
type LockOptions struct {
	// Try does not wait for a holder: ErrLocked when another holds the lock
	// for longer than tryFor.
	Try bool
	// What names the file in errors ("lifecycle lock", "wake queue").
	What string
	// Data says that the lock file holds data (the wake queue): fm never
	// writes a tag into it (see the rule above).
	Data bool
	// Waiting, when set, is called once, when Lock first has to wait: its
	// first attempt found the lock held. Until then ctx has not been
	// looked at (the wake queue's group commit withdraws a cancelled wake
	// only from a batch that waits).
	Waiting func()
}

// ErrLocked is returned by a Try lock that another process holds.
var ErrLocked = errors.New("lock held by another process")

// ErrInterrupted is wrapped, with the context's cause, in the process-failed
// error of Lock when its context ends before the lock could be taken;
// nothing is held then.
var ErrInterrupted = errors.New("interrupted while waiting for a lock")

// Interrupted is the error of a wait for a lock that ended with ctx
// (process-failed, wrapping ErrInterrupted and ctx's cause); format and args
// say what was waited for. Nothing is held then.
func Interrupted(ctx context.Context, format string, args ...any) error {
	return errcode.Wrap(errcode.ProcessFailed, fmt.Errorf("%w: %w", ErrInterrupted, context.Cause(ctx)), format, args...)
}

const (
	// lockPollMax caps the back-off between two attempts at a held lock.
	lockPollMax = 50 * time.Millisecond
	// maxLockSwaps bounds the attempts of one Lock whose file was replaced at
	// its name between open and flock.
	maxLockSwaps = 100
	// tryFor is how long a Try lock keeps trying before it reports
	// ErrLocked: long enough to outlast a momentary holder (a contender
	// that locked a file just removed, or the shared lock of a Probe where
	// /proc/locks cannot answer), so that neither makes a Try fail, and
	// short enough that a live holder is reported at once.
	tryFor = 50 * time.Millisecond
)

// Lock takes the lock on the file name in the directory dir (see the rule
// above) and returns it held. It waits, with back-off, until the lock is free
// or ctx ends (process-failed, wrapping ErrInterrupted); with o.Try it
// returns ErrLocked once the lock has stayed held for tryFor.
func Lock(ctx context.Context, dir *os.File, name string, o LockOptions) (*Locked, error) {
	path := filepath.Join(dir.Name(), name)
	t, err := tag(dir, name)
	if err != nil {
		return nil, err
	}
	swaps, start := 0, time.Now()
	for delay := time.Millisecond; ; {
		f, err := openLock(dir, name, path, t, o)
		if err != nil {
			return nil, err
		}
		held, err := flock(f, unix.LOCK_EX)
		if err == nil && held {
			var same bool
			if same, err = sameFile(dir, name, f); err == nil && !same {
				f.Close()
				if swaps++; swaps >= maxLockSwaps {
					return nil, errcode.New(errcode.PathUnsafe, "%s %q was replaced %d times while fm was locking it; stop whatever keeps replacing it", what(o), path, swaps)
				}
				continue // removed or replaced since it was opened: lock the current file
			}
			if err == nil {
				var orphan bool
				var at string
				if orphan, at, err = orphanedOf(dir, name, f, t); err == nil && !orphan && !o.Data {
					err = tagOnce(f, t)
				}
				if err == nil && !orphan {
					// Register under the mutex that the look-up of own
					// held read: another goroutine that found no lock of
					// this process on the name either (it locked the file
					// just replaced at it) may have registered since.
					own.Lock()
					if own.held == nil {
						own.held = map[string]int{}
					}
					if own.held[at] == 0 {
						own.held[at]++
						own.Unlock()
						return &Locked{f: f, path: at}, nil
					}
					own.Unlock()
				}
			}
		}
		f.Close()
		switch {
		case err != nil:
			return nil, err
		case o.Try && time.Since(start) >= tryFor:
			return nil, ErrLocked
		}
		if o.Waiting != nil {
			o.Waiting()
			o.Waiting = nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, Interrupted(ctx, "waiting for the %s %q, which another process holds", what(o), path)
		case <-t.C:
		}
		delay = min(2*delay, lockPollMax)
	}
}

// Probe reports whether a process holds the lock on the file now at name
// in dir, cheaply: it tries a shared lock without waiting and drops it at
// once. It creates nothing; an absent file is not held. For that instant a
// concurrent Lock finds the file busy, so Probe is only for a file that is
// never taken with Try (a retire's stop request, which its runner probes
// every 100 ms); it does not look for orphaned holders. Use Held elsewhere.
func Probe(dir *os.File, name string, o LockOptions) (bool, error) {
	f, _, err := openProbe(dir, name, o)
	if f == nil || err != nil {
		return false, err
	}
	defer f.Close()
	free, err := flock(f, unix.LOCK_SH)
	return !free, err
}

// Held reports whether Lock would find the lock name of dir held: a process
// holds the file now at name, or an orphaned holder a removed file of that
// name (see the rule above). It reads /proc/locks for an exclusive flock(2)
// on the file's device and inode, so it never takes the lock, even for an
// instant, and fm doctor can never make a starting serve or runner fail.
// Where /proc/locks is unreadable, or names the inode on another device
// number only (an overlay file system may report two), it falls back to
// Probe's shared lock. It creates nothing; an absent file is not held
// unless by an orphaned holder.
func Held(dir *os.File, name string, o LockOptions) (bool, error) {
	f, st, err := openProbe(dir, name, o)
	if err != nil {
		return false, err
	}
	if f != nil {
		defer f.Close()
		locks, ok := readFlocks()
		ambiguous := !ok
		for _, l := range locks {
			if l.ino == st.Ino && l.write {
				if l.dev == devString(st.Dev) {
					return true, nil
				}
				ambiguous = true
			}
		}
		if ambiguous {
			if free, err := flock(f, unix.LOCK_SH); !free || err != nil {
				return !free, err
			}
		}
	}
	t, err := tag(dir, name)
	if err != nil {
		return false, err
	}
	orphan, _, err := orphanedOf(dir, name, nil, t)
	return orphan, err
}

// openProbe opens the existing file name of dir read-only for Probe and
// Held, without following a link; a nil file means it is absent.
func openProbe(dir *os.File, name string, o LockOptions) (*os.File, *unix.Stat_t, error) {
	path := filepath.Join(dir.Name(), name)
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	switch err {
	case nil:
	case unix.ENOENT:
		return nil, nil, nil
	case unix.ELOOP:
		return nil, nil, errcode.New(errcode.LinkUnsafe, "%s %q is a symlink; remove it", what(o), path)
	default:
		return nil, nil, errcode.Wrap(errcode.Internal, err, "open %s %q", what(o), path)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, nil, errcode.Wrap(errcode.Internal, err, "stat %s %q", what(o), path)
	}
	return os.NewFile(uintptr(fd), path), &st, nil
}

// File is the locked file, for a lock file that also holds data (the wake
// queue). It is open read-write with O_APPEND.
func (l *Locked) File() *os.File { return l.f }

// At reports whether the locked file is still the entry name of dir (not
// removed or replaced since it was locked), for a holder that pinned dir
// again since.
func (l *Locked) At(dir *os.File, name string) (bool, error) { return sameFile(dir, name, l.f) }

// Release drops the lock. It may be called more than once, and on nil.
//
// The lock leaves own before its descriptor is closed, and the close is
// outside own's mutex: a thousand polls released at once (serve stopped)
// otherwise queued on the mutex behind each other's close. In between, the
// orphan look-up does not count this lock as one of the process's own,
// which it stops being a moment later; the other order would make it count
// a lock already dropped.
func (l *Locked) Release() {
	if l == nil {
		return
	}
	own.Lock()
	f := l.f
	l.f = nil
	if f != nil {
		if own.held[l.path]--; own.held[l.path] <= 0 {
			delete(own.held, l.path)
		}
	}
	own.Unlock()
	if f != nil {
		f.Close()
	}
}

func what(o LockOptions) string {
	if o.What == "" {
		return "lock file"
	}
	return o.What
}

// openLock opens, creating when absent, the lock file name of dir and checks
// it: a regular file owned by the effective uid with mode 0600. O_NONBLOCK
// keeps a FIFO planted at the name from blocking the open; the check refuses
// it.
func openLock(dir *os.File, name, path string, t []byte, o LockOptions) (*os.File, error) {
	const flags = unix.O_RDWR | unix.O_APPEND | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
	for {
		fd, err := unix.Openat(int(dir.Fd()), name, flags|unix.O_CREAT|unix.O_EXCL, 0o600)
		if err == nil {
			// New: make the mode exact whatever the umask, and the name durable.
			if err = unix.Fchmod(fd, 0o600); err == nil && !o.Data {
				_, err = unix.Write(fd, t)
			}
			if err == nil {
				err = fsyncDir(int(dir.Fd()))
			}
			if err != nil {
				unix.Close(fd)
				return nil, errcode.Wrap(errcode.Internal, err, "create %s %q", what(o), path)
			}
			return os.NewFile(uintptr(fd), path), nil
		}
		if err == unix.EEXIST {
			fd, err = unix.Openat(int(dir.Fd()), name, flags, 0)
			if err == unix.ENOENT {
				continue // removed between the two opens
			}
		}
		switch {
		case err == unix.ELOOP:
			return nil, errcode.New(errcode.LinkUnsafe, "%s %q is a symlink; remove it", what(o), path)
		case err != nil:
			return nil, errcode.Wrap(errcode.Internal, err, "open %s %q", what(o), path)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, errcode.Wrap(errcode.Internal, err, "stat %s %q", what(o), path)
		}
		var bad error
		switch {
		case st.Mode&unix.S_IFMT != unix.S_IFREG:
			bad = errcode.New(errcode.PathUnsafe, "%s %q is not a regular file; move it aside", what(o), path)
		case int(st.Uid) != os.Geteuid():
			bad = errcode.New(errcode.OwnerMismatch, "%s %q is owned by uid %d, not by you (uid %d): chown it, or run fm as its owner", what(o), path, st.Uid, os.Geteuid())
		case st.Mode&0o7777 != 0o600:
			bad = errcode.New(errcode.ModeUnsafe, "%s %q has mode %04o; it must be 0600 (chmod 600)", what(o), path, st.Mode&0o7777)
		}
		if bad != nil {
			unix.Close(fd)
			return nil, bad
		}
		return os.NewFile(uintptr(fd), path), nil
	}
}

// flock takes how on f without waiting; false means another open file holds
// a conflicting lock.
func flock(f *os.File, how int) (bool, error) {
	for {
		switch err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB); err {
		case nil:
			return true, nil
		case unix.EWOULDBLOCK:
			return false, nil
		case unix.EINTR:
		default:
			return false, errcode.Wrap(errcode.Internal, err, "lock %q", f.Name())
		}
	}
}

// sameFile reports whether the open file f is still the entry name of dir
// (same device and inode; not removed or replaced since it was opened).
func sameFile(dir *os.File, name string, f *os.File) (bool, error) {
	var a, b unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &b); err != nil {
		return false, errcode.Wrap(errcode.Internal, err, "stat %q", f.Name())
	}
	switch err := unix.Fstatat(int(dir.Fd()), name, &a, unix.AT_SYMLINK_NOFOLLOW); err {
	case nil:
		return a.Dev == b.Dev && a.Ino == b.Ino, nil
	case unix.ENOENT:
		return false, nil
	default:
		return false, errcode.Wrap(errcode.Internal, err, "stat %q", f.Name())
	}
}

// orphanedOf reports whether a process holds an flock(2) lock on a removed
// file that was the entry name of dir (see Orphans in the rule above), and
// returns at, "<dir as resolved now>/<name>". For this process that is one of
// its own held locks with the same at (an index, not a look at every
// descriptor: serve holds a claim per running poll); for another, one of its
// descriptors on an inode that /proc/locks lists as flocked by it is such a
// file (orphanSearch.holds; f, the file the caller holds, is skipped). A
// system without /proc/locks has no orphans to find.
func orphanedOf(dir *os.File, name string, f *os.File, wantTag []byte) (orphan bool, at string, err error) {
	dirPath, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(dir.Fd())))
	if err != nil {
		return false, "", errcode.Wrap(errcode.Internal, err, "resolve directory %q", dir.Name())
	}
	at = filepath.Join(dirPath, name)
	// One of this process's own locks on that name: the caller holds the
	// flock of the file now at the name, which a lock on that same file
	// through another descriptor would forbid, so the other one is on a
	// removed file.
	own.Lock()
	mine := own.held[at] > 0
	own.Unlock()
	if mine {
		return true, at, nil
	}
	locks, ok := readFlocks()
	if !ok {
		return false, at, nil
	}
	o := newOrphanSearch(dir, name, at, f, wantTag, locks)
	for pid, locked := range o.otherHolders(locks) {
		fds, ok := lockFDs.valid(pid, locked)
		if !ok {
			if fds, ok = scanFDs(pid, locked); !ok {
				continue // gone, or another user's process: it cannot hold our lock files
			}
		}
		for _, d := range fds {
			if o.holds(d.path, &d.st) {
				return true, at, nil
			}
		}
	}
	return false, at, nil
}

// orphanSearch is what one orphan look-up compares every other holder's
// descriptors with: the name, the directory and the file now at the name.
type orphanSearch struct {
	name    string
	removed string      // "<at> (deleted)", what a descriptor on the removed file names
	tag     []byte      // the content of a lock file of this name
	dir     unix.Stat_t // Ino 0: the directory could not be looked at
	now     unix.Stat_t // the file now at the name, which is not an orphan (Ino 0: none)
	current uint64      // the inode the caller holds: not an orphan
	self    string      // this process's pid, whose locks orphanedOf looked at by index
	dev     string      // the directory's device as /proc/locks prints it; "": compare none
}

func newOrphanSearch(dir *os.File, name, at string, f *os.File, tag []byte, locks []flockEntry) *orphanSearch {
	o := &orphanSearch{name: name, removed: at + " (deleted)", tag: tag, self: strconv.Itoa(os.Getpid())}
	if f != nil {
		var st unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st) == nil {
			o.current = st.Ino
		}
	}
	if unix.Fstat(int(dir.Fd()), &o.dir) != nil {
		o.dir.Ino = 0
	}
	if unix.Fstatat(int(dir.Fd()), name, &o.now, unix.AT_SYMLINK_NOFOLLOW) != nil {
		o.now.Ino = 0
	}
	if f != nil {
		o.dev = o.lockDevice(locks)
	}
	return o
}

// lockDevice is the device of the directory's file system as /proc/locks
// prints it: that of the caller's own entry on the file it holds, when it is
// the device stat(2) gives the directory. A removed or moved lock file stays
// on its file system (a move across file systems removes it), so an entry on
// another device cannot be an orphan of the name. Where the two disagree (an
// overlay or a btrfs subvolume reports another device than /proc/locks; a
// file mounted over the name is on another file system than the one the
// holder of the file under it locked), "" is returned and no device is
// compared; nor by Held, which holds nothing.
func (o *orphanSearch) lockDevice(locks []flockEntry) string {
	if o.dir.Ino == 0 {
		return ""
	}
	dev := ""
	for _, l := range locks {
		if l.pid == o.self && l.ino == o.current && l.dev == devString(o.dir.Dev) {
			dev = l.dev
		}
	}
	return dev
}

// otherHolders maps each other process that /proc/locks lists to the inodes
// it flocks that could be an orphan of the name.
func (o *orphanSearch) otherHolders(locks []flockEntry) map[string]map[lockedInode]bool {
	inos := map[string]map[lockedInode]bool{}
	for _, l := range locks {
		if l.pid == o.self || l.ino == o.current || o.dev != "" && l.dev != o.dev && !lookupUncached {
			continue
		}
		if inos[l.pid] == nil {
			inos[l.pid] = map[lockedInode]bool{}
		}
		inos[l.pid][lockedInode{l.dev, l.ino}] = true
	}
	return inos
}

// holds reports whether the descriptor fd, a locked file st, is an orphaned
// holder: it names the removed file (namesRemoved), or it is a lock file of
// this name moved elsewhere (isMovedLockFile).
func (o *orphanSearch) holds(fd string, st *unix.Stat_t) bool {
	return o.namesRemoved(fd) || o.isMovedLockFile(fd, st)
}

// namesRemoved: the descriptor names "<at> (deleted)", or "<d>/<name>
// (deleted)" where d is this directory by another path (a holder that opened
// it through a bind mount names it by the mount's path; a lock file with data
// has no tag to find it by).
func (o *orphanSearch) namesRemoved(fd string) bool {
	t, err := os.Readlink(fd)
	if err != nil {
		return false
	}
	if t == o.removed {
		return true
	}
	p, ok := strings.CutSuffix(t, " (deleted)")
	if !ok || filepath.Base(p) != o.name || o.dir.Ino == 0 {
		return false
	}
	var d unix.Stat_t
	return unix.Stat(filepath.Dir(p), &d) == nil && d.Dev == o.dir.Dev && d.Ino == o.dir.Ino
}

// isMovedLockFile: a regular file other than the one at the name that holds
// the tag of a lock file of this name.
func (o *orphanSearch) isMovedLockFile(fd string, st *unix.Stat_t) bool {
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(len(o.tag)) || (st.Dev == o.now.Dev && st.Ino == o.now.Ino) {
		return false
	}
	got, err := readTag(fd, len(o.tag))
	return err == nil && bytes.Equal(got, o.tag)
}

// lookupUncached makes the orphan look-up scan every descriptor of every
// other holder on each call, as before lockFDs, and compare no device: only
// BenchmarkLockNeighbour sets it, to measure both in one run.
var lookupUncached bool

// fdScanned is called with the pid of each /proc/<pid>/fd directory the
// orphan look-up lists (a test counts them).
var fdScanned = func(pid string) {}

// lockFD is a descriptor of another process on an inode it holds flocked:
// its /proc/<pid>/fd path and what it was when last looked at.
type lockFD struct {
	path string
	st   unix.Stat_t
}

// lockFDs remembers, for each other process, its descriptors on the inodes
// it holds flocked, so that the orphan look-up lists /proc/<pid>/fd (which
// costs a stat per descriptor: a serve with 1,000 sources has thousands)
// only when that process holds a lock on an inode it has not seen it hold.
// A remembered descriptor is proved still current by one stat: it still
// names the inode, which cannot be reused while that descriptor holds it
// open. A process whose remembered descriptors no longer all prove current,
// or that holds an inode not remembered, is listed again; so is one where
// no descriptor was found (nothing negative is remembered: the process may
// have locked the inode anew since /proc/locks was read).
var lockFDs fdCache

type fdCache struct {
	sync.Mutex
	byPid map[string]map[lockedInode]*heldFDs // pid -> inode -> descriptors
}

// lockedInode is an inode as /proc/locks names it. The device is part of
// it: two file systems give the same inode numbers (two tmpfs mounts do from
// 1 up), so a descriptor remembered on one must never stand for a lock on
// the other.
type lockedInode struct {
	dev string // "<major>:<minor>" as /proc/locks prints it
	ino uint64
}

type heldFDs struct {
	fds []lockFD
	// missed counts the reads of /proc/locks in a row that did not list the
	// inode: the kernel hands /proc/locks out a page per read, so a list of
	// more than a page is not one snapshot, and under churn (other
	// processes locking and unlocking) the same line can be skipped by
	// several reads in a row. An inode is forgotten only after forgetMisses
	// such reads; forgetting it early costs a new listing of its holder's
	// descriptors, keeping it costs nothing (it is consulted only while
	// /proc/locks lists the inode, and proved by a stat then).
	missed int
}

// forgetMisses is how many reads of /proc/locks in a row must miss an
// inode before the cache forgets it (see heldFDs.missed).
const forgetMisses = 8

// valid returns the remembered descriptors of pid on the inodes locked,
// each proved current by a stat, or false when pid must be listed again.
func (c *fdCache) valid(pid string, locked map[lockedInode]bool) ([]lockFD, bool) {
	if lookupUncached {
		return nil, false
	}
	c.Lock()
	known := c.byPid[pid]
	var out []lockFD
	for ino := range locked {
		h := known[ino]
		if h == nil {
			c.Unlock()
			return nil, false
		}
		out = append(out, h.fds...)
	}
	c.Unlock()
	for i := range out {
		d := &out[i]
		dev, ino := d.st.Dev, d.st.Ino
		if unix.Stat(d.path, &d.st) != nil || d.st.Dev != dev || d.st.Ino != ino {
			return nil, false
		}
	}
	return out, true
}

// scanFDs lists /proc/<pid>/fd for the descriptors on the inode numbers
// locked and remembers those found on the device /proc/locks names; false
// when the directory cannot be read. A descriptor whose stat(2) device is
// not the one of /proc/locks (an overlay) is examined but not remembered, so
// such a lock is listed again on every look-up, as before lockFDs.
func scanFDs(pid string, locked map[lockedInode]bool) ([]lockFD, bool) {
	fdScanned(pid)
	entries, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		return nil, false
	}
	numbers := map[uint64]bool{}
	for k := range locked {
		numbers[k.ino] = true
	}
	var out []lockFD
	found := map[lockedInode][]lockFD{}
	for _, e := range entries {
		d := lockFD{path: "/proc/" + pid + "/fd/" + e.Name()}
		if unix.Stat(d.path, &d.st) != nil || !numbers[d.st.Ino] {
			continue
		}
		out = append(out, d)
		k := lockedInode{devString(d.st.Dev), d.st.Ino}
		found[k] = append(found[k], d)
	}
	lockFDs.Lock()
	defer lockFDs.Unlock()
	if lockFDs.byPid == nil {
		lockFDs.byPid = map[string]map[lockedInode]*heldFDs{}
	}
	known := lockFDs.byPid[pid]
	if known == nil {
		known = map[lockedInode]*heldFDs{}
		lockFDs.byPid[pid] = known
	}
	for k := range locked {
		if found[k] != nil {
			known[k] = &heldFDs{fds: found[k]}
		} else {
			delete(known, k)
		}
	}
	return out, true
}

// prune forgets the inodes that /proc/locks did not list forgetMisses times in a row as
// flocked by their process, so that the cache stays as small as it.
func (c *fdCache) prune(locks []flockEntry) {
	c.Lock()
	defer c.Unlock()
	held := map[string]map[lockedInode]bool{} // of the processes remembered only
	for _, l := range locks {
		if c.byPid[l.pid] == nil {
			continue
		}
		if held[l.pid] == nil {
			held[l.pid] = map[lockedInode]bool{}
		}
		held[l.pid][lockedInode{l.dev, l.ino}] = true
	}
	for pid, inos := range c.byPid {
		for ino, h := range inos {
			if held[pid][ino] {
				h.missed = 0
			} else if h.missed++; h.missed >= forgetMisses {
				delete(inos, ino)
			}
		}
		if len(inos) == 0 {
			delete(c.byPid, pid)
		}
	}
}

// flockEntry is one held flock(2) lock of /proc/locks.
type flockEntry struct {
	pid   string
	dev   string // "<major>:<minor>" as /proc/locks prints it
	ino   uint64
	write bool // exclusive
}

// readFlocks lists the held flock(2) locks of /proc/locks; false when it
// cannot be read. A holder's line is
// "<n>: FLOCK  ADVISORY  WRITE <pid> <maj>:<min>:<ino> 0 EOF"; a waiter's has
// "->" after the number and is skipped.
//
// The kernel fills each read(2) of /proc/locks afresh from the list of
// locks, newest first, up to a page: a read in smaller pieces (os.ReadFile
// starts with 512 bytes) can skip a line when locks listed before it are
// dropped between two pieces, and the skipped line may be the orphan's. So
// every read asks for at least 64 KiB, and a list of up to a page is one
// snapshot. (A longer one still comes a page at a time: a lock dropped
// between two pages can hide one of the next page for that look-up.)
//
// Every Lock reads it (a claim per poll, the wake queue per announcement),
// so the read buffer is pooled (flocksBufs) rather than 64 KiB or more made
// per read, and the pid and device strings, the same few for every line,
// are made once per read.
//
// Concurrent callers share one read (freshlook): each gets a read that
// started after it asked, which is as good as its own for the look-up, and
// a serve whose polls take their claims at once reads the list a few
// times, not once per poll. The list is shared: callers only read it.
func readFlocks() ([]flockEntry, bool) {
	f := flocksLook.Get(func() flocks {
		f := readFlocksNow()
		if f.ok {
			lockFDs.prune(f.list) // once per read: its misses count reads
		}
		return f
	})
	return f.list, f.ok
}

// flocksLook shares the reads of /proc/locks.
var flocksLook freshlook.Look[flocks]

// flocks is one read of /proc/locks: ok is false when it could not be read.
type flocks struct {
	list []flockEntry
	ok   bool
}

// readFlocksNow is one read of /proc/locks (readFlocks).
func readFlocksNow() flocks {
	f, err := os.Open("/proc/locks")
	if err != nil {
		return flocks{}
	}
	defer f.Close()
	const piece = 64 << 10
	buf := flocksBufs.Get().(*[]byte)
	defer func() {
		if cap(*buf) <= maxPooledFlocks {
			flocksBufs.Put(buf)
		}
	}()
	data := (*buf)[:0]
	for {
		if cap(data)-len(data) < piece {
			data = slices.Grow(data, piece)
			*buf = data
		}
		n, err := f.Read(data[len(data):cap(data)])
		data = data[:len(data)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return flocks{}
		}
	}
	strs := map[string]string{}
	str := func(b []byte) string {
		s, ok := strs[string(b)]
		if !ok {
			s = string(b)
			strs[s] = s
		}
		return s
	}
	out := make([]flockEntry, 0, bytes.Count(data, []byte{'\n'}))
	var fl [][]byte
	for line := range bytes.Lines(data) {
		fl = fl[:0]
		for f := range bytes.FieldsSeq(line) {
			fl = append(fl, f)
		}
		if len(fl) < 6 || string(fl[1]) != "FLOCK" {
			continue
		}
		i := bytes.LastIndexByte(fl[5], ':')
		if i < 0 {
			continue
		}
		ino, err := strconv.ParseUint(string(fl[5][i+1:]), 10, 64)
		if err != nil {
			continue
		}
		out = append(out, flockEntry{pid: str(fl[4]), dev: str(fl[5][:i]), ino: ino, write: string(fl[3]) == "WRITE"})
	}
	return flocks{out, true}
}

// flocksBufs holds readFlocks' read buffers, each with room for a 64 KiB
// read and a page's listing before it; one grown past maxPooledFlocks (a
// /proc/locks of thousands of locks) is left to the collector.
var flocksBufs = sync.Pool{New: func() any { b := make([]byte, 0, 68<<10); return &b }}

const maxPooledFlocks = 1 << 20

// devString prints a device number as /proc/locks does.
func devString(dev uint64) string {
	return fmt.Sprintf("%02x:%02x", unix.Major(dev), unix.Minor(dev))
}

// tag is the content of the lock file name of dir (see the rule above).
func tag(dir *os.File, name string) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(dir.Fd()), &st); err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "stat directory %q", dir.Name())
	}
	return fmt.Appendf(nil, "fm-lock %d:%d %s\n", st.Dev, st.Ino, name), nil
}

// tagOnce writes the tag t into the held lock file f when it is empty (a
// lock file of an earlier fm).
func tagOnce(f *os.File, t []byte) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return errcode.Wrap(errcode.Internal, err, "stat %q", f.Name())
	}
	if st.Size != 0 {
		return nil
	}
	if _, err := f.Write(t); err != nil {
		return errcode.Wrap(errcode.Internal, err, "tag lock file %q", f.Name())
	}
	return nil
}

// readTag reads up to n bytes of the file the descriptor path fd (of
// /proc/<pid>/fd) names, without blocking (O_NONBLOCK: the descriptor may
// have been reused for a FIFO since it was looked at).
func readTag(fd string, n int) ([]byte, error) {
	f, err := os.OpenFile(fd, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	buf := make([]byte, n+1)
	m, err := f.ReadAt(buf, 0)
	if err != nil && m != n {
		return nil, err
	}
	return buf[:m], nil
}
