package procevent

import (
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/fsutil"
)

// The inbox index [CAP-1], [CAP-2].
//
// Every pass decides its sequence and clears its source's stale pending
// markers from the names of the inbox that belong to its source (run). A
// one-shot start lists the whole inbox for that; serve, with hundreds of
// sources passing many times a second over an inbox of thousands of
// results, spent more on those listings than on anything else it does per
// pass. So while serve runs (indexInbox), the names come from an index
// instead: one listing, then kept current from inotify(7) events of the
// inbox directory.
//
// Why the index answers what a listing would:
//   - the watch is added before the listing, so every change after the
//     listing began is in the event queue, in order;
//   - the kernel queues an event inside the call that changes the name, so
//     once a query has read the queue dry (it does, under the index's
//     lock, before it answers), every change that completed before the
//     query is applied;
//   - each name's state is that of its last event: created or moved in,
//     present; deleted, absent. A name moved away may still be present (an
//     exchange of two names reports both as moved away and then in, in an
//     order that leaves one of them last moved away), so such a name is
//     kept as uncertain and looked up (fstatat) when a query returns it;
//   - a lost event (the queue overflowed) makes the index add its watch
//     again (to the directory the query's pass pinned) and list again, and
//     a watch the kernel dropped (the directory was removed or its file
//     system unmounted) ends the index: later passes list. The watch is
//     added again because the lost events may include the IN_IGNORED of a
//     removed inbox, and a directory made in its place can have its device
//     and inode (ext4 hands a freed inode number out again at once), so the
//     index's key: without a new watch, that directory's changes would
//     never be reported.
//
// As a safety net, like the registry watch's, the index also lists again
// every indexRelist: a change the kernel did not report to inotify (a
// network or FUSE file system, an overlay's lower layer edited directly, a
// case-insensitive directory whose events spell a name in another case) is
// then seen within that bound.
//
// A query that races another process's change of a name is in the same
// position as a listing that races it: the pass holds its source's claim,
// so only what another process does to the source's names by hand can
// race, and the decisions (the next sequence, the markers to clear) read
// them just as they would from a listing.
//
// Only names of inbox entries are indexed (splitName: a source id, a
// sequence text and a known suffix); run reads no other. An inbox with more
// than indexMax of them is not indexed: passes list it, and the index's
// memory stays bounded. The index is this process's, for one directory (by
// device and inode); a pass whose pinned inbox is another directory lists.

// indexMax bounds the names an inbox index holds.
var indexMax = 1 << 16 // a variable only so a test can lower it

// indexRelist is how long an index answers from events alone before it
// lists again.
var indexRelist = 30 * time.Second // a variable only so a test can lower it

// inboxIndex is serve's index of one inbox directory.
type inboxIndex struct {
	key    [2]uint64 // the directory's device and inode
	fd     int       // the inotify descriptor (non-blocking), -1 once ended
	mu     sync.Mutex
	names  map[string]map[string]bool // source id -> name -> certain (false: moved away, may be present)
	n      int                        // names held
	relist bool                       // the next query lists again (events were lost)
	listed time.Time                  // when the last listing began
	buf    []byte
}

var inboxIndexes struct {
	mu      sync.Mutex
	enabled int                    // indexInbox calls not yet done
	idx     *inboxIndex            // the index in use, nil until a pass builds one
	skip    map[[2]uint64]struct{} // directories not to index (too many names, or the watch ended)
}

// indexInbox makes the passes of this process take the names of their
// source from an inbox index until the returned function is called, which
// ends the index once every caller is done. A long-running process with
// many passes calls it for its lifetime.
func indexInbox() (done func()) {
	inboxIndexes.mu.Lock()
	inboxIndexes.enabled++
	inboxIndexes.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g := &inboxIndexes
			g.mu.Lock()
			var x *inboxIndex
			if g.enabled--; g.enabled == 0 {
				x = g.idx
				g.idx, g.skip = nil, nil
			}
			g.mu.Unlock()
			x.close()
		})
	}
}

// sourceNames returns the inbox names of source id, as a listing of the
// pinned inbox filtered to id's entries would: from the index when this
// process keeps one, else from a listing.
func (d *dirs) sourceNames(id string) ([]string, error) {
	if d.inbox == nil {
		return nil, nil
	}
	if x := d.index(); x != nil {
		names, ok, err := x.source(d.inbox, id)
		if ok || err != nil {
			return names, err
		}
	}
	all, err := d.inboxNames()
	if err != nil {
		return nil, err
	}
	names := all[:0]
	for _, n := range all {
		if sid, _, _, ok := splitName(n); ok && sid == id {
			names = append(names, n)
		}
	}
	return names, nil
}

// index returns the index of d's pinned inbox, building it on first use;
// nil when this process keeps none, or none can be kept for it.
func (d *dirs) index() *inboxIndex {
	var st unix.Stat_t
	if unix.Fstat(int(d.inbox.Fd()), &st) != nil {
		return nil
	}
	key := [2]uint64{st.Dev, st.Ino}
	g := &inboxIndexes
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.enabled == 0 {
		return nil
	}
	if _, no := g.skip[key]; no {
		return nil
	}
	if g.idx != nil && g.idx.key == key {
		return g.idx
	}
	x, err := newInboxIndex(d.inbox, key)
	if err != nil {
		return nil // no inotify instance or descriptor left: list
	}
	// The index of another directory (the inbox was replaced) ends; a pass
	// still using it finds it ended and lists.
	if old := g.idx; old != nil {
		go old.close()
	}
	g.idx = x
	return x
}

// newInboxIndex watches the directory dir (whose device and inode are key)
// and marks the index for its first listing.
func newInboxIndex(dir *os.File, key [2]uint64) (*inboxIndex, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	x := &inboxIndex{key: key, fd: fd, relist: true, buf: make([]byte, 64<<10)}
	if err := x.watch(dir); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return x, nil
}

// watch adds the watch of dir, the directory the index is of (the same
// directory again: the watch it has; else a new one).
func (x *inboxIndex) watch(dir *os.File) error {
	// The pinned handle names the exact directory, whatever its path is now.
	path := "/proc/self/fd/" + strconv.Itoa(int(dir.Fd()))
	mask := uint32(unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ONLYDIR)
	_, err := unix.InotifyAddWatch(x.fd, path, mask)
	return err
}

// close ends x (nil: nothing to end). It must be called without
// inboxIndexes.mu held: a query holding x.mu may be waiting for it.
func (x *inboxIndex) close() {
	if x == nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.end()
}

// end closes the index's watch; x.mu is held.
func (x *inboxIndex) end() {
	if x.fd >= 0 {
		unix.Close(x.fd)
		x.fd = -1
	}
	x.names, x.n = nil, 0
}

// source answers sourceNames for id from the index; ok is false when the
// index cannot answer (it ended, or grew past indexMax), and the caller
// lists. dir is the pinned inbox the index watches.
func (x *inboxIndex) source(dir *os.File, id string) (names []string, ok bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.fd < 0 {
		return nil, false, nil
	}
	if time.Since(x.listed) >= indexRelist {
		x.relist = true
	}
	if !x.drain() || (x.relist && (x.watch(dir) != nil || !x.list(dir))) || x.n > indexMax {
		x.stop()
		return nil, false, nil
	}
	for n, certain := range x.names[id] {
		if !certain {
			var st unix.Stat_t
			err := unix.Fstatat(int(dir.Fd()), n, &st, unix.AT_SYMLINK_NOFOLLOW)
			if err == unix.ENOENT {
				x.del(id, n)
				continue
			}
			if err == nil {
				x.names[id][n] = true
			}
		}
		names = append(names, n)
	}
	return names, true, nil
}

// stop ends the index for good: its directory is listed from now on. x.mu
// is held (lock order: an index's mu, then inboxIndexes.mu).
func (x *inboxIndex) stop() {
	x.end()
	g := &inboxIndexes
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.skip == nil {
		g.skip = map[[2]uint64]struct{}{}
	}
	g.skip[x.key] = struct{}{}
	if g.idx == x {
		g.idx = nil
	}
}

// list replaces the index with a listing of dir; false if it failed. Events
// queued meanwhile are applied by the next drain, after it.
func (x *inboxIndex) list(dir *os.File) bool {
	x.listed = time.Now()
	all, err := fsutil.NamesAt(dir)
	if err != nil {
		return false
	}
	x.names, x.n, x.relist = map[string]map[string]bool{}, 0, false
	for _, n := range all {
		x.set(n, true)
	}
	return x.drain()
}

// drain applies every queued event; false if the watch ended or reading
// failed.
func (x *inboxIndex) drain() bool {
	for {
		n, err := unix.Read(x.fd, x.buf)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return true
		}
		if err != nil || n <= 0 {
			return false
		}
		ended := false
		whole := inotifyEvents(x.buf[:n], func(mask uint32, name string) bool {
			switch {
			case mask&unix.IN_IGNORED != 0:
				ended = true
				return false
			case mask&unix.IN_Q_OVERFLOW != 0:
				x.relist = true
			case x.relist:
				// Everything is listed again before the next answer.
			case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
				x.set(name, true)
			case mask&unix.IN_MOVED_FROM != 0:
				x.set(name, false)
			case mask&unix.IN_DELETE != 0:
				if sid, _, _, ok := splitName(name); ok {
					x.del(sid, name)
				}
			}
			return true
		})
		if ended || !whole {
			return false
		}
	}
}

// set records name as present (certain) or maybe present; names that are
// not inbox entries are not indexed.
func (x *inboxIndex) set(name string, certain bool) {
	sid, _, _, ok := splitName(name)
	if !ok {
		return
	}
	m := x.names[sid]
	if m == nil {
		m = map[string]bool{}
		x.names[sid] = m
	}
	if _, had := m[name]; !had {
		x.n++
	}
	m[name] = certain
}

// del forgets name of source sid.
func (x *inboxIndex) del(sid, name string) {
	m := x.names[sid]
	if _, had := m[name]; !had {
		return
	}
	delete(m, name)
	x.n--
	if len(m) == 0 {
		delete(x.names, sid)
	}
}
