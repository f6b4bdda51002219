// Package wake is the durable wake queue of a home (CONTRACT §11).
//
// The queue is one append-only file, <state>/.wake-queue, of lines
//
//	<unix-seconds>\t<queue-seq>\t<kind>\t<key>\t<payload>\n
//
// Rules:
//   - A line is appended under the lock of the queue file itself
//     (fsutil.Lock: a wait that ends with ctx, and a lock that holds only on
//     the file at the queue's name) and fsynced before Append returns, so a
//     returned wake survives a crash and two writers never share a queue-seq.
//     The kernel drops the lock when a writer dies, so a dead writer never
//     blocks the queue.
//   - queue-seqs run from 1 to MaxSeq (2^63-1). The next one is one more than
//     the greater of the high-water mark <state>/.wake-queue.seq (mark.go) and
//     the last well-formed line's queue-seq: it only grows, even when the
//     queue is removed, truncated or compacted, so a reader can resume after
//     any seq it saw. A queue at MaxSeq refuses every append with
//     sequence-exhausted: it never writes a queue-seq readers would reject.
//   - Control characters (tabs, newlines, carriage returns, escapes, ...),
//     formatting characters and line separators in key and payload become
//     spaces, and bytes that are not UTF-8 become U+FFFD, so one wake is
//     always exactly one line with five fields and nothing a reader prints
//     can end or rewrite a line of its output. A line in the queue whose key
//     or payload breaks this (a queue written by another program, or edited)
//     is a bad line. A kind is a lower-case word. Key and payload are bounded
//     by MaxField bytes.
//   - A crash can at worst leave a final line without its newline. Readers
//     ignore any line that is not complete and well-formed, and the next
//     Append first terminates such a torn tail with tornEnd, which keeps it
//     malformed, so it never corrupts the following wake nor becomes one.
//     Readers skip every bad line and read on (read.go), in bounded memory.
//   - The queue and its mark are private files: one regular file, not a link,
//     one hard link, owned by the user, mode exactly 0600. Writers open them
//     relative to a pinned state directory handle (see package procevent), so
//     a swapped state path can never redirect an append.
//   - The queue grows until Compact (compact.go) rewrites it.
//
// Nothing here interprets a wake: the queue is a doorbell for the primary
// agent, never a carrier of captured output.
package wake

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/shown"
)

// FileName is the queue's name inside the state root ([HOME-4]).
const FileName = ".wake-queue"

// MaxField bounds a wake's key and payload, in bytes.
const MaxField = 1024

// tornEnd terminates a torn tail: five tabs and a newline.
const tornEnd = "\t\t\t\t\t\n"

// maxLine bounds one line a reader accepts: five fields and four tabs.
const maxLine = 3*32 + 2*MaxField + 8

// Wake is one queued wake.
type Wake struct {
	Time    int64  `json:"time"`
	Seq     int64  `json:"seq"`
	Kind    string `json:"kind"`
	Key     string `json:"key"`
	Payload string `json:"payload"`
}

// Line is the wake as it is stored, newline included.
func (w Wake) Line() string {
	return fmt.Sprintf("%d\t%d\t%s\t%s\t%s\n", w.Time, w.Seq, w.Kind, w.Key, w.Payload)
}

// kindRe is compiled on first use, not at start-up: its {0,31} repetition
// costs every fm process, launch barriers included, 0.15 ms before main.
var kindRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`) })

// Append durably appends one wake to the queue in the state directory state
// (an open, already checked directory handle) and returns it. Its queue-seq
// is one more than the greater of the high-water mark and the last
// well-formed line's queue-seq; the mark is raised to it before the line is
// written. A queue that cannot advance is refused with sequence-exhausted and
// nothing is written. Concurrent appends of the process to one queue share
// one lock, mark write and fsync (group.go); ctx ends an append only while
// its wake waits for the lock (see Cancellation there).
func Append(ctx context.Context, state *os.File, kind, key, payload string) (Wake, error) {
	if !kindRe().MatchString(kind) {
		return Wake{}, errcode.New(errcode.Internal, "wake kind %q must be a lower-case word", kind)
	}
	key, payload = shown.Flatten(key), shown.Flatten(payload)
	if len(key) > MaxField || len(payload) > MaxField {
		return Wake{}, errcode.New(errcode.Internal, "wake key or payload longer than %d bytes", MaxField)
	}
	r := &request{kind: kind, key: key, payload: payload, done: make(chan struct{})}
	if err := enqueue(state, r); err != nil {
		return Wake{}, err
	}
	return r.wait(ctx)
}

// next returns the queue-seq the next wake of the locked queue f (of size
// size) gets, how many of n wakes fit before MaxSeq (at least one), and
// whether f ends in a torn line. sequence-exhausted when none fits.
func next(state, f *os.File, size int64, n int) (int64, int, bool, error) {
	mark, err := readMark(state)
	if err != nil {
		return 0, 0, false, err
	}
	last, torn, err := lastSeq(f, size)
	if err != nil {
		return 0, 0, false, err
	}
	top := max(mark, last)
	if top >= MaxSeq {
		return 0, 0, false, exhausted(filepath.Join(state.Name(), FileName), top)
	}
	return top + 1, int(min(int64(n), MaxSeq-top)), torn, nil
}

// exhausted is the error for the queue at path whose queue-seq reached top.
func exhausted(path string, top int64) error {
	return errcode.New(errcode.SequenceExhausted,
		"wake queue %q has reached queue-seq %d and cannot advance; nothing was appended: move %s and %s aside (consumers then resume with --after 0)",
		path, top, FileName, MarkName)
}

// Exhausted reports, as a sequence-exhausted error, a queue in state that
// can take no more wakes, so that a runner refuses before it polls rather
// than capturing a result it cannot announce. It takes no lock: Append
// checks again under it.
func Exhausted(state *os.File) error {
	f, size, err := openAt(state)
	if f == nil || err != nil {
		if err == nil {
			_, _, _, err = next(state, nil, 0, 1)
		}
		return err
	}
	defer f.Close()
	_, _, _, err = next(state, f, size, 1)
	return err
}

// openLocked takes the queue's lock in state (fsutil.Lock: a wait that ends
// with ctx, held only on the file at the queue's name, which Compact replaces
// by rename while writers wait for it); waiting, when set, is called when
// the first attempt found the lock held. With create, an absent queue is
// created 0600; without, an absent queue is (nil, nil).
func openLocked(ctx context.Context, state *os.File, create bool, waiting func()) (*fsutil.Locked, error) {
	if !create {
		var st unix.Stat_t
		switch err := unix.Fstatat(int(state.Fd()), FileName, &st, unix.AT_SYMLINK_NOFOLLOW); err {
		case nil:
		case unix.ENOENT:
			return nil, nil
		default:
			return nil, errcode.Wrap(errcode.Internal, err, "stat wake queue %q", filepath.Join(state.Name(), FileName))
		}
	}
	l, err := fsutil.Lock(ctx, state, FileName, fsutil.LockOptions{What: "wake queue", Data: true, Waiting: waiting})
	if path := filepath.Join(state.Name(), FileName); errcode.Is(err, errcode.ModeUnsafe) && earlier(path) {
		return nil, needsImport(path)
	}
	return l, err
}

// check applies the private-file rule to the open queue and returns its size.
func check(f *os.File) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, errcode.Wrap(errcode.Internal, err, "stat wake queue %q", f.Name())
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return 0, errcode.New(errcode.PathUnsafe, "wake queue %q is not a regular file; move it aside", f.Name())
	case st.Nlink != 1:
		return 0, errcode.New(errcode.LinkUnsafe, "wake queue %q has %d hard links; it must have exactly one: remove the other names of it", f.Name(), st.Nlink)
	case int(st.Uid) != os.Geteuid():
		return 0, errcode.New(errcode.OwnerMismatch, "wake queue %q is owned by uid %d, not by you (uid %d): chown it, or run fm as its owner", f.Name(), st.Uid, os.Geteuid())
	case st.Mode&0o7777 != 0o600 && earlier(f.Name()):
		return 0, needsImport(f.Name())
	case st.Mode&0o7777 != 0o600:
		return 0, errcode.New(errcode.ModeUnsafe, "wake queue %q has mode %04o; it must be 0600 (chmod 600)", f.Name(), st.Mode&0o7777)
	}
	return st.Size, nil
}

// earlierLock is the earlier Firstmate implementation's lock beside its
// queue. fm never makes it, and fm home import removes it (after it made the
// queue 0600, its first step).
const earlierLock = ".wake-queue.lock"

// needsImport is the refusal of the earlier implementation's queue at path.
func needsImport(path string) error {
	return errcode.New(errcode.HomeImportNeeded, "wake queue %q is not 0600 and the earlier Firstmate implementation's %s lies beside it; this home was written by the earlier Firstmate implementation: stop it, then run fm home import", path, earlierLock)
}

// earlier reports whether the earlier implementation's lock lies beside the
// queue at path: a queue that is not 0600 there is that implementation's,
// and fm home import converts it (home-import-needed, not mode-unsafe).
func earlier(path string) bool {
	_, err := os.Lstat(filepath.Join(filepath.Dir(path), earlierLock))
	return err == nil
}

// Parse reads one stored line (without its newline). ok is false for
// anything that is not exactly five well-formed fields within maxLine bytes,
// and for a queue-seq outside 1..MaxSeq.
func Parse(line string) (w Wake, ok bool) {
	if len(line) > maxLine {
		return Wake{}, false
	}
	f := strings.Split(line, "\t")
	if len(f) != 5 || !kindRe().MatchString(f[2]) || !shown.Plain(f[3]) || !shown.Plain(f[4]) {
		return Wake{}, false
	}
	t, err1 := strconv.ParseInt(f[0], 10, 64)
	s, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil || s < 1 {
		return Wake{}, false
	}
	return Wake{Time: t, Seq: s, Kind: f[2], Key: f[3], Payload: f[4]}, true
}

// open opens the queue in the state root stateDir for reading and returns
// it with its size; a nil file means it does not exist.
func open(stateDir string) (*os.File, int64, error) {
	path := filepath.Join(stateDir, FileName)
	return openRead(unix.AT_FDCWD, path, path)
}

// openAt is open relative to the state directory handle state.
func openAt(state *os.File) (*os.File, int64, error) {
	return openRead(int(state.Fd()), FileName, filepath.Join(state.Name(), FileName))
}

// openRead opens name relative to dirfd read-only. The open never blocks and
// never follows a link (O_NONBLOCK|O_NOFOLLOW): a FIFO or device planted at
// the queue's name would otherwise block the open until a writer came, which
// no signal interrupts. check then requires a regular file on the open
// descriptor before anything is read. A file with no link left was replaced
// since it was opened (a compaction renames the new queue over it), and the
// file now at the name is opened instead, at most reopenBound times.
func openRead(dirfd int, name, display string) (*os.File, int64, error) {
	for range reopenBound {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		switch {
		case err == unix.ENOENT:
			return nil, 0, nil
		case err == unix.ELOOP:
			return nil, 0, errcode.New(errcode.LinkUnsafe, "wake queue %q is a symlink; remove it", display)
		case err != nil:
			return nil, 0, errcode.Wrap(errcode.Internal, err, "open wake queue %q", display)
		}
		f := os.NewFile(uintptr(fd), display)
		size, err := check(f)
		if err != nil {
			var st unix.Stat_t
			replaced := errcode.Is(err, errcode.LinkUnsafe) && unix.Fstat(fd, &st) == nil && st.Nlink == 0
			f.Close()
			if replaced {
				continue
			}
			return nil, 0, err
		}
		return f, size, nil
	}
	return nil, 0, errcode.New(errcode.Internal, "wake queue %q kept being replaced while it was opened (%d times); retry", display, reopenBound)
}

// reopenBound bounds how often openRead opens the queue again.
const reopenBound = 100
