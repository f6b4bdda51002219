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
// whole: written to markTemp, fsynced, exchanged with the mark
// (renameat2(RENAME_EXCHANGE), a rename over the mark where there is none),
// and the directory fsynced. markTemp is only ever touched under the queue's
// lock. The old mark stays there, and the next write reuses that file
// (fsutil.NewOptions.Reuse): a serve raising the mark at every group commit
// neither allocates nor frees an inode for it, which on ext4 without a
// journal every later create would pay for (fsutil: "Spare files"). A
// reader (readMark: fsutil.ReadPrivateAt) still reading that file makes the
// writer create a new one instead; a writer killed midway leaves at worst
// a markTemp holding part of a mark, which no one reads and the next
// writer overwrites. Whatever else is at markTemp is never opened (see
// fsutil's openSpare) but removed, and what cannot be removed (a planted
// directory, a mount point) is left there and the mark written as an
// unnamed file instead, so that it stops no append.

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
	p, err := fsutil.NewAt(state, fsutil.NewOptions{Temp: markTemp, Reuse: true})
	publish := (*fsutil.Pending).ExchangeLeaving
	if err != nil {
		// No earlier mark at markTemp, or none fit to reuse: a new file.
		p, err = fsutil.NewAt(state, fsutil.NewOptions{Temp: markTemp, Stale: true})
	}
	if err != nil {
		// markTemp holds what cannot be removed (a directory, a mount
		// point): an unnamed file, exchanged and the old mark unlinked,
		// as every other file of fm is written.
		p, err = fsutil.NewAt(state, fsutil.NewOptions{})
		publish = (*fsutil.Pending).Exchange
	}
	if err == nil {
		if _, err = p.Write(FormatMark(seq)); err == nil {
			err = publish(p, MarkName)
		}
		p.Abort()
	}
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "write wake queue high-water mark %q", display)
	}
	return nil
}
