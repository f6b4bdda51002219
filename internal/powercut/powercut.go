// Package powercut is a test file system that forgets what was not synced:
// a FUSE loopback over a backing directory that keeps, beside the live tree,
// the durable model of it, and can cut the power: drop everything the model
// does not hold and mount what is left. It is test infrastructure (the
// power-loss sweep of internal/reliability and this package's self-test);
// fm's binary never imports it.
//
// Every operation is passed through to the backing directory, so the mount
// behaves as the file system under it does (renameat2 flags, O_TMPFILE, hard
// links and unlinked open files are the backing file system's own). Writes
// are never passed through by the kernel (no FUSE passthrough, no writeback
// cache): every WRITE, SETATTR, CREATE, LINK, RENAME, UNLINK, FSYNC and
// FSYNCDIR reaches the layer, in the order the kernel sends them, and is
// counted. Beside the tree the layer keeps the durable model: for each inode
// (named by an id the layer gives it when it is created, never by a backing
// inode number, which a later file may reuse) its type, mode and bytes as
// of its last credited sync, and for each directory its entries (name to
// inode id) as of its last credited sync. What a sync credits is the Model.
//
// A cut freezes the model (every later operation fails with EIO, as on a
// machine that lost power), and Cut then unmounts, rebuilds a fresh backing
// directory from the frozen model alone (what no durable entry names is
// gone; a durable entry of an inode whose bytes were never synced gets an
// empty file or directory), and mounts it again at the same place.
// Timestamps, owners and extended attributes are not modelled: the rebuilt
// tree has the rebuilding process's owner and the time of the rebuild.
//
// syncfs(2) sends no request to a FUSE daemon (the kernel sends FUSE_SYNCFS
// to virtiofs only), so the layer cannot credit it: a program whose
// durability rests on syncfs loses those writes here, and would on any FUSE
// file system.
package powercut

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Model is what a sync makes durable.
type Model int

const (
	// Strict is POSIX read narrowly: fsync or fdatasync of a file makes its
	// bytes and mode durable, and nothing else; fsync of a directory makes
	// its entries durable as they are at that moment (names only: an
	// inode a new entry names keeps the bytes of its own last sync, empty
	// if it had none). A new name is durable only once its directory is
	// fsynced. A rename between two directories is one change, as a
	// journaling file system commits it: the sync of its destination makes
	// the new name durable and drops the old one from the source's durable
	// entries with it, while a sync of the source alone makes only the
	// removal durable (so a program that syncs the source first loses the
	// entry to a cut between the two syncs).
	Strict Model = iota
	// Ordered is like ext4 with data=ordered and no periodic commit: any
	// sync, of any file or directory, is a journal commit that makes the
	// whole tree durable as it is at that moment, every directory's entries
	// and every file's bytes (ordered mode writes the data before the
	// metadata that names it). Nothing is durable before the first sync.
	Ordered
)

func (m Model) String() string {
	if m == Ordered {
		return "ext4-ordered"
	}
	return "strict"
}

// ErrUnavailable is wrapped by Mount where FUSE cannot be mounted (no
// /dev/fuse, no fusermount3, or not permitted for this user).
var ErrUnavailable = errors.New("FUSE mounting is not available")

// FS is one mounted powercut file system.
type FS struct {
	mnt   string
	work  string // holds the backing directories, backing-<gen>
	model Model

	mu      sync.Mutex
	gen     int
	backing string
	server  *fuse.Server
	ids     map[uint64]uint64 // backing inode number -> inode id
	next    uint64
	rootID  uint64
	dur     map[uint64]*inode // the durable model; entries are never changed in place
	ops     int               // counted operations since the mount
	cutAt   int               // the counted operation that cuts; 0: none armed
	frozen  map[uint64]*inode // the model at the cut; nil until then
	tmpfds  []int             // descriptors of unnamed files, kept for LINK
	counted []string          // what each counted operation was, when Trace is on
	moves   []move            // renames between directories not yet synced at their destination
	// Trace keeps the name of every counted operation (Ops).
	Trace bool
}

// move is a rename of inode id from name old of directory from to
// directory to.
type move struct {
	from, to, id uint64
	old          string
}

// inode is one inode of the durable model.
type inode struct {
	mode    uint32 // type and permission bits
	data    []byte // a regular file's bytes
	target  string // a symlink's target
	entries map[string]uint64
}

// Mount mounts a powercut file system at mnt over a fresh backing directory
// under work, first filled with a copy of seed (when not ""). Everything in
// it at the start is durable.
func Mount(mnt, work, seed string, model Model) (*FS, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	f := &FS{mnt: mnt, work: work, model: model}
	b := f.backingDir(0)
	if err := os.Mkdir(b, 0o755); err != nil {
		return nil, err
	}
	if seed != "" {
		if out, err := exec.Command("cp", "-a", seed+"/.", b).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("copy %s: %v: %s", seed, err, out)
		}
	}
	if err := f.mount(b); err != nil {
		return nil, err
	}
	return f, nil
}

// Available reports why FUSE cannot be mounted here, or nil.
func Available() error {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: open /dev/fuse: %v", ErrUnavailable, err)
	}
	unix.Close(fd)
	if os.Geteuid() != 0 {
		p, err := exec.LookPath("fusermount3")
		if err != nil {
			return fmt.Errorf("%w: no fusermount3 (Debian: apt-get install fuse3)", ErrUnavailable)
		}
		if st, err := os.Stat(p); err != nil || st.Mode()&os.ModeSetuid == 0 {
			return fmt.Errorf("%w: %s is not setuid, so uid %d cannot mount", ErrUnavailable, p, os.Geteuid())
		}
	} else if _, err := exec.LookPath("fusermount3"); err != nil {
		return fmt.Errorf("%w: no fusermount3 (Debian: apt-get install fuse3)", ErrUnavailable)
	}
	return nil
}

func (f *FS) backingDir(gen int) string {
	return filepath.Join(f.work, fmt.Sprintf("backing-%d", gen))
}

// Dir is the mount point.
func (f *FS) Dir() string { return f.mnt }

// mount scans backing into a model where everything is durable and mounts
// it.
func (f *FS) mount(backing string) error {
	f.backing = backing
	f.ids = map[uint64]uint64{}
	f.dur = map[uint64]*inode{}
	f.ops, f.cutAt, f.frozen, f.counted, f.moves = 0, 0, nil, nil, nil
	var st unix.Stat_t
	if err := unix.Lstat(backing, &st); err != nil {
		return err
	}
	f.rootID = f.idOf(st.Ino)
	if err := f.syncTree(backing, &st); err != nil {
		return err
	}
	r := &fs.LoopbackRoot{Path: backing, Dev: st.Dev}
	root := &node{LoopbackNode: fs.LoopbackNode{RootData: r}, fs: f, tmpfd: -1}
	r.RootNode = root
	r.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &node{LoopbackNode: fs.LoopbackNode{RootData: r}, fs: f, tmpfd: -1}
	}
	// Names and attributes may be cached by the kernel: every change goes
	// through this mount, and a cut mounts a new one, whose cache starts
	// empty.
	keep, zero := time.Hour, time.Duration(0)
	srv, err := fs.Mount(f.mnt, root, &fs.Options{
		MountOptions: fuse.MountOptions{FsName: "powercut", Name: "powercut", DisableXAttrs: true, MaxBackground: 16},
		EntryTimeout: &keep, AttrTimeout: &keep, NegativeTimeout: &zero,
	})
	if err != nil {
		return fmt.Errorf("%w: mount %s: %v", ErrUnavailable, f.mnt, err)
	}
	f.server = srv
	return nil
}

// idOf is the inode id of backing inode ino, a new one if it has none.
func (f *FS) idOf(ino uint64) uint64 {
	if id, ok := f.ids[ino]; ok {
		return id
	}
	return f.newID(ino)
}

// newID gives backing inode ino a new id: it was just created, so any id it
// had named an inode that is gone.
func (f *FS) newID(ino uint64) uint64 {
	f.next++
	f.ids[ino] = f.next
	return f.next
}

// Arm makes the k-th counted operation from now (k >= 1) cut the power
// before it is applied.
func (f *FS) Arm(k int) {
	f.mu.Lock()
	f.cutAt = f.ops + k
	f.mu.Unlock()
}

// Ops is how many operations were counted since the mount (or the last
// cut), and, with Trace, what they were.
func (f *FS) Ops() (int, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ops, append([]string(nil), f.counted...)
}

// CutHappened reports whether an armed cut was reached.
func (f *FS) CutHappened() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.frozen != nil
}

// begin starts a counted operation what: EIO once the power is cut (or
// when this is the operation armed to cut it), else 0 with f.mu held until
// end.
func (f *FS) begin(what string) syscall.Errno {
	f.mu.Lock()
	if f.frozen != nil {
		f.mu.Unlock()
		return syscall.EIO
	}
	f.ops++
	if f.Trace {
		f.counted = append(f.counted, what)
	}
	if f.ops == f.cutAt {
		f.frozen = maps.Clone(f.dur)
		f.mu.Unlock()
		return syscall.EIO
	}
	return 0
}

func (f *FS) end() { f.mu.Unlock() }

// dead reports whether the power is cut (for the operations not counted).
func (f *FS) dead() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.frozen != nil
}

// Cut cuts the power now (unless an armed cut already did), unmounts,
// rebuilds the backing directory from the durable model alone and mounts
// it again. Every process using the mount must be gone (killed) first.
func (f *FS) Cut() error {
	f.mu.Lock()
	if f.frozen == nil {
		f.frozen = maps.Clone(f.dur)
	}
	model, root, old := f.frozen, f.rootID, f.backing
	f.mu.Unlock()
	if err := f.unmount(); err != nil {
		return err
	}
	f.gen++
	nb := f.backingDir(f.gen)
	if err := rebuild(model, root, nb); err != nil {
		return fmt.Errorf("rebuild %s: %v", nb, err)
	}
	removeTree(old)
	return f.mount(nb)
}

// Close unmounts and removes the backing directory; once closed, it does
// nothing.
func (f *FS) Close() error {
	err := f.unmount()
	removeTree(f.backing)
	return err
}

func (f *FS) unmount() error {
	if f.server == nil {
		return nil
	}
	defer func() { f.server = nil }()
	var err error
	for range 50 {
		if err = f.server.Unmount(); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		// A process not yet reaped still holds the mount: detach it.
		if out, lerr := exec.Command("fusermount3", "-u", "-z", f.mnt).CombinedOutput(); lerr != nil {
			return fmt.Errorf("unmount %s: %v; lazy: %v: %s", f.mnt, err, lerr, out)
		}
	}
	waited := make(chan struct{})
	go func() { f.server.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("unmount %s: the mount is still in use after a lazy unmount", f.mnt)
	}
	f.mu.Lock()
	for _, fd := range f.tmpfds {
		unix.Close(fd)
	}
	f.tmpfds = nil
	f.mu.Unlock()
	return nil
}

// removeTree removes p, making its directories writable first.
func removeTree(p string) {
	filepath.WalkDir(p, func(q string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(q, 0o700)
		}
		return nil
	})
	os.RemoveAll(p)
}

// Save copies the live tree (synced or not) to dst, for a seed of later
// mounts. Nothing may be writing to the mount.
func (f *FS) Save(dst string) error {
	f.mu.Lock()
	b := f.backing
	f.mu.Unlock()
	if out, err := exec.Command("cp", "-a", b+"/.", dst).CombinedOutput(); err != nil {
		return fmt.Errorf("copy %s: %v: %s", b, err, out)
	}
	return nil
}
