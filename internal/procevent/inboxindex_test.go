package procevent

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// InotifyQueueLimit is this machine's fs.inotify.max_queued_events, for the
// tests that overflow an inotify queue on purpose; it skips t where the
// limit is unknown or too large to overflow quickly.
func InotifyQueueLimit(t testing.TB) int {
	t.Helper()
	data, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events")
	if err != nil {
		t.Skip(err)
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || limit > 1<<18 {
		t.Skipf("max_queued_events is %q", data)
	}
	return limit
}

// indexFixture is an inbox directory pinned as a pass pins it, with the
// index of this process on.
type indexFixture struct {
	t   *testing.T
	dir string
	d   *dirs
}

func newIndexFixture(t *testing.T) *indexFixture {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "inbox")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	t.Cleanup(indexInbox())
	return &indexFixture{t: t, dir: dir, d: &dirs{inbox: f}}
}

// check fails unless the index answers, for every source in ids, what a
// listing of the directory does, and is still in use.
func (x *indexFixture) check(ids ...string) {
	x.t.Helper()
	ents, err := os.ReadDir(x.dir)
	if err != nil {
		x.t.Fatal(err)
	}
	for _, id := range ids {
		var want []string
		for _, e := range ents {
			if sid, _, _, ok := splitName(e.Name()); ok && sid == id {
				want = append(want, e.Name())
			}
		}
		got, err := x.d.sourceNames(id)
		if err != nil {
			x.t.Fatal(err)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			x.t.Fatalf("source %s: the index answers %q, a listing %q", id, got, want)
		}
	}
	if idx := x.d.index(); idx == nil || idx.fd < 0 {
		x.t.Fatal("the index is no longer in use")
	}
}

func (x *indexFixture) path(n string) string { return filepath.Join(x.dir, n) }

func (x *indexFixture) create(n string) {
	x.t.Helper()
	if err := os.WriteFile(x.path(n), nil, 0o600); err != nil {
		x.t.Fatal(err)
	}
}

// entryNames are the inbox entry names of source id for sequences 1 to seqs,
// each with every suffix, in that order.
func entryNames(id string, seqs int, suffixes ...string) []string {
	var names []string
	for seq := 1; seq <= seqs; seq++ {
		for _, suffix := range suffixes {
			names = append(names, name(id, int64(seq), suffix))
		}
	}
	return names
}

// [CAP-1] [CAP-2] serve's inbox index answers, after any sequence of
// changes made to the directory by any means (create, unlink, rename within,
// into and out of it, rename over a name, exchange, hard link, mkdir and
// rmdir), exactly the names of each source that a listing gives, so a pass
// decides its sequence and its stale markers as a one-shot start does.
func TestInboxIndexMatchesListing(t *testing.T) {
	x := newIndexFixture(t)
	outside := t.TempDir()
	ids := []string{"s1", "s2", "web-feed"}
	var names []string
	for _, id := range ids {
		names = append(names, entryNames(id, 4, resultSuffix, metaSuffix, handledSuffix, pendingSuffix)...)
	}
	names = append(names, ".tmp-1-2-abc", "notes.txt", "s1.9223372036854775808.result", "s1.01.result")
	for _, n := range names[:20] {
		x.create(n)
	}
	x.check(ids...)
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() string { return names[rng.IntN(len(names))] }
	for round := range 400 {
		for range 1 + rng.IntN(6) {
			a, b := pick(), pick()
			switch rng.IntN(8) {
			case 0:
				os.WriteFile(x.path(a), []byte("x"), 0o600)
			case 1:
				os.Remove(x.path(a))
			case 2:
				os.Rename(x.path(a), x.path(b))
			case 3:
				os.Rename(x.path(a), filepath.Join(outside, a))
			case 4:
				os.Rename(filepath.Join(outside, a), x.path(a))
			case 5:
				unix.Renameat2(unix.AT_FDCWD, x.path(a), unix.AT_FDCWD, x.path(b), unix.RENAME_EXCHANGE)
			case 6:
				os.Link(x.path(a), x.path(b))
			case 7:
				if os.Mkdir(x.path(a), 0o700) != nil {
					os.Remove(x.path(a))
				}
			}
		}
		if round%3 == 0 {
			x.check(ids...)
		}
	}
	x.check(ids...)
}

// An exchange of two names reports both as moved away and moved in; the
// index must not take the one last reported moved away for gone.
func TestInboxIndexExchange(t *testing.T) {
	x := newIndexFixture(t)
	a, b := name("s1", 1, resultSuffix), name("s1", 2, resultSuffix)
	x.create(a)
	x.create(b)
	x.check("s1")
	if err := unix.Renameat2(unix.AT_FDCWD, x.path(a), unix.AT_FDCWD, x.path(b), unix.RENAME_EXCHANGE); err != nil {
		t.Skipf("no RENAME_EXCHANGE here: %v", err)
	}
	x.check("s1")
}

// Events the kernel could not queue are not lost to the index: it lists
// again.
func TestInboxIndexOverflow(t *testing.T) {
	limit := InotifyQueueLimit(t)
	x := newIndexFixture(t)
	a, b := x.path(name("s1", 1, resultSuffix)), x.path(name("s1", 2, resultSuffix))
	x.create(filepath.Base(a))
	x.check("s1")
	for range limit/2 + 1 { // two events per rename: the queue overflows
		if err := os.Rename(a, b); err != nil {
			t.Fatal(err)
		}
		a, b = b, a
	}
	x.create(name("s1", 3, pendingSuffix)) // reported only past the overflow
	x.check("s1")
}

// A pass whose inbox is another directory (the inbox was replaced) gets
// that directory's names; an inbox with more names than indexMax is listed.
func TestInboxIndexFollowsTheDirectory(t *testing.T) {
	x := newIndexFixture(t)
	x.create(name("s1", 1, resultSuffix))
	x.check("s1")
	first := x.d.index()

	dir2 := filepath.Join(t.TempDir(), "inbox")
	os.Mkdir(dir2, 0o700)
	os.WriteFile(filepath.Join(dir2, name("s1", 7, resultSuffix)), nil, 0o600)
	f2, err := os.Open(dir2)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	y := &indexFixture{t: t, dir: dir2, d: &dirs{inbox: f2}}
	y.check("s1")
	if y.d.index() == first {
		t.Fatal("the other directory got the first one's index")
	}

	old := indexMax
	indexMax = 8
	defer func() { indexMax = old }()
	for seq := range 9 {
		y.create(name("s2", int64(seq+1), metaSuffix))
	}
	got, err := y.d.sourceNames("s2")
	if err != nil || len(got) != 9 {
		t.Fatalf("past indexMax: %q %v", got, err)
	}
	if y.d.index() != nil {
		t.Fatal("an inbox past indexMax is still indexed")
	}
}

// Without serve's index, a pass lists: sourceNames is the listing filtered
// to the source.
func TestSourceNamesWithoutIndex(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{name("a", 1, resultSuffix), name("b", 1, resultSuffix), "junk"} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o600)
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := &dirs{inbox: f}
	if d.index() != nil {
		t.Fatal("an index without indexInbox")
	}
	got, err := d.sourceNames("a")
	if err != nil || fmt.Sprint(got) != "["+name("a", 1, resultSuffix)+"]" {
		t.Fatalf("got %q %v", got, err)
	}
}

// [CAP-1] [CAP-2] An overflow can swallow the IN_IGNORED that ends the
// watch of a removed inbox, and a file system such as ext4 gives the next
// directory the removed one's inode number at once: a new inbox made in its
// place then has the index's key. The index must not keep answering from a
// watch that ended: names put in the new inbox later are seen.
func TestInboxIndexReplacedAfterOverflow(t *testing.T) {
	limit := InotifyQueueLimit(t)
	x := newIndexFixture(t)
	x.create(name("s1", 1, resultSuffix))
	x.check("s1")
	var st unix.Stat_t
	if err := unix.Fstat(int(x.d.inbox.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	a, b := x.path("junk-a"), x.path("junk-b")
	x.create("junk-a")
	for range limit/2 + 1 { // two events per rename: the queue overflows
		if err := os.Rename(a, b); err != nil {
			t.Fatal(err)
		}
		a, b = b, a
	}
	// The inbox is removed (its IN_IGNORED lost) and made again; no pass
	// holds it meanwhile.
	x.d.inbox.Close()
	if err := os.RemoveAll(x.dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(x.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(x.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st2 unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st2); err != nil {
		t.Fatal(err)
	}
	if st2.Dev != st.Dev || st2.Ino != st.Ino {
		t.Skip("the new directory got another inode number here")
	}
	x.d.inbox = f
	x.check("s1")
	x.create(name("s1", 2, pendingSuffix))
	x.create("s1.9223372036854775808.result")
	x.check("s1")
}

// [CAP-1] [CAP-2] The changes a hostile operator can make beyond those of
// TestInboxIndexMatchesListing: a rename that leaves a whiteout at its
// source (no event reports the whiteout), a rename that must not replace,
// exchanges with a name outside the inbox either way, an O_TMPFILE file
// linked in, a hard link of an outside file, symlinks and FIFOs at entry
// names, and names that are almost entries (a newline, a byte that is not
// UTF-8, an empty sequence); source ids that differ only in case.
func TestInboxIndexHostileRenames(t *testing.T) {
	x := newIndexFixture(t)
	outside := t.TempDir()
	ids := []string{"s1", "S1", "a.b"}
	var names []string
	for _, id := range ids {
		names = append(names, entryNames(id, 3, resultSuffix, handledSuffix, pendingSuffix)...)
		names = append(names, id+".9223372036854775808.result")
	}
	names = append(names, "s1.1.result\n", "s1.\xff.result", "s1..result")
	touch := func(p string) error { // O_NONBLOCK: a FIFO there has no reader
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_WRONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}
	rng := rand.New(rand.NewPCG(7, 9))
	pick := func() string { return names[rng.IntN(len(names))] }
	done := map[int]int{}
	for round := range 1500 {
		for range 1 + rng.IntN(5) {
			a, b := pick(), pick()
			op := rng.IntN(11)
			var err error
			switch op {
			case 0:
				err = touch(x.path(a))
			case 1:
				err = os.Remove(x.path(a))
			case 2:
				err = unix.Renameat2(unix.AT_FDCWD, x.path(a), unix.AT_FDCWD, x.path(b), unix.RENAME_WHITEOUT)
			case 3:
				err = unix.Renameat2(unix.AT_FDCWD, x.path(a), unix.AT_FDCWD, x.path(b), unix.RENAME_NOREPLACE)
			case 4:
				err = unix.Renameat2(unix.AT_FDCWD, x.path(a), unix.AT_FDCWD, filepath.Join(outside, b), unix.RENAME_EXCHANGE)
			case 5:
				err = unix.Renameat2(unix.AT_FDCWD, filepath.Join(outside, a), unix.AT_FDCWD, x.path(b), unix.RENAME_EXCHANGE)
			case 6:
				err = os.Symlink(x.path(b), x.path(a))
			case 7:
				err = unix.Mkfifo(x.path(a), 0o600)
			case 8:
				if err = touch(filepath.Join(outside, a)); err == nil {
					err = os.Link(filepath.Join(outside, a), x.path(b))
				}
			case 9:
				err = os.Rename(x.path(a), filepath.Join(outside, b))
			case 10:
				var fd int
				if fd, err = unix.Open(x.dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600); err == nil {
					err = unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, x.path(a), unix.AT_SYMLINK_FOLLOW)
					unix.Close(fd)
				}
			}
			if err == nil {
				done[op]++
			}
		}
		if round%2 == 0 {
			x.check(ids...)
		}
	}
	x.check(ids...)
	t.Logf("changes made, by kind: %v", done)
}

// [CAP-1] [CAP-2] The inbox renamed away and back, exchanged with another
// directory, and written between, 300 times, each followed by a pass that
// pins whatever the path names: every answer is that directory's, and the
// indexes of the directories left behind end (no descriptor is kept).
func TestInboxIndexSwapsKeepNothing(t *testing.T) {
	x := newIndexFixture(t)
	other := filepath.Join(filepath.Dir(x.dir), "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(other, name("s1", 5, handledSuffix)), nil, 0o600)
	x.create(name("s1", 1, resultSuffix))
	x.check("s1")
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	for i := range 300 {
		switch i % 3 {
		case 0:
			if err := unix.Renameat2(unix.AT_FDCWD, x.dir, unix.AT_FDCWD, other, unix.RENAME_EXCHANGE); err != nil {
				t.Skipf("no RENAME_EXCHANGE here: %v", err)
			}
		case 1:
			os.Rename(x.dir, x.dir+".away")
			os.Rename(x.dir+".away", x.dir)
		case 2:
			x.create(name("s1", int64(10+i), pendingSuffix))
		}
		f, err := os.Open(x.dir)
		if err != nil {
			t.Fatal(err)
		}
		x.d.inbox.Close()
		x.d.inbox = f
		x.check("s1")
	}
	deadline := time.Now().Add(10 * time.Second) // ended indexes close in the background
	for fds() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if after := fds(); after > before {
		t.Fatalf("descriptors grew from %d to %d over 300 replacements", before, after)
	}
}

// A change the kernel never reported (simulated: a name the index lost) is
// seen once indexRelist has passed since the last listing.
func TestInboxIndexRelistsAsASafetyNet(t *testing.T) {
	x := newIndexFixture(t)
	n := name("s1", 1, resultSuffix)
	x.create(n)
	x.check("s1")
	idx := x.d.index()
	idx.mu.Lock()
	idx.del("s1", n) // as if its creation had never been reported
	idx.mu.Unlock()
	if got, _ := x.d.sourceNames("s1"); len(got) != 0 {
		t.Fatalf("the index answered %q before its relisting was due; the simulation is void", got)
	}
	old := indexRelist
	indexRelist = 0
	defer func() { indexRelist = old }()
	x.check("s1")
}
