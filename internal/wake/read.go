package wake

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// Reading the queue.
//
// Every reader takes each line on its own: a line that is not one
// well-formed wake (a torn append, an edit, a line longer than any wake) is
// a bad line, skipped and counted, and reading goes on with the next line,
// so one bad line never hides the wakes after it. Lines are read through a
// fixed buffer: a line longer than maxLine is skipped without being held in
// memory, so no reader's memory depends on what the file holds. `fm doctor`
// reports the bad lines; Compact drops them.

// readBuf is the size of a reader's buffer, larger than any good line.
const readBuf = 64 * 1024

// tailBlock is lastSeq's read size: a few lines' worth.
const tailBlock = 4096

// scan calls fn with each well-formed wake of f from offset on, in file
// order, with its line as stored (newline included; valid only during the
// call) and the offset just past it. It returns the offset just past the last complete line (an
// unterminated tail is left for a later read) and the number of bad lines.
func scan(f *os.File, offset int64, fn func(w Wake, line []byte, end int64) error) (int64, int, error) {
	r := bufio.NewReaderSize(io.NewSectionReader(f, offset, 1<<62), readBuf)
	bad, long := 0, false
	for {
		line, err := r.ReadSlice('\n')
		switch {
		case err == bufio.ErrBufferFull:
			offset += int64(len(line))
			long = true
			continue
		case err == io.EOF:
			return offset, bad, nil
		case err != nil:
			return offset, bad, errcode.Wrap(errcode.Internal, err, "read wake queue %q", f.Name())
		}
		offset += int64(len(line))
		w, ok := Parse(string(line[:len(line)-1]))
		if long || !ok {
			bad, long = bad+1, false
			continue
		}
		if err := fn(w, line, offset); err != nil {
			return offset, bad, err
		}
	}
}

// List returns the wakes of the queue in the state root stateDir whose
// queue-seq is greater than after, in file order. An absent queue is empty;
// List never creates anything.
func List(stateDir string, after int64) ([]Wake, error) {
	var out []Wake
	err := Each(stateDir, after, func(w Wake) error {
		out = append(out, w)
		return nil
	})
	return out, err
}

// Each is List without holding the wakes: it calls fn with each in turn.
func Each(stateDir string, after int64, fn func(Wake) error) error {
	f, _, err := open(stateDir)
	if f == nil {
		return err
	}
	defer f.Close()
	_, _, err = scan(f, 0, func(w Wake, _ []byte, _ int64) error {
		if w.Seq > after {
			return fn(w)
		}
		return nil
	})
	return err
}

// Stats describes a queue for `fm doctor`.
type Stats struct {
	Wakes   int   // well-formed lines
	Bad     int   // bad lines (see "Reading the queue")
	LastSeq int64 // the last well-formed line's queue-seq
	Mark    int64 // the high-water mark, 0 when there is none
}

// ReadStats reads the whole queue of the state root stateDir (in bounded
// memory) and its high-water mark. An error is one that stops every append:
// a queue or mark that breaks the private-file rule, a malformed mark, or a
// queue that cannot advance (sequence-exhausted).
func ReadStats(stateDir string) (Stats, error) {
	var st Stats
	dir, err := os.Open(stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, errcode.Wrap(errcode.Internal, err, "open state root %q", stateDir)
	}
	defer dir.Close()
	if st.Mark, err = readMark(dir); err != nil {
		return st, err
	}
	f, _, err := openAt(dir)
	if f == nil {
		return st, err
	}
	defer f.Close()
	_, st.Bad, err = scan(f, 0, func(w Wake, _ []byte, _ int64) error {
		st.Wakes++
		st.LastSeq = w.Seq
		return nil
	})
	if top := max(st.Mark, st.LastSeq); err == nil && top >= MaxSeq {
		err = exhausted(f.Name(), top)
	}
	return st, err
}

// Recent calls fn with the well-formed wakes of the queue in the state root
// stateDir newest first (reading the file backwards through a fixed buffer)
// until fn returns false or the queue's start is reached. A caller that
// stops at the first wake older than what it needs reads only the queue's
// recent tail, however long its history.
func Recent(stateDir string, fn func(Wake) bool) error {
	f, size, err := open(stateDir)
	if f == nil {
		return err
	}
	defer f.Close()
	_, err = backwards(f, size, fn)
	return err
}

// backwards calls fn with the well-formed wakes of f (of size size) from the
// last to the first, until fn returns false; torn reports whether f ends in
// an unterminated line, which is never a wake.
func backwards(f *os.File, size int64, fn func(Wake) bool) (torn bool, err error) {
	return backwardsBy(f, size, readBuf, fn)
}

// backwardsBy is backwards reading block bytes at a time.
func backwardsBy(f *os.File, size, block int64, fn func(Wake) bool) (torn bool, err error) {
	if size == 0 {
		return false, nil
	}
	var last [1]byte
	if _, err := f.ReadAt(last[:], size-1); err != nil {
		return false, errcode.Wrap(errcode.Internal, err, "read wake queue %q", f.Name())
	}
	torn = last[0] != '\n'
	// rest is the end of a line whose start lies before pos, newline
	// included. skip says that the line ending rest is not to be read: the
	// torn tail, or a line too long to be a wake (then rest holds only its
	// newline, so memory stays bounded).
	pos, rest, skip := size, []byte(nil), torn
	if torn {
		rest = []byte{'\n'}
	}
	// One buffer for the whole read: a block, then the carried rest.
	window := make([]byte, block+maxLine+1)
	carry := make([]byte, 0, maxLine+1)
	for pos > 0 {
		n := min(block, pos)
		pos -= n
		carry = append(carry[:0], rest...)
		if _, err := f.ReadAt(window[:n], pos); err != nil && err != io.EOF {
			return torn, errcode.Wrap(errcode.Internal, err, "read wake queue %q", f.Name())
		}
		buf := append(window[:n], carry...)
		end := len(buf) // buf[:end] ends with a newline
		for {
			start := bytes.LastIndexByte(buf[:end-1], '\n') + 1
			if start == 0 && pos > 0 {
				break // this line starts in an earlier block
			}
			line := buf[start : end-1]
			if !skip {
				if w, ok := Parse(string(line)); ok && !fn(w) {
					return torn, nil
				}
			}
			skip = false
			if start == 0 {
				return torn, nil
			}
			end = start
		}
		rest = buf[:end]
		if len(rest) > maxLine+1 {
			rest, skip = []byte{'\n'}, true
		}
	}
	return torn, nil
}

// LastSeq is the queue-seq of the last well-formed line of the open queue
// file f (0 for none), read backwards from its end: the highest queue-seq of
// a queue, which only appends growing queue-seqs. It applies no file rule:
// `fm home import` reads the earlier implementation's queue with it before
// it makes that file private.
func LastSeq(f *os.File) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, errcode.Wrap(errcode.Internal, err, "stat wake queue %q", f.Name())
	}
	seq, _, err := lastSeq(f, st.Size())
	return seq, err
}

// lastSeq finds the queue-seq of the last well-formed line of f (of size
// size; 0 when there is none) and whether f ends in a torn line. It reads
// tailBlock bytes at a time, not readBuf: every append and every poll's
// Exhausted check ask, and the answer is in the last line, so one small
// read usually finds it, where a 64 KiB read (and a 66 KiB buffer) was
// spent on one short line.
func lastSeq(f *os.File, size int64) (seq int64, torn bool, err error) {
	torn, err = backwardsBy(f, size, tailBlock, func(w Wake) bool {
		seq = w.Seq
		return false
	})
	return seq, torn, err
}

// PollInterval is how often Watch looks for new wakes.
const PollInterval = 100 * time.Millisecond

// Watch calls emit for every wake with queue-seq greater than after, first
// those already queued and then each new one as it is appended, until ctx is
// done (it then returns nil) or emit fails. It polls the queue every
// PollInterval, which keeps it independent of the file system's notification
// support. It follows the file it has open by offset, and emits every new
// well-formed line there. A queue replaced by another file (compacted,
// removed and recreated) or cut short in place (truncated, rewritten) is
// read again from its start, emitting only the wakes with a queue-seq
// greater than the last one emitted: compaction keeps queue-seqs, and the
// high-water mark gives every later wake a greater one, so nothing is
// emitted twice and nothing new is missed.
func Watch(ctx context.Context, stateDir string, after int64, emit func(Wake) error) error {
	var (
		f       *os.File
		offset  int64
		ino     uint64
		tail    []byte // the last wake read, which must still end at tailEnd
		tailEnd int64
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
			if f, _, err = open(stateDir); err != nil {
				return err
			}
			offset, tail, tailEnd, ino = 0, nil, 0, inode(f)
		}
		if f != nil {
			if !continues(f, offset, tail, tailEnd) {
				offset, tail, tailEnd = 0, nil, 0
			}
			// A fresh read skips what was emitted before; a continued
			// one emits every new line, so a line with a high queue-seq
			// never hides the lines after it; a lower one read on (a
			// hand edit) is emitted but never lowers the floor, so a
			// later fresh read emits nothing twice.
			fresh, floor := offset == 0, after
			next, _, err := scan(f, offset, func(w Wake, line []byte, end int64) error {
				tail, tailEnd = append(tail[:0], line...), end
				if fresh && w.Seq <= floor {
					return nil
				}
				after = max(after, w.Seq)
				return emit(w)
			})
			offset = next
			if err != nil {
				return err
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

// continues reports whether the open queue f still reaches offset and still
// holds, just before tailEnd, the wake tail that was read last: false when
// the file was truncated or rewritten in place.
func continues(f *os.File, offset int64, tail []byte, tailEnd int64) bool {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Size < offset {
		return false
	}
	buf := make([]byte, len(tail))
	_, err := f.ReadAt(buf, tailEnd-int64(len(tail)))
	return err == nil && bytes.Equal(buf, tail)
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
