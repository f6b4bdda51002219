// Package pkgtree walks, validates, digests and installs extension package
// trees: CONTRACT §2 ([PKG-1]..[PKG-5]), the store copy of [BIND-5] and its
// revalidation before every run ([INV-1]).
//
// A package tree is a directory holding only directories and regular files.
// Scan walks it without ever following a link and refuses, with the contract's
// codes ([PKG-3]):
//
//   - a symlink anywhere, or a regular file with more than one hard link:
//     link-unsafe (a link lets bytes outside the tree, or a second name for
//     the same inode, change what was validated);
//   - anything that is not a directory or a regular file (FIFO, socket,
//     device): package-invalid;
//   - an entry, the root included, owned by another uid: owner-mismatch;
//   - a group- or world-writable entry, the root included: mode-unsafe
//     (another user could change trusted code after it was validated);
//   - a name with a control character or invalid UTF-8, or the name ".git"
//     at any depth (a work tree inside the package, [PKG-2]): path-unsafe.
//     A name never holds '/': the kernel does not return one from a
//     directory read.
//
// These per-entry rules live in rules.go (CheckName, CheckType, CheckPerm),
// shared with the transfer receiver.
//
// Bounds ([PKG-4]): at most MaxEntries entries and MaxBytes bytes of file
// content, package-oversized beyond. Both are decided from directory reads and
// stat data while walking, before any file byte is read, so an oversized tree
// is refused at the cost of its metadata only. Exactly at a bound is accepted.
//
// Policy Installed is the revalidation of a store copy ([INV-1], [HOME-4]): in
// addition, the root path must be canonical (no symlink in any component:
// link-unsafe), directories and files with any execute bit must be exactly
// mode 0555 and other files exactly 0444 (mode-unsafe), and an absent root is
// package-missing.
//
// The walk is descriptor-relative: every directory is opened with openat and
// O_NOFOLLOW from its already-open parent and checked (device and inode) to be
// the entry that was validated, and every file is opened the same way and
// checked with fstat before it is read. A tree that changes under the walk is
// integrity-mismatch; it can never make the walk read through a link.
//
// CheckLocation applies [PKG-1] and [PKG-2] to where an operator's package
// lies; Install makes the content-addressed store copy of [BIND-5].
//
// The digest ([PKG-5]) is SHA-256 over a byte stream that names every entry in
// depth-first order, siblings in bytewise name order; see Tree.Digest. Only the
// relative path, the type, the execute bit, the size and the content of each
// entry are hashed: owners, times and the other mode bits are not, so the same
// package has the same digest in every home, source or installed.
package pkgtree

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
)

// MaxEntries is the most entries a package may hold ([PKG-4]). Directories
// count; the root does not.
const MaxEntries = 4096

// MaxBytes is the most bytes of file content a package may hold ([PKG-4]).
const MaxBytes = 64 << 20

// Entry is one directory or regular file of a package tree.
type Entry struct {
	// Path is relative to the package root, '/'-separated, never empty.
	Path string
	// Dir is true for a directory; Exec, Size and SHA256 are then zero.
	Dir bool
	// Exec is true when the file has any execute bit.
	Exec bool
	// Size is the file's length in bytes.
	Size int64
	// SHA256 is the SHA-256 of the file's bytes.
	SHA256 [32]byte
}

// Tree is a validated package tree.
type Tree struct {
	// Entries are in digest order: depth first, siblings in bytewise name
	// order, each directory's contents right after it. The root is not an
	// entry.
	Entries []Entry
	// Bytes is the total size of the files.
	Bytes int64
	// Digest is "sha256:<64 lowercase hex>" over the stream of [PKG-5]:
	// "firstmate-package-tree-v1",NUL, then per entry in Entries order
	// "D",NUL,path,NUL,"x",NUL for a directory or
	// "F",NUL,path,NUL,"x" or "-",NUL,size in decimal,NUL,"sha256:<hex>",NUL
	// for a file.
	Digest string
	// Stamp names the inodes the scan validated and their state: SHA-256
	// over the device, inode number, mode, change time and modification
	// time of the root and of every entry, in Entries order. Two scans of
	// the same path with equal stamps saw the very same inodes, none of
	// which was renamed, written, truncated or chmod'ed in between (each of
	// those sets the change time, which no unprivileged process can set
	// back), up to the file system's timestamp granularity. Unlike Digest it
	// differs between two copies of a package.
	Stamp string
	// Kept is the open file at Options.Keep (nil without one): read-only,
	// close-on-exec, the descriptor whose bytes the scan hashed. The caller
	// closes it.
	Kept *os.File
	// Root is, with Options.Keep, the open root directory the scan walked
	// (close-on-exec): the very directory whose entries it validated, what
	// a package must run in whatever a name above it is renamed to
	// meanwhile [INV-1]. The caller closes it.
	Root *os.File
}

// Policy selects the rules Scan applies on top of [PKG-3] and [PKG-4].
type Policy int

const (
	// Source is an operator's package directory ([PKG-3]).
	Source Policy = iota
	// Installed is a store copy: canonical root, modes exactly 0555/0444
	// ([INV-1], [HOME-4]).
	Installed
)

// FileSHA256 returns "sha256:<hex>" of the file entry at the relative path
// rel, for the manifest and entrypoint digests of [PKG-6]. It reports false
// when rel is not a file of t.
func FileSHA256(t *Tree, rel string) (string, bool) {
	for i := range t.Entries {
		if e := &t.Entries[i]; e.Path == rel && !e.Dir {
			return "sha256:" + hex.EncodeToString(e.SHA256[:]), true
		}
	}
	return "", false
}

// Scan validates the package tree at root under policy p and returns its
// entries and digest. Every refusal is a coded error naming the offending path.
// Files are hashed in parallel, one worker per CPU (one for a small tree).
func Scan(root string, p Policy) (*Tree, error) { return ScanWith(root, p, Options{}) }

// ScanWith is Scan with the hooks of opts.
func ScanWith(root string, p Policy, opts Options) (*Tree, error) {
	w, err := openTree(root, p)
	if err != nil {
		return nil, err
	}
	defer func() {
		if w.fd >= 0 {
			w.close()
		}
	}()
	if err := w.walk(); err != nil {
		return nil, err
	}
	kept := -1
	err = w.eachFile(opts.metered(w, p.stage(), func(wk *worker, i int) error {
		fd, err := wk.open(i)
		if err != nil {
			return err
		}
		if opts.Keep != "" && w.entries[i].Path == opts.Keep {
			kept = fd // one entry has that path: one writer
		} else {
			defer unix.Close(fd)
		}
		w.entries[i].SHA256, err = wk.read(i, fd, nil)
		return err
	}))
	if err == nil && opts.Keep != "" && kept < 0 {
		err = errcode.New(errcode.EntrypointMissing, "package %s: %q is not a file of the tree", w.root, opts.Keep)
	}
	if err != nil {
		if kept >= 0 {
			unix.Close(kept)
		}
		return nil, err
	}
	t := &Tree{Entries: w.entries, Bytes: w.bytes, Digest: digest(w.entries), Stamp: w.stamp()}
	if kept >= 0 {
		t.Kept = os.NewFile(uintptr(kept), filepath.Join(w.root, filepath.FromSlash(opts.Keep)))
		t.Root = os.NewFile(uintptr(w.fd), w.root)
		w.fd = -1 // now the caller's
	}
	return t, nil
}

// stamp computes Tree.Stamp from the identities the walk recorded.
func (w *walker) stamp() string {
	h := sha256.New()
	b := make([]byte, 0, 48)
	for i := -1; i < len(w.ids); i++ {
		id := &w.rootID
		if i >= 0 {
			id = &w.ids[i]
		}
		b = binary.LittleEndian.AppendUint64(b[:0], id.dev)
		b = binary.LittleEndian.AppendUint64(b, id.ino)
		b = binary.LittleEndian.AppendUint32(b, id.mode)
		for _, ts := range [2]unix.Timespec{id.ctime, id.mtime} {
			b = binary.LittleEndian.AppendUint64(b, uint64(ts.Sec))
			b = binary.LittleEndian.AppendUint64(b, uint64(ts.Nsec))
		}
		h.Write(b)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// digest computes Tree.Digest over entries.
func digest(entries []Entry) string {
	h := sha256.New()
	h.Write([]byte("firstmate-package-tree-v1\x00"))
	b := make([]byte, 0, 512)
	for i := range entries {
		e := &entries[i]
		if e.Dir {
			b = append(b, "D\x00"...)
			b = append(b, e.Path...)
			b = append(b, "\x00x\x00"...)
		} else {
			b = append(b, "F\x00"...)
			b = append(b, e.Path...)
			if e.Exec {
				b = append(b, "\x00x\x00"...)
			} else {
				b = append(b, "\x00-\x00"...)
			}
			b = strconv.AppendInt(b, e.Size, 10)
			b = append(b, "\x00sha256:"...)
			b = hex.AppendEncode(b, e.SHA256[:])
			b = append(b, 0)
		}
		h.Write(b)
		b = b[:0]
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

const (
	dirFlags  = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fileFlags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK // O_NONBLOCK: a FIFO swapped in must not block the open
)

// ident pins an entry to the inode that was validated, and links it to its
// parent so a worker can reopen the directory chain relative to the root.
type ident struct {
	parent   int // index of the parent directory's entry, -1 for the root
	name     string
	dev, ino uint64
	// mode and the times as stat saw them, for Tree.Stamp
	mode         uint32
	ctime, mtime unix.Timespec
}

// identOf is the identity of an entry named name below parent with stat st.
func identOf(parent int, name string, st *unix.Stat_t) ident {
	return ident{parent: parent, name: name, dev: uint64(st.Dev), ino: uint64(st.Ino), mode: st.Mode, ctime: st.Ctim, mtime: st.Mtim}
}

// walker holds one scan: the open root, and the entries found so far with
// their identities (ids[i] belongs to entries[i]).
type walker struct {
	root    string
	what    string // "package <root>", how the per-entry rules name it
	policy  Policy
	uid     uint32
	fd      int
	entries []Entry
	ids     []ident
	rootID  ident // the root's identity, for Tree.Stamp
	files   []int // indices of the file entries, in digest order
	names   int   // names read from directories so far: each becomes an entry
	bytes   int64
	dirents []byte // during walk: its directory-read buffer
}

// openTree checks and opens the root of a package tree.
func openTree(root string, p Policy) (*walker, error) {
	root = filepath.Clean(root) // a trailing slash would make the kernel follow a symlinked root
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return nil, errcode.New(errcode.PackageMissing, "package %s: no such directory", root)
		}
		return nil, errcode.Wrap(errcode.PackageInvalid, err, "package %s: cannot stat", root)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
	case unix.S_IFLNK:
		return nil, errcode.New(errcode.LinkUnsafe, "package %s: the root is a symlink", root)
	default:
		return nil, errcode.New(errcode.PackageInvalid, "package %s: not a directory", root)
	}
	if p == Installed {
		if !filepath.IsAbs(root) {
			return nil, errcode.New(errcode.PathUnsafe, "installed package %s: path is not absolute", root)
		}
		if !fsutil.Canonical(root) {
			// Resolved again only for the words of the refusal.
			c, err := filepath.EvalSymlinks(root)
			if err != nil {
				return nil, errcode.Wrap(errcode.PackageInvalid, err, "installed package %s: cannot resolve its path", root)
			}
			if c != root {
				return nil, errcode.New(errcode.LinkUnsafe, "installed package %s: path is not canonical (resolves to %s)", root, c)
			}
		}
	}
	w := &walker{root: root, policy: p, uid: uint32(os.Geteuid()), what: "package " + root}
	fd, err := unix.Open(root, dirFlags, 0)
	if err != nil {
		return nil, w.openErr(".", err)
	}
	w.fd = fd
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil || fst.Dev != st.Dev || fst.Ino != st.Ino {
		w.close()
		return nil, w.changed(".")
	}
	if err := w.check(".", &fst); err != nil {
		w.close()
		return nil, err
	}
	w.rootID = identOf(-1, ".", &fst)
	return w, nil
}

func (w *walker) close() { unix.Close(w.fd) }

// changed is the refusal for a tree that changed while it was being read.
func (w *walker) changed(rel string) error {
	return errcode.New(errcode.IntegrityMismatch, "package %s: %q changed during the scan", w.root, rel)
}

// openErr classifies a failed stat or open of an entry that the walk already
// saw: gone or replaced means the tree changed, anything else is unreadable.
func (w *walker) openErr(rel string, err error) error {
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return w.changed(rel)
	}
	return errcode.Wrap(errcode.PackageInvalid, err, "package %s: cannot read %q", w.root, rel)
}

// check applies [PKG-3] and, for Installed, the store modes to one entry.
func (w *walker) check(rel string, st *unix.Stat_t) error {
	what := w.what
	typ := st.Mode & unix.S_IFMT
	if err := CheckType(what, rel, typ); err != nil {
		return err
	}
	if typ == unix.S_IFREG && st.Nlink != 1 {
		return errcode.New(errcode.LinkUnsafe, "package %s: %q has %d hard links; copy it to a single file", w.root, rel, st.Nlink)
	}
	if st.Uid != w.uid {
		return errcode.New(errcode.OwnerMismatch, "package %s: %q is owned by uid %d, not by you (uid %d)", w.root, rel, st.Uid, w.uid)
	}
	perm := st.Mode & 0o7777
	if err := CheckPerm(what, rel, perm); err != nil {
		return err
	}
	if w.policy == Installed {
		want := uint32(0o444)
		if typ == unix.S_IFDIR || perm&0o111 != 0 {
			want = 0o555
		}
		if perm != want {
			return errcode.New(errcode.ModeUnsafe, "installed package %s: %q has mode %04o, want %04o", w.root, rel, perm, want)
		}
	}
	return nil
}

// direntBufs holds the directory-read buffers of finished walks: every
// launch revalidates its package three times ([INV-1]), and a fresh 16 KiB
// buffer per walk was most of what a revalidation allocated.
var direntBufs = sync.Pool{New: func() any { return new([16 << 10]byte) }}

// walk validates the whole tree from the root, depth first.
func (w *walker) walk() error {
	buf := direntBufs.Get().(*[16 << 10]byte)
	defer direntBufs.Put(buf)
	w.dirents = buf[:]
	defer func() { w.dirents = nil }()
	return w.walkDir(w.fd, -1, "")
}

// walkDir validates the contents of the open directory fd (entry parent,
// relative path prefix ending in '/' or empty for the root) and recurses.
func (w *walker) walkDir(fd, parent int, prefix string) error {
	names, err := w.readNames(fd, prefix)
	if err != nil {
		return err
	}
	slices.Sort(names) // bytewise
	for _, name := range names {
		rel := prefix + name
		if err := CheckName(w.what, rel, name); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return w.openErr(rel, err)
		}
		if err := w.check(rel, &st); err != nil {
			return err
		}
		dir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		e := Entry{Path: rel, Dir: dir}
		if !dir {
			e.Exec = st.Mode&0o111 != 0
			e.Size = st.Size
			w.bytes += st.Size
			if w.bytes > MaxBytes {
				return errcode.New(errcode.PackageOversized, "package %s: more than %d bytes of file content (at %q)", w.root, MaxBytes, rel)
			}
			w.files = append(w.files, len(w.entries))
		}
		w.entries = append(w.entries, e)
		w.ids = append(w.ids, identOf(parent, name, &st))
		if dir {
			if err := w.descend(fd, len(w.entries)-1); err != nil {
				return err
			}
		}
	}
	return nil
}

// descend opens directory entry i below its open parent dfd and walks it.
func (w *walker) descend(dfd, i int) error {
	fd, err := w.openDir(dfd, i)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return w.walkDir(fd, i, w.entries[i].Path+"/")
}

// openDir opens directory entry i below its open parent dfd and checks that
// it is the inode the walk validated.
func (w *walker) openDir(dfd, i int) (int, error) {
	fd, err := unix.Openat(dfd, w.ids[i].name, dirFlags, 0)
	if err != nil {
		return -1, w.openErr(w.entries[i].Path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || uint64(st.Dev) != w.ids[i].dev || uint64(st.Ino) != w.ids[i].ino {
		unix.Close(fd)
		return -1, w.changed(w.entries[i].Path)
	}
	return fd, nil
}

// readNames reads the names in directory fd. Every name read becomes an entry
// or ends the walk, so counting names as they are read enforces the entry
// bound exactly, and as soon as it is crossed, before a huge directory is
// held in memory.
func (w *walker) readNames(fd int, prefix string) ([]string, error) {
	var names []string
	for {
		n, err := unix.Getdents(fd, w.dirents)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, w.openErr(dirName(prefix), err)
		}
		if n == 0 {
			return names, nil
		}
		var count int
		_, count, names = unix.ParseDirent(w.dirents[:n], -1, names)
		if w.names += count; w.names > MaxEntries {
			return nil, errcode.New(errcode.PackageOversized, "package %s: more than %d entries (in %q)", w.root, MaxEntries, dirName(prefix))
		}
	}
}

// dirName turns a walk prefix back into the directory's relative path.
func dirName(prefix string) string {
	if prefix == "" {
		return "."
	}
	return prefix[:len(prefix)-1]
}

// readBuf is the most a worker reads at once.
const readBuf = 256 << 10

// smallTree is the content size below which one worker, on the calling
// goroutine, hashes every file: parallel workers only pay off when there
// are bytes to share. A typical package (an entrypoint and a manifest) is
// far below it, and it is revalidated before every invocation.
const smallTree = 1 << 20

// eachFile runs fn for every file entry on runtime.NumCPU() workers (one,
// inline, for a tree under smallTree bytes) and returns the error of the
// earliest failing file in digest order, if any; after a failure the workers
// stop taking files. Each worker's buffer is no larger than the largest file
// needs (its size plus the byte that reveals growth), up to readBuf.
func (w *walker) eachFile(fn func(wk *worker, i int) error) error {
	var largest int64
	for _, i := range w.files {
		largest = max(largest, w.entries[i].Size)
	}
	bufSize := int(min(largest+1, readBuf))
	if w.bytes < smallTree || len(w.files) < 2 {
		wk := &worker{w: w, buf: make([]byte, bufSize), h: sha256.New()}
		defer wk.close()
		for _, i := range w.files {
			if err := fn(wk, i); err != nil {
				return err
			}
		}
		return nil
	}
	n := min(runtime.NumCPU(), len(w.files))
	var (
		next    atomic.Int64
		stop    atomic.Bool
		mu      sync.Mutex
		failAt  = len(w.files)
		failErr error
		wg      sync.WaitGroup
	)
	for range n {
		wg.Go(func() {
			wk := &worker{w: w, buf: make([]byte, bufSize), h: sha256.New()}
			defer wk.close()
			for !stop.Load() {
				k := int(next.Add(1) - 1)
				if k >= len(w.files) {
					return
				}
				if err := fn(wk, w.files[k]); err != nil {
					mu.Lock()
					if k < failAt {
						failAt, failErr = k, err
					}
					mu.Unlock()
					stop.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	return failErr
}

// worker reads files for eachFile. It keeps the chain of directories from the
// root to the last file's parent open, so a run of files in one directory
// costs one openat each, and reuses its buffer and hash for every file.
type worker struct {
	w     *walker
	buf   []byte
	h     hash.Hash
	dirs  []int // entry indices of the open directory chain below the root
	fds   []int // fds[k] is the open directory dirs[k]
	chain []int // scratch
}

func (wk *worker) close() {
	for _, fd := range wk.fds {
		unix.Close(fd)
	}
}

// parentFd returns an open descriptor of the directory holding entry i.
func (wk *worker) parentFd(i int) (int, error) {
	w := wk.w
	wk.chain = wk.chain[:0]
	for p := w.ids[i].parent; p >= 0; p = w.ids[p].parent {
		wk.chain = append(wk.chain, p)
	}
	slices.Reverse(wk.chain)
	k := 0
	for k < len(wk.dirs) && k < len(wk.chain) && wk.dirs[k] == wk.chain[k] {
		k++
	}
	for len(wk.dirs) > k {
		unix.Close(wk.fds[len(wk.fds)-1])
		wk.dirs, wk.fds = wk.dirs[:len(wk.dirs)-1], wk.fds[:len(wk.fds)-1]
	}
	top := w.fd
	if len(wk.fds) > 0 {
		top = wk.fds[len(wk.fds)-1]
	}
	for _, d := range wk.chain[k:] {
		fd, err := w.openDir(top, d)
		if err != nil {
			return -1, err
		}
		wk.dirs, wk.fds = append(wk.dirs, d), append(wk.fds, fd)
		top = fd
	}
	return top, nil
}

// open opens file entry i without following links and checks that it is the
// validated inode, still a regular file of the validated size.
func (wk *worker) open(i int) (int, error) {
	dfd, err := wk.parentFd(i)
	if err != nil {
		return -1, err
	}
	w := wk.w
	fd, err := unix.Openat(dfd, w.ids[i].name, fileFlags, 0)
	if err != nil {
		return -1, w.openErr(w.entries[i].Path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG ||
		uint64(st.Dev) != w.ids[i].dev || uint64(st.Ino) != w.ids[i].ino || st.Size != w.entries[i].Size {
		unix.Close(fd)
		return -1, w.changed(w.entries[i].Path)
	}
	return fd, nil
}

// read hashes exactly the validated size of file entry i from fd, copying the
// bytes to out when out is not nil. A file that is shorter or longer than its
// stat said is integrity-mismatch. A short read of a regular file means end of
// file, so a file smaller than the buffer costs one read.
func (wk *worker) read(i, fd int, out *os.File) ([32]byte, error) {
	var sum [32]byte
	size := wk.w.entries[i].Size
	wk.h.Reset()
	var total int64
	for {
		want := len(wk.buf)
		if rem := size - total; rem < int64(want) {
			want = int(rem) + 1 // one more byte than expected reveals growth
		}
		n, err := unix.Read(fd, wk.buf[:want])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return sum, errcode.Wrap(errcode.PackageInvalid, err, "package %s: cannot read %q", wk.w.root, wk.w.entries[i].Path)
		}
		if n == 0 {
			break
		}
		total += int64(n)
		if total > size {
			break
		}
		wk.h.Write(wk.buf[:n])
		if out != nil {
			if _, err := out.Write(wk.buf[:n]); err != nil {
				return sum, errcode.Wrap(errcode.Internal, err, "write %s", out.Name())
			}
		}
		if total == size && n < want {
			break
		}
	}
	if total != size {
		return sum, wk.w.changed(wk.w.entries[i].Path)
	}
	wk.h.Sum(sum[:0])
	return sum, nil
}
