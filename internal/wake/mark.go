package wake

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
)

// The high-water mark.
//
// <state>/.wake-queue.seq holds the last queue-seq Append gave, as decimal
// text and a newline ("42\n"; a reader also takes it without the newline),
// in a private 0600 file. Append raises it, under the queue's lock, before it
// writes the line, and Compact never lowers it, so the mark is at least every
// queue-seq ever written and the next queue-seq, one more than the greater of
// the mark and the queue's last line, exceeds every earlier one even after
// the queue file was removed, truncated or compacted. The mark is replaced
// whole: written to markTemp, fsynced, renamed over the mark, and the
// directory fsynced; markTemp is only ever touched under the queue's lock, so
// a writer killed midway leaves at worst a stale markTemp that the next
// writer removes. What cannot be removed there (a planted directory, a mount
// point) is left alone and the mark written as an unnamed file instead, so
// that it stops no append.
//
// The mark's file is never reused (fsutil: "Spare files"), though a serve
// raising it at every group commit frees an inode each time: the file is
// documented to operators, whose scripts (and an earlier implementation's
// readers) read it without the lock that a reused file needs, and would now
// and then read one half rewritten (the hostile review saw it once in 14
// million plain reads).

// MarkName is the high-water mark's name inside the state root.
const MarkName = ".wake-queue.seq"

// MaxSeq is the greatest queue-seq: queue-seqs run from 1 to 2^63-1.
const MaxSeq = math.MaxInt64

const (
	markTemp = MarkName + ".new"
	maxMark  = 32
)

// readMark returns the high-water mark in state, 0 when there is none.
func readMark(state *os.File) (int64, error) {
	data, err := fsutil.ReadPrivateAt(state, MarkName, maxMark)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return ParseMark(filepath.Join(state.Name(), MarkName), string(data))
}

// ParseMark parses the mark's text read from path: decimal digits, an
// optional newline.
func ParseMark(path, text string) (int64, error) {
	digits := strings.TrimSuffix(text, "\n")
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, errcode.New(errcode.SchemaInvalid, "wake queue high-water mark %q must hold one decimal queue-seq; restore it, or write into it the highest queue-seq in %s", path, FileName)
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, errcode.New(errcode.SequenceExhausted, "wake queue high-water mark %q holds %s, past the greatest queue-seq %d; the queue cannot advance: move %s and %s aside (consumers then resume with --after 0)", path, digits, int64(MaxSeq), FileName, MarkName)
	}
	return n, nil
}

// FormatMark is the mark's text for seq.
func FormatMark(seq int64) []byte { return []byte(strconv.FormatInt(seq, 10) + "\n") }

// writeMark durably makes seq the high-water mark in state. The caller holds
// the queue's lock.
func writeMark(state *os.File, seq int64) error {
	display := filepath.Join(state.Name(), MarkName)
	p, err := fsutil.NewAt(state, fsutil.NewOptions{Temp: markTemp, Stale: true})
	if err != nil {
		// markTemp holds what cannot be removed (a directory, a mount
		// point): an unnamed file, as every other file of fm is written.
		p, err = fsutil.NewAt(state, fsutil.NewOptions{})
	}
	if err == nil {
		if _, err = p.Write(FormatMark(seq)); err == nil {
			err = p.Replace(MarkName)
		}
		p.Abort()
	}
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "write wake queue high-water mark %q", display)
	}
	return nil
}
