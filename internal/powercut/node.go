package powercut

import (
	"context"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is an inode of the mount: go-fuse's loopback node for the operations
// that change nothing, and the layer's own for every one that does (each is
// counted, and fails with EIO once the power is cut) and for every one that
// makes a node (each node's generation is its inode id, so go-fuse never
// takes a new file for an old one whose backing inode number it reuses).
type node struct {
	fs.LoopbackNode
	fs *FS
	// tmpfd is a descriptor of the backing file of an unnamed (O_TMPFILE)
	// file, for the LINK that names it; -1 otherwise.
	tmpfd int
}

var (
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeTmpfiler       = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeFsyncer        = (*node)(nil)
)

// path is the node's path in the backing directory.
func (n *node) path() string {
	return filepath.Join(n.RootData.Path, n.Path(n.RootData.RootNode.EmbeddedInode()))
}

// child makes the inode for the backing entry st; fresh when the operation
// just created it. f.mu is held.
func (n *node) child(ctx context.Context, st *syscall.Stat_t, fresh bool, out *fuse.EntryOut) *fs.Inode {
	var id uint64
	if fresh {
		id = n.fs.newID(st.Ino)
	} else {
		id = n.fs.idOf(st.Ino)
	}
	out.Attr.FromStat(st)
	c := &node{LoopbackNode: fs.LoopbackNode{RootData: n.RootData}, fs: n.fs, tmpfd: -1}
	return n.NewInode(ctx, c, fs.StableAttr{Mode: st.Mode & syscall.S_IFMT, Ino: st.Ino, Gen: id})
}

func errno(err error) syscall.Errno { return fs.ToErrno(err) }

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.fs.dead() {
		return nil, syscall.EIO
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(n.path(), name), &st); err != nil {
		return nil, errno(err)
	}
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	return n.child(ctx, &st, false, out), 0
}

// made finishes an operation that created backing entry p: its inode.
func (n *node) made(ctx context.Context, p string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return nil, errno(err)
	}
	return n.child(ctx, &st, true, out), 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if e := n.fs.begin("create " + name); e != 0 {
		return nil, nil, 0, e
	}
	defer n.fs.end()
	p := filepath.Join(n.path(), name)
	var before syscall.Stat_t
	existed := syscall.Lstat(p, &before) == nil
	fd, err := syscall.Open(p, int(flags&^syscall.O_APPEND)|syscall.O_CREAT|syscall.O_CLOEXEC, mode)
	if err != nil {
		return nil, nil, 0, errno(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		syscall.Close(fd)
		return nil, nil, 0, errno(err)
	}
	ch := n.child(ctx, &st, !existed, out)
	return ch, newFile(n.fs, fd), 0, 0
}

func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if e := n.fs.begin("tmpfile"); e != 0 {
		return nil, nil, 0, e
	}
	defer n.fs.end()
	fd, err := syscall.Open(n.path(), int(flags&^syscall.O_APPEND)|unix.O_TMPFILE|syscall.O_CLOEXEC, mode)
	if err != nil {
		return nil, nil, 0, errno(err)
	}
	var st syscall.Stat_t
	keep, err := syscall.Dup(fd)
	if err == nil {
		err = syscall.Fstat(fd, &st)
	}
	if err != nil {
		syscall.Close(fd)
		return nil, nil, 0, errno(err)
	}
	n.fs.tmpfds = append(n.fs.tmpfds, keep)
	ch := n.child(ctx, &st, true, out)
	ch.Operations().(*node).tmpfd = keep
	return ch, newFile(n.fs, fd), 0, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.fs.begin("mkdir " + name); e != 0 {
		return nil, e
	}
	defer n.fs.end()
	p := filepath.Join(n.path(), name)
	if err := syscall.Mkdir(p, mode); err != nil {
		return nil, errno(err)
	}
	return n.made(ctx, p, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.fs.begin("mknod " + name); e != 0 {
		return nil, e
	}
	defer n.fs.end()
	p := filepath.Join(n.path(), name)
	if err := syscall.Mknod(p, mode, int(rdev)); err != nil {
		return nil, errno(err)
	}
	return n.made(ctx, p, out)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.fs.begin("symlink " + name); e != 0 {
		return nil, e
	}
	defer n.fs.end()
	p := filepath.Join(n.path(), name)
	if err := syscall.Symlink(target, p); err != nil {
		return nil, errno(err)
	}
	return n.made(ctx, p, out)
}

// Link names target in this directory; an unnamed file is linked from the
// descriptor the layer kept of it.
func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	if e := n.fs.begin("link " + name); e != 0 {
		return nil, e
	}
	defer n.fs.end()
	p := filepath.Join(n.path(), name)
	var err error
	if _, parent := t.Parent(); parent == nil && t.tmpfd >= 0 {
		err = unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(t.tmpfd), unix.AT_FDCWD, p, unix.AT_SYMLINK_FOLLOW)
	} else {
		err = syscall.Link(t.path(), p)
	}
	if err != nil {
		return nil, errno(err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return nil, errno(err)
	}
	out.Attr.FromStat(&st)
	return t.EmbeddedInode(), 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if e := n.fs.begin("unlink " + name); e != 0 {
		return e
	}
	defer n.fs.end()
	return n.LoopbackNode.Unlink(ctx, name)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if e := n.fs.begin("rmdir " + name); e != 0 {
		return e
	}
	defer n.fs.end()
	return n.LoopbackNode.Rmdir(ctx, name)
}

// Rename passes renameat2's flags (RENAME_NOREPLACE, RENAME_EXCHANGE) to
// the backing file system, which applies them exactly.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if e := n.fs.begin("rename " + name + " " + newName); e != 0 {
		return e
	}
	defer n.fs.end()
	e := n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
	if np, ok := newParent.(*node); ok && e == 0 && flags&unix.RENAME_EXCHANGE == 0 {
		n.fs.renamed(n.path(), name, np.path(), newName)
	}
	return e
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if e := n.fs.begin("setattr"); e != 0 {
		return e
	}
	defer n.fs.end()
	if _, parent := n.Parent(); f == nil && parent == nil && n.tmpfd >= 0 {
		// An unnamed file has no path to change it by (fchmod sends no
		// handle): change it through the descriptor the layer kept.
		fd, err := syscall.Dup(n.tmpfd)
		if err != nil {
			return errno(err)
		}
		h := newFile(n.fs, fd)
		defer h.Release(ctx)
		f = h
	}
	return n.LoopbackNode.Setattr(ctx, f, in, out)
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 {
		if e := n.fs.begin("open-truncate"); e != 0 {
			return nil, 0, e
		}
		defer n.fs.end()
	} else if n.fs.dead() {
		return nil, 0, syscall.EIO
	}
	fd, err := syscall.Open(n.path(), int(flags&^(syscall.O_APPEND|fuse.FMODE_EXEC))|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, 0, errno(err)
	}
	return newFile(n.fs, fd), 0, 0
}

// OpendirHandle gives a directory handle whose fsync is the layer's.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.fs.dead() {
		return nil, 0, syscall.EIO
	}
	ds, e := fs.NewLoopbackDirStream(n.path())
	if e != 0 {
		return nil, 0, e
	}
	return &dirHandle{stream: ds.(dirStream), n: n}, 0, 0
}

// Fsync is the sync of a file (by its handle) or of a directory.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := f.(*file); ok {
		return n.fs.syncOp(h.fd, "")
	}
	return n.syncPath()
}

// syncPath syncs the node through a descriptor of its backing path.
func (n *node) syncPath() syscall.Errno {
	p := n.path()
	fd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return errno(err)
	}
	defer syscall.Close(fd)
	return n.fs.syncOp(fd, p)
}

// syncOp is the counted sync of backing descriptor fd (path p for a
// directory).
func (f *FS) syncOp(fd int, p string) syscall.Errno {
	what := "fsync"
	if p != "" {
		what = "fsync-dir " + filepath.Base(p)
	}
	if e := f.begin(what); e != 0 {
		return e
	}
	defer f.end()
	return errno(f.sync(fd, p))
}

// dirStream is what the loopback's directory stream does.
type dirStream interface {
	fs.FileReaddirenter
	fs.FileSeekdirer
	fs.FileReleasedirer
}

// dirHandle is a directory handle: the loopback's stream, with the layer's
// fsync.
type dirHandle struct {
	stream dirStream
	n      *node
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	return d.stream.Readdirent(ctx)
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	return d.stream.Seekdir(ctx, off)
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) { d.stream.Releasedir(ctx, flags) }

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.n.syncPath()
}

// file is an open regular file: the loopback's file handle for reads,
// the layer's for everything that changes it. It has no passthrough
// descriptor, so the kernel sends every write to the layer.
type file struct {
	lf *fs.LoopbackFile
	fd int
	fs *FS
}

func newFile(f *FS, fd int) *file {
	return &file{lf: fs.NewLoopbackFile(fd).(*fs.LoopbackFile), fd: fd, fs: f}
}

func (h *file) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return h.lf.Read(ctx, buf, off)
}

func (h *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if e := h.fs.begin("write"); e != 0 {
		return 0, e
	}
	defer h.fs.end()
	return h.lf.Write(ctx, data, off)
}

func (h *file) Release(ctx context.Context) syscall.Errno { return h.lf.Release(ctx) }
func (h *file) Flush(ctx context.Context) syscall.Errno   { return h.lf.Flush(ctx) }

func (h *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.lf.Getattr(ctx, out)
}

// Setattr is called by node.Setattr, which counted it.
func (h *file) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return h.lf.Setattr(ctx, in, out)
}

func (h *file) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return h.lf.Lseek(ctx, off, whence)
}

func (h *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if e := h.fs.begin("allocate"); e != 0 {
		return e
	}
	defer h.fs.end()
	return h.lf.Allocate(ctx, off, size, mode)
}
