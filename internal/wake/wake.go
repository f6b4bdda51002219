// Package wake is the durable wake queue of a home (CONTRACT §11).
//
// The queue is one append-only file, <state>/.wake-queue, of lines
//
//	<unix-seconds>\t<queue-seq>\t<kind>\t<key>\t<payload>\n
//
// Rules:
//   - A line is appended under an exclusive flock(2) on the queue file itself
//     and fsynced before Append returns, so a returned wake survives a crash
//     and two writers never share a queue-seq. The kernel drops the lock when
//     a writer dies, so a dead writer never blocks the queue.
//   - queue-seq is the last complete line's queue-seq plus one (1 for an empty
//     queue), or the high-water mark MarkName plus one when that is higher:
//     it only grows, and a reader can resume after any seq it saw. The mark
//     is the last queue-seq the earlier Firstmate implementation issued,
//     kept by fm home import; fm itself never writes it, so an fm home has
//     none and the last line alone decides.
//   - Tabs, newlines and carriage returns in key and payload become spaces, so
//     one wake is always exactly one line with five fields. A kind is a
//     lower-case word. Key and payload are bounded by MaxField bytes.
//   - A crash can at worst leave a final line without its newline. Readers
//     ignore any line that is not complete and well-formed, and the next
//     Append first terminates such a torn tail with tornEnd, which keeps it
//     malformed, so it never corrupts the following wake nor becomes one.
//   - The queue is a private file: one regular file, not a link, one hard
//     link, owned by the user, mode exactly 0600. Writers open it relative to
//     a pinned state directory handle (see package procevent), so a swapped
//     state path can never redirect an append.
//
// Nothing here interprets a wake: the queue is a doorbell for the primary
// agent, never a carrier of captured output.
package wake

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
)

// FileName is the queue's name inside the state root ([HOME-4]).
const FileName = ".wake-queue"

// MaxField bounds a wake's key and payload, in bytes.
const MaxField = 1024

// MarkName is the queue-seq high-water mark beside the queue: the last
// queue-seq issued, as decimal text and a newline, a private file.
const MarkName = ".wake-queue.seq"

// ParseMark reads the content of a high-water mark: a decimal number without
// sign or leading zeros, then a newline (or not).
func ParseMark(data []byte) (int64, bool) {
	v := strings.TrimSuffix(string(data), "\n")
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil && n >= 0 && strconv.FormatInt(n, 10) == v
}

// mark reads the high-water mark in the state directory state (0: none).
func mark(state *os.File) (int64, error) {
	data, err := fsutil.ReadPrivateAt(state, MarkName, 32)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, ok := ParseMark(data)
	if !ok {
		return 0, errcode.New(errcode.SchemaInvalid, "wake queue mark %q is not a decimal number; fix it (the last queue-seq issued) or remove it", filepath.Join(state.Name(), MarkName))
	}
	return n, nil
}

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

var kindRe = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

var flatten = strings.NewReplacer("\t", " ", "\n", " ", "\r", " ")

// Append durably appends one wake to the queue in the state directory state
// (an open, already checked directory handle) and returns it.
func Append(state *os.File, kind, key, payload string) (Wake, error) {
	if !kindRe.MatchString(kind) {
		return Wake{}, errcode.New(errcode.Internal, "wake kind %q must be a lower-case word", kind)
	}
	key, payload = flatten.Replace(key), flatten.Replace(payload)
	if len(key) > MaxField || len(payload) > MaxField {
		return Wake{}, errcode.New(errcode.Internal, "wake key or payload longer than %d bytes", MaxField)
	}
	display := filepath.Join(state.Name(), FileName)
	// O_NONBLOCK: opening a FIFO or device planted at the name never blocks;
	// check refuses anything but a regular file before it is used.
	const flags = unix.O_RDWR | unix.O_APPEND | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
	fd, err := unix.Openat(int(state.Fd()), FileName, flags|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err == nil {
		// New: make the mode exact whatever the umask, and the name durable.
		err = unix.Fchmod(fd, 0o600)
		if err == nil {
			err = unix.Fsync(int(state.Fd()))
		}
		if err != nil {
			unix.Close(fd)
			return Wake{}, errcode.Wrap(errcode.Internal, err, "create wake queue %q", display)
		}
	} else if err == unix.EEXIST {
		fd, err = unix.Openat(int(state.Fd()), FileName, flags, 0)
	}
	if err != nil {
		if err == unix.ELOOP {
			return Wake{}, errcode.New(errcode.LinkUnsafe, "wake queue %q is a symlink; remove it", display)
		}
		return Wake{}, errcode.Wrap(errcode.Internal, err, "open wake queue %q", display)
	}
	f := os.NewFile(uintptr(fd), display)
	defer f.Close()
	if err := lock(fd); err != nil {
		return Wake{}, errcode.Wrap(errcode.Internal, err, "lock wake queue %q", display)
	}
	size, err := check(f)
	if err != nil {
		var st unix.Stat_t
		return Wake{}, earlier(err, unix.Fstatat(int(state.Fd()), earlierLock, &st, unix.AT_SYMLINK_NOFOLLOW) == nil, display)
	}
	last, torn, err := lastSeq(f, size)
	if err != nil {
		return Wake{}, err
	}
	floor, err := mark(state)
	if err != nil {
		return Wake{}, err
	}
	if last = max(last, floor); last == math.MaxInt64 {
		return Wake{}, errcode.New(errcode.SequenceExhausted, "wake queue %q is at queue-seq %d and cannot advance", display, last)
	}
	w := Wake{Time: time.Now().Unix(), Seq: last + 1, Kind: kind, Key: key, Payload: payload}
	line := w.Line()
	if torn {
		// Terminate the torn tail so that it can never parse: a tail cut
		// after its fourth tab would otherwise become a complete wake with a
		// truncated key or payload and this wake's queue-seq. Five more tabs
		// give any tail at least six fields, and Parse wants exactly five.
		line = tornEnd + line
	}
	if _, err := f.WriteString(line); err != nil {
		return Wake{}, errcode.Wrap(errcode.Internal, err, "append to wake queue %q", display)
	}
	if err := f.Sync(); err != nil {
		return Wake{}, errcode.Wrap(errcode.Internal, err, "sync wake queue %q", display)
	}
	return w, nil
}

func lock(fd int) error {
	for {
		err := unix.Flock(fd, unix.LOCK_EX)
		if err != unix.EINTR {
			return err
		}
	}
}

// earlierLock is the earlier Firstmate implementation's lock beside its
// queue. fm never makes it, and fm home import removes it (after it made the
// queue 0600, its first step).
const earlierLock = ".wake-queue.lock"

// earlier turns err, the refusal of the queue at path, into
// home-import-needed when it is the mode and the earlier implementation's
// lock lies beside the queue (locked): that queue is the earlier
// implementation's, and fm home import converts it.
func earlier(err error, locked bool, path string) error {
	if !locked || !errcode.Is(err, errcode.ModeUnsafe) {
		return err
	}
	return errcode.New(errcode.HomeImportNeeded, "wake queue %q is not 0600 and the earlier Firstmate implementation's %s lies beside it; this home was written by the earlier Firstmate implementation: stop it, then run fm home import", path, earlierLock)
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
	case st.Mode&0o7777 != 0o600:
		return 0, errcode.New(errcode.ModeUnsafe, "wake queue %q has mode %04o; it must be 0600 (chmod 600)", f.Name(), st.Mode&0o7777)
	}
	return st.Size, nil
}

// lastSeq finds the queue-seq of the last well-formed line and whether the
// file ends in a torn (unterminated) line. It reads only the tail unless the
// tail holds no well-formed line.
func lastSeq(f *os.File, size int64) (seq int64, torn bool, err error) {
	if size == 0 {
		return 0, false, nil
	}
	for window := int64(4 * maxLine); ; window *= 4 {
		off := max(size-window, 0)
		buf := make([]byte, size-off)
		if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
			return 0, false, errcode.Wrap(errcode.Internal, err, "read wake queue %q", f.Name())
		}
		torn = buf[len(buf)-1] != '\n'
		lines := bytes.Split(buf[:bytes.LastIndexByte(buf, '\n')+1], []byte{'\n'})
		// lines[0] may be a partial line when off > 0; Parse refuses it
		// or, at worst, it is a suffix that does not parse as five fields.
		for i := len(lines) - 1; i >= 0; i-- {
			if off > 0 && i == 0 {
				break
			}
			if w, ok := Parse(string(lines[i])); ok {
				return w.Seq, torn, nil
			}
		}
		if off == 0 {
			return 0, torn, nil
		}
	}
}

// Parse reads one stored line (without its newline). ok is false for
// anything that is not exactly five well-formed fields.
func Parse(line string) (w Wake, ok bool) {
	f := strings.Split(line, "\t")
	if len(f) != 5 || !kindRe.MatchString(f[2]) {
		return Wake{}, false
	}
	t, err1 := strconv.ParseInt(f[0], 10, 64)
	s, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil || s < 1 {
		return Wake{}, false
	}
	return Wake{Time: t, Seq: s, Kind: f[2], Key: f[3], Payload: f[4]}, true
}

// List returns the wakes of the queue in the state root stateDir whose
// queue-seq is greater than after. An absent queue is empty; List never
// creates anything.
func List(stateDir string, after int64) ([]Wake, error) {
	f, err := open(stateDir)
	if f == nil {
		return nil, err
	}
	defer f.Close()
	ws, _, err := readFrom(f, 0, after)
	return ws, err
}

// open opens the queue for reading; (nil, nil) means it does not exist. The
// open never blocks and never follows a link (O_NONBLOCK|O_NOFOLLOW): a FIFO
// or device planted at the queue's name would otherwise block the open until
// a writer came, which no signal interrupts. check then requires a regular
// file on the open descriptor before anything is read.
func open(stateDir string) (*os.File, error) {
	path := filepath.Join(stateDir, FileName)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case err == unix.ENOENT:
		return nil, nil
	case err == unix.ELOOP:
		return nil, errcode.New(errcode.LinkUnsafe, "wake queue %q is a symlink; remove it", path)
	case err != nil:
		return nil, errcode.Wrap(errcode.Internal, err, "open wake queue %q", path)
	}
	f := os.NewFile(uintptr(fd), path)
	if _, err := check(f); err != nil {
		f.Close()
		_, lerr := os.Lstat(filepath.Join(stateDir, earlierLock))
		return nil, earlier(err, lerr == nil, path)
	}
	return f, nil
}

// readFrom reads the complete lines from offset on and returns the wakes with
// queue-seq greater than after, and the offset just past the last complete
// line (an unterminated tail is left for the next read).
func readFrom(f *os.File, offset, after int64) ([]Wake, int64, error) {
	r := bufio.NewReaderSize(io.NewSectionReader(f, offset, 1<<62), 64*1024)
	var out []Wake
	for {
		line, err := r.ReadString('\n')
		if err == io.EOF {
			return out, offset, nil
		}
		if err != nil {
			return nil, offset, errcode.Wrap(errcode.Internal, err, "read wake queue %q", f.Name())
		}
		offset += int64(len(line))
		if w, ok := Parse(strings.TrimSuffix(line, "\n")); ok && w.Seq > after {
			out = append(out, w)
		}
	}
}

// PollInterval is how often Watch looks for new wakes.
const PollInterval = 100 * time.Millisecond

// Watch calls emit for every wake with queue-seq greater than after, first
// those already queued and then each new one as it is appended, until ctx is
// done (it then returns nil) or emit fails. It polls the queue's size every
// PollInterval, which keeps it independent of the file system's notification
// support; a queue replaced by a new file is re-read from its start, still
// skipping every seq already emitted.
func Watch(ctx context.Context, stateDir string, after int64, emit func(Wake) error) error {
	var (
		f      *os.File
		offset int64
		ino    uint64
	)
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		if f == nil {
			var err error
			if f, err = open(stateDir); err != nil {
				return err
			}
			offset, ino = 0, inode(f)
		}
		if f != nil {
			ws, next, err := readFrom(f, offset, after)
			if err != nil {
				return err
			}
			offset = next
			for _, w := range ws {
				if err := emit(w); err != nil {
					return err
				}
				after = w.Seq
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if f != nil && replaced(filepath.Join(stateDir, FileName), ino) {
			f.Close()
			f = nil
		}
	}
}

func inode(f *os.File) uint64 {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return 0
	}
	return st.Ino
}

func replaced(path string, ino uint64) bool {
	var st unix.Stat_t
	err := unix.Lstat(path, &st)
	return errors.Is(err, unix.ENOENT) || (err == nil && st.Ino != ino)
}
