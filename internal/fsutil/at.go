package fsutil

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// Files by handle. Every file fm publishes is written and named here,
// relative to a pinned directory (OpenDir): openat, linkat, renameat and
// unlinkat through the directory's descriptor, never a path that could be
// swapped for a link after the directory was checked.

// ErrExists is wrapped by CreateAt when the final name exists.
var ErrExists = errors.New("file exists")

// NewOptions select how NewAt starts a file.
type NewOptions struct {
	// Temp is the name the file has in the directory while it is written,
	// created exclusively (O_EXCL|O_NOFOLLOW); a leftover of that name is
	// removed first when Stale is set (a fixed temp name whose every writer
	// holds one lock). Empty: the file is written unnamed (O_TMPFILE), so a
	// writer killed before it publishes leaves nothing behind; a Replace or
	// an Exchange then names it TempName() for the instant before its rename
	// (swept if the writer dies there: temp.go).
	Temp  string
	Stale bool
	// Reuse makes Temp an existing file to overwrite rather than a name to
	// create: a spare that a caller kept from an earlier publish (Exchange's
	// old file) instead of unlinking it. It is opened without O_CREAT and
	// without following a link, and used only if it is a regular file with
	// one link, owned by the effective user, with exactly the mode asked;
	// what is written overwrites it from the start, and its tail is cut off
	// when it is published. Anything else is ErrNotSpare, and the caller
	// creates a file instead. Reusing spares the file system an inode
	// allocation and a free per file, which on ext4 without a journal
	// grows with the rate of recent frees (see launch's spare records).
	Reuse bool
	// Mode is the file's exact permission bits (chmod after the create, so
	// the umask does not decide them); 0600 when zero.
	Mode os.FileMode
	// NoSync makes the file not durable: neither it nor the directory is
	// fsynced (the invocation records; see the durability rule in the
	// package doc for why that is their guarantee).
	NoSync bool
	// Final is the pinned directory of the final name when it is not the
	// directory the file is written in (which must then be on the same file
	// system, and one that readers do not scan, so that no reader ever meets
	// a temp); both are fsynced. Nil: the same directory.
	Final *os.File
}

// Pending is a new file being written in a pinned directory, not yet at its
// final name. Write to it, then publish it with exactly one of Create,
// Replace or Exchange, or drop it with Abort. Errors of its methods are the
// raw errno or os error, for the caller to wrap with its own words; Write's
// is an *os.PathError naming the file as os.File.Write does (the directory
// of an unnamed file, else the temp's path), the words fm printed before
// this layer.
type Pending struct {
	dir  *os.File // where the file is written
	to   *os.File // where it is published
	fd   int      // the open file; -1 once closed
	tmp  string   // its name in dir; "" while unnamed
	sync bool
	// size is how many bytes were written; old, the size of a reused
	// file before (its tail is cut off when the file is published).
	size, old int64
	reused    bool // a spare, write-locked while it is written (openSpare)
}

// NewAt starts a file in the pinned directory dir (see NewOptions).
func NewAt(dir *os.File, o NewOptions) (*Pending, error) {
	mode := uint32(o.Mode.Perm())
	if mode == 0 {
		mode = 0o600
	}
	d := int(dir.Fd())
	var fd int
	var old int64
	var err error
	if o.Temp == "" {
		fd, err = unix.Openat(d, ".", unix.O_WRONLY|unix.O_TMPFILE|unix.O_CLOEXEC, mode)
	} else if o.Reuse {
		fd, old, err = openSpare(d, o.Temp, mode)
	} else {
		if o.Stale {
			if err := unix.Unlinkat(d, o.Temp, 0); err != nil && err != unix.ENOENT {
				return nil, err
			}
		}
		fd, err = unix.Openat(d, o.Temp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	}
	if err != nil {
		return nil, err
	}
	to := o.Final
	if to == nil {
		to = dir
	}
	p := &Pending{dir: dir, to: to, fd: fd, tmp: o.Temp, sync: !o.NoSync, old: old, reused: o.Reuse}
	if err := unix.Fchmod(fd, mode); err != nil {
		p.Abort()
		return nil, err
	}
	return p, nil
}

// ErrNotSpare is NewAt's answer (with NewOptions.Reuse) for a name that is
// not a file fit to reuse.
var ErrNotSpare = errors.New("not a reusable file")

// openSpare opens the spare name in directory d for NewOptions.Reuse and
// returns it with its size. It is not truncated here but cut to what was
// written when it is published: on ext4 a file truncated to nothing and
// written again gets its blocks allocated at close (auto_da_alloc), which
// is what reusing a file of the page cache is meant to spare.
//
// The name is looked at (statx, links not followed) before it is opened,
// and only a regular file that is not the root of a mount is opened: a
// spare waits under its name in a directory that others can write to, and
// whatever was put there in its place must be neither opened nor written
// through. An open for writing hangs up the reader of a FIFO and may act on
// a device, and a file bind-mounted at the name would be overwritten. The
// file opened must be the one looked at (a swap in between is
// ErrNotSpare). Where statx fails (a kernel before 4.11) no file is
// reused: every write creates one, as without spares.
func openSpare(d int, name string, mode uint32) (int, int64, error) {
	var sx unix.Statx_t
	if err := unix.Statx(d, name, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_INO, &sx); err != nil {
		return -1, 0, err
	}
	if sx.Mode&unix.S_IFMT != unix.S_IFREG || sx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return -1, 0, ErrNotSpare
	}
	fd, err := unix.Openat(d, name, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == unix.ELOOP || err == unix.ENXIO {
		return -1, 0, ErrNotSpare // swapped for a symbolic link, a FIFO or socket
	}
	if err != nil {
		return -1, 0, err
	}
	var st unix.Stat_t
	if err = unix.Fstat(fd, &st); err == nil && (st.Ino != sx.Ino || st.Dev != unix.Mkdev(sx.Dev_major, sx.Dev_minor) ||
		st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 || int(st.Uid) != os.Geteuid() || st.Mode&0o7777 != mode) {
		err = ErrNotSpare
	}
	// A reader that opened the file at its earlier name may still be
	// reading it (holdAt): such a file is not rewritten. The lock is held
	// while the file is written (finish drops it before the publish, so a
	// reader of the new name does not wait for the writer).
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	if e := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk); err == nil && (e == unix.EAGAIN || e == unix.EACCES) {
		err = ErrNotSpare
	}
	if err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, st.Size, nil
}

// Write appends b to the file, all of it or an error. It is a raw write(2)
// on the descriptor: an os.File would cost an fcntl(2) on every owner
// record of every invocation.
func (p *Pending) Write(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := unix.Write(p.fd, b[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			name := p.dir.Name()
			if p.tmp != "" {
				name = filepath.Join(name, p.tmp)
			}
			return n, &os.PathError{Op: "write", Path: name, Err: err}
		}
		n += m
		p.size += int64(m)
	}
	return n, nil
}

// Abort drops the file: closed, and its temp name removed. It may be called
// after a publish (it then does nothing) and more than once.
func (p *Pending) Abort() {
	if p.fd >= 0 {
		unix.Close(p.fd)
		p.fd = -1
		if p.tmp != "" {
			unix.Unlinkat(int(p.dir.Fd()), p.tmp, 0)
		}
	}
}

// finish cuts a reused file to what was written and makes the written
// bytes durable (unless NoSync).
func (p *Pending) finish() error {
	if p.old > p.size {
		if err := unix.Ftruncate(p.fd, p.size); err != nil {
			return err
		}
	}
	if p.sync && !dropped("file") {
		if err := unix.Fsync(p.fd); err != nil {
			return err
		}
	}
	if p.reused {
		lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: io.SeekStart}
		_ = unix.FcntlFlock(uintptr(p.fd), unix.F_OFD_SETLK, &lk)
	}
	return nil
}

// done closes the published file and fsyncs the directories (unless
// NoSync).
func (p *Pending) done() error {
	unix.Close(p.fd)
	p.fd = -1
	return p.syncDirs()
}

func (p *Pending) syncDirs() error {
	if !p.sync {
		return nil
	}
	if !dropped("publish-dir") {
		if err := fsyncDir(int(p.to.Fd())); err != nil {
			return err
		}
	}
	if p.to == p.dir || dropped("publish-temp-dir") {
		return nil
	}
	return fsyncDir(int(p.dir.Fd()))
}

// SetModTime sets the file's access and modification times to t.
func (p *Pending) SetModTime(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.UtimesNanoAt(unix.AT_FDCWD, procFD(p.fd), []unix.Timespec{ts, ts}, 0)
}

// named gives an unnamed file a temp name, for a rename.
func (p *Pending) named() error {
	if p.tmp != "" {
		return nil
	}
	tmp := TempName()
	if err := linkAt(p.fd, p.dir, tmp); err != nil {
		return err
	}
	p.tmp = tmp
	return nil
}

// Create publishes the file as name without replacing anything: an
// unnamed file is linked there, a named one renamed there with
// RENAME_NOREPLACE. unix.EEXIST (which errors.Is os.ErrExist) when name
// exists; nothing changed then.
func (p *Pending) Create(name string) error {
	defer p.Abort()
	if err := p.finish(); err != nil {
		return err
	}
	var err error
	if p.tmp == "" {
		err = linkAt(p.fd, p.to, name)
	} else if err = RenameNoReplace(int(p.dir.Fd()), p.tmp, int(p.to.Fd()), name); err == nil {
		p.tmp = ""
	}
	if err != nil {
		return err
	}
	return p.done()
}

// Replace publishes the file as name, atomically replacing what is there:
// a reader of name sees the old file or the new one, never a torn one.
func (p *Pending) Replace(name string) error {
	defer p.Abort()
	if err := p.finish(); err != nil {
		return err
	}
	if err := p.named(); err != nil {
		return err
	}
	if err := unix.Renameat(int(p.dir.Fd()), p.tmp, int(p.to.Fd()), name); err != nil {
		return err
	}
	p.tmp = ""
	return p.done()
}

// Exchange is Replace by renameat2(RENAME_EXCHANGE) where a file is at name:
// the old file is swapped to the temp name and unlinked there. For readers
// it is the same as Replace; for the file system it is not a rename over an
// existing name, which ext4 (auto_da_alloc) answers by allocating the new
// file's blocks at once (see launch's record publish for what that costs).
// Where name is absent or the file system cannot exchange, it is Replace.
func (p *Pending) Exchange(name string) error { return p.exchange(name, false) }

// ExchangeKeeping is Exchange that keeps the old file as a spare of the
// directory (see "Spare files") rather than unlinking it, where this
// process keeps spares there. Only for files whose readers cannot take a
// reused file's bytes for the old name's (see "Spare files").
func (p *Pending) ExchangeKeeping(name string) error { return p.exchange(name, true) }

func (p *Pending) exchange(name string, keep bool) error {
	if err := p.finish(); err != nil {
		p.Abort()
		return err
	}
	if err := p.named(); err != nil {
		p.Abort()
		return err
	}
	switch err := Exchange(int(p.dir.Fd()), p.tmp, int(p.to.Fd()), name); err {
	case nil:
		if !keep {
			p.Abort() // unlinks the old file, now at the temp name
			return p.syncDirs()
		}
		old := p.tmp
		p.tmp = ""
		err = p.done()
		sparesOf(p.dir).keep(p.dir, old)
		return err
	case unix.ENOENT, unix.EINVAL, unix.ENOSYS, unix.EOPNOTSUPP:
		return p.Replace(name)
	default:
		p.Abort()
		return err
	}
}

// linkAt gives the unnamed open file fd the name name in dir; EEXIST rather
// than replacing anything.
func linkAt(fd int, dir *os.File, name string) error {
	return unix.Linkat(unix.AT_FDCWD, procFD(fd), int(dir.Fd()), name, unix.AT_SYMLINK_FOLLOW)
}

// procFD is the /proc path of this process's descriptor fd.
func procFD(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// CreateAt durably creates name in the pinned directory dir holding data
// (mode 0600), without replacing anything: written unnamed and fsynced,
// linked at name, directory fsynced. If name exists nothing changes and the
// error wraps ErrExists.
func CreateAt(dir *os.File, name string, data []byte) error {
	return writeAt(dir, name, data, (*Pending).Create)
}

// ReplaceAt durably replaces name in the pinned directory dir with data
// (mode 0600): a reader sees the old or the new file, never a torn one.
func ReplaceAt(dir *os.File, name string, data []byte) error {
	return writeAt(dir, name, data, (*Pending).Replace)
}

// ReplaceKeepingAt is ReplaceAt that keeps the old file as a spare of dir
// (Pending.ExchangeKeeping), for the files "Spare files" allows.
func ReplaceKeepingAt(dir *os.File, name string, data []byte) error {
	return writeAt(dir, name, data, (*Pending).ExchangeKeeping)
}

// writeAt writes data to a new file of dir (a spare, when dir has one:
// NewSpareAt) and publishes it as name.
func writeAt(dir *os.File, name string, data []byte, publish func(*Pending, string) error) error {
	p, err := NewSpareAt(dir, NewOptions{})
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "create a file in %q", dir.Name())
	}
	if _, err := p.Write(data); err != nil {
		p.Abort()
		return errcode.Wrap(errcode.Internal, err, "write a file in %q", dir.Name())
	}
	path := filepath.Join(dir.Name(), name)
	switch err := publish(p, name); {
	case err == unix.EEXIST:
		return fmt.Errorf("%q: %w", path, ErrExists)
	case err != nil:
		return errcode.Wrap(errcode.Internal, err, "publish %q", path)
	}
	return nil
}

// RemoveAt durably removes the file name from the pinned directory dir; an
// absent name is not an error.
func RemoveAt(dir *os.File, name string) error {
	return removeAt(dir, name, UnlinkAt)
}

// RemoveKeepingAt is RemoveAt that keeps the file as a spare of dir
// (RetireAt), for the files "Spare files" allows.
func RemoveKeepingAt(dir *os.File, name string) error {
	return removeAt(dir, name, RetireAt)
}

func removeAt(dir *os.File, name string, remove func(*os.File, string) (bool, error)) error {
	if _, err := remove(dir, name); err != nil {
		return errcode.Wrap(errcode.Internal, err, "remove %q", filepath.Join(dir.Name(), name))
	}
	return SyncAt(dir)
}

// UnlinkAt removes the file name from the pinned directory dir, not durably
// (nothing is fsynced: a lock file, an invocation record), and reports
// whether it was there. Errors are the raw errno, for the caller to wrap.
func UnlinkAt(dir *os.File, name string) (bool, error) {
	switch err := unix.Unlinkat(int(dir.Fd()), name, 0); err {
	case nil:
		return true, nil
	case unix.ENOENT:
		return false, nil
	default:
		return false, err
	}
}

// ExistsAt reports whether the pinned directory dir holds an entry name
// (links not followed).
func ExistsAt(dir *os.File, name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// SyncAt fsyncs the pinned directory dir so the names in it are durable.
func SyncAt(dir *os.File) error {
	if dropped("sync-at") {
		return nil
	}
	if err := fsyncDir(int(dir.Fd())); err != nil {
		return errcode.Wrap(errcode.Internal, err, "sync directory %q", dir.Name())
	}
	return nil
}

// NamesAt lists the entries of the pinned directory dir, through a fresh
// descriptor of it (a dup would share dir's offset).
func NamesAt(dir *os.File) ([]string, error) {
	fd, err := unix.Openat(int(dir.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read directory %q", dir.Name())
	}
	f := os.NewFile(uintptr(fd), dir.Name())
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil && err != io.EOF {
		return nil, errcode.Wrap(errcode.Internal, err, "read directory %q", dir.Name())
	}
	return names, nil
}
