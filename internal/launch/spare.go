package launch

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/fsutil"
)

// # Spare record files
//
// Every invocation writes its record twice (reserved, then phase group)
// and removes it once. Done with new files, that is two inodes allocated
// and two freed per invocation; a serve with hundreds of sources starts
// hundreds of invocations a second, and on ext4 without a journal (these
// machines) allocating an inode searches past every inode freed in the
// last ~30 s (the kernel's recently_deleted), so the cost of each create
// grew with the rate itself and was serve's largest (docs/performance.md).
//
// With spares on in a records directory (KeepSpares), a record file this process is done with
// is not unlinked but kept for its next record write:
//   - the reserved record's file, swapped out by the rewrite in phase
//     group, stays at the temporary name the exchange left it at;
//   - a finished invocation's record is renamed (RENAME_NOREPLACE) to a
//     fresh temporary name of this process instead of unlinked.
//
// A spare is a temporary file of this process by its name (see tempName),
// so every listing ignores it and Cleanup removes it once this process is
// dead, as any temporary file. The next write opens it (fsutil
// NewOptions.Reuse: a plain 0600 file of ours with one link, or it is
// unlinked and a file created instead), truncates and writes it, and
// renames it into place as before: a reader still sees a whole record or
// none. One thing changes for readers: a file that a reader opened as
// record R may, once R is removed, be rewritten with another record while
// the reader still holds it. So a reader checks, after reading, that R
// still names the file it read (recordDir.readOnce); a file that left R
// is never at R again, because record names are never reused (random)
// and each rewrite of R swaps in a file that was not at R.
//
// Spares are kept per records directory, at most spareMax of them; only a
// long-running host turns them on (serve, for its home's directory): a
// one-shot command's spares would outlive it as temporary files until the
// next Cleanup.

// spareMax bounds the spares kept per records directory: enough for the
// invocations of hundreds of sources that end and start within the same
// moment, few enough that a serve's temporary files stay a small number.
const spareMax = 128

// spares is this process's pool: for each records directory it keeps
// spares in (by path; a name is only ever used through the pinned
// directory and its checks, so a directory swapped at that path costs a
// fallback, not a mistake), the callers of KeepSpares not yet done and
// the names of its spare files.
var spares struct {
	mu   sync.Mutex
	dirs map[string]*spareDir
}

type spareDir struct {
	users int
	names []string
}

// KeepSpares makes this process keep spare record files in the records
// directory records (see "Spare record files") until the returned function
// is called; when the last such caller for that directory is done, the
// spares kept there are unlinked. A host calls it for its lifetime, and
// calls the function before it exits.
func KeepSpares(records string) (done func()) {
	spares.mu.Lock()
	if spares.dirs == nil {
		spares.dirs = map[string]*spareDir{}
	}
	sd := spares.dirs[records]
	if sd == nil {
		sd = &spareDir{}
		spares.dirs[records] = sd
	}
	sd.users++
	spares.mu.Unlock()
	return sync.OnceFunc(func() { dropSpares(records) })
}

// dropSpares ends one KeepSpares of records; the last one unlinks its
// spares.
func dropSpares(records string) {
	spares.mu.Lock()
	sd := spares.dirs[records]
	sd.users--
	if sd.users > 0 {
		spares.mu.Unlock()
		return
	}
	delete(spares.dirs, records)
	spares.mu.Unlock()
	if len(sd.names) == 0 {
		return
	}
	d, err := openRecordDir(records, false)
	if d == nil || err != nil {
		return // gone or unsafe: Cleanup removes what is left
	}
	defer d.close()
	for _, n := range sd.names {
		_ = unix.Unlinkat(d.fd, n, 0)
	}
}

// take returns a spare of d to write, or "" when there is none.
func (d *recordDir) take() string {
	spares.mu.Lock()
	defer spares.mu.Unlock()
	sd := spares.dirs[d.path]
	if sd == nil || len(sd.names) == 0 {
		return ""
	}
	name := sd.names[len(sd.names)-1]
	sd.names = sd.names[:len(sd.names)-1]
	return name
}

// room reports whether d's pool would keep one more spare.
func (d *recordDir) room() bool {
	spares.mu.Lock()
	defer spares.mu.Unlock()
	sd := spares.dirs[d.path]
	return sd != nil && len(sd.names) < spareMax
}

// keep puts name into d's pool and reports whether it did; a name it did
// not keep is the caller's to unlink.
func (d *recordDir) keep(name string) bool {
	spares.mu.Lock()
	defer spares.mu.Unlock()
	sd := spares.dirs[d.path]
	if sd == nil || len(sd.names) >= spareMax {
		return false
	}
	sd.names = append(sd.names, name)
	return true
}

// discard keeps the file at name as a spare, or unlinks it.
func (d *recordDir) discard(name string) {
	if !d.keep(name) {
		_ = unix.Unlinkat(d.fd, name, 0)
	}
}

// newFile starts the file a record is written to before it is published
// as name: a spare when d has one fit to reuse, else a new file at the
// temporary name of name.
func (d *recordDir) newFile(name string, host Identity) (*fsutil.Pending, error) {
	for s := d.take(); s != ""; s = d.take() {
		p, err := fsutil.NewAt(d.dir, fsutil.NewOptions{Temp: s, NoSync: true, Reuse: true})
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, unix.ENOENT) {
			_ = unix.Unlinkat(d.fd, s, 0) // not fit (or unreadable): not ours to keep
		}
	}
	return fsutil.NewAt(d.dir, fsutil.NewOptions{Temp: tempName(name, host), NoSync: true})
}

// release removes this process's record name at the end of its
// invocation: renamed to a fresh temporary name and kept as a spare when
// d's pool has room, else unlinked. It reports false if name was already
// gone.
func (d *recordDir) release(name string) (bool, error) {
	if d.room() {
		if s, err := d.spareName(); err == nil {
			switch err := fsutil.RenameNoReplace(d.fd, name, d.fd, s); err {
			case nil:
				d.discard(s)
				return true, nil
			case unix.ENOENT:
				return false, nil
			}
		}
	}
	return d.remove(name)
}

// spareName is a fresh temporary name of this process, for a record file
// that is released into the pool.
func (d *recordDir) spareName() (string, error) {
	host, err := selfIdentity()
	if err != nil {
		return "", err
	}
	fresh, err := newRecordName("")
	if err != nil {
		return "", err
	}
	return tempName(fresh, host), nil
}
