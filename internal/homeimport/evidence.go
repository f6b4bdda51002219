package homeimport

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/shown"
)

// Evidence of used sequences.
//
// The earlier implementation kept no counter, and its results are removed by
// hand once handled, so the inbox alone understates what was captured. A
// sequence is used, and the source's counter is raised to at least it
// [CAP-1], when anything the import reads says so:
//   - an inbox entry <id>.<seq>.result or .handled;
//   - the key procevent:<id>:<seq> of any line of the wake queue with at
//     least five tab-separated fields, whatever its kind, wherever it stands
//     in the queue, well-formed or not, and in a last line cut short once its
//     key is whole (followed by a tab): the earlier implementation appended
//     the wake after the capture, so a key proves the capture;
//   - a watcher marker .seen-procevent-<hex of the key>, read before the
//     import removes it.
//
// The id need not be registered or have any inbox entry left: its counter
// is raised all the same, so a later registration of that id continues
// above. A counter only rises. A sequence past procevent.MaxSeq is never
// used: the import refuses with sequence-exhausted and names where it read
// it, before any change; Pending (doctor's look) leaves it to fm's own
// readers, which refuse such a source with sequence-exhausted. Anything
// else (a key of another shape, an id fm would refuse) proves nothing about
// a sequence fm can use and is left alone.

// keyPrefix begins every key of a capture's wake.
const keyPrefix = "procevent:"

// sawKey records the sequence the wake key names, if it is a capture's key.
func (p *plan) sawKey(key, where string) {
	rest, ok := strings.CutPrefix(key, keyPrefix)
	i := strings.LastIndexByte(rest, ':')
	if ok && i >= 0 {
		p.sawSeq(rest[:i], rest[i+1:], where)
	}
}

// sawSeq records that source id used the sequence written as digits (one
// past the bound: p.pastBound).
func (p *plan) sawSeq(id, digits, where string) {
	if digits == "" || strings.Trim(digits, "0123456789") != "" || protocol.CheckSourceID(id) != nil {
		return
	}
	seq, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || seq > procevent.MaxSeq {
		if p.pastBound == nil {
			p.pastBound = errcode.New(errcode.SequenceExhausted, "%s names sequence %s of source %q, past the last sequence %d: fm never uses it and cannot count past it; remove that entry, then run fm home import again",
				where, shown.Token(digits), id, int64(procevent.MaxSeq))
		}
		return
	}
	if p.high == nil {
		p.high = map[string]int64{}
	}
	p.high[id] = max(p.high[id], seq)
}

// sawMarker records the key of a watcher marker named n (without its
// directory), if its suffix is the hex of a capture's key.
func (p *plan) sawMarker(n, where string) {
	if key, err := hex.DecodeString(strings.TrimPrefix(n, markerPrefix)); err == nil {
		p.sawKey(string(key), where)
	}
}

// markerPrefix begins the name of the earlier implementation's watcher
// markers in the state root.
const markerPrefix = ".seen-procevent-"

// scanQueue records the key of every line of the wake queue at path (see
// "Evidence of used sequences"), reading it through a fixed buffer: a line
// longer than the buffer is judged by its first part only.
func (p *plan) scanQueue(path string) error {
	f, err := fsutil.OpenNoFollow(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64*1024)
	first := true
	for line := 1; ; {
		b, err := r.ReadSlice('\n')
		if err != nil && err != io.EOF && err != bufio.ErrBufferFull {
			return errcode.Wrap(errcode.Internal, err, "read wake queue %s", path)
		}
		if fields := bytes.SplitN(b, []byte{'\t'}, 5); first && len(fields) == 5 {
			p.sawKey(string(fields[3]), fmt.Sprintf("wake queue %s line %d", path, line))
		}
		switch err {
		case io.EOF:
			return nil
		case bufio.ErrBufferFull:
			first = false
		default:
			first = true
			line++
		}
	}
}

// sawEntry records the sequence of the inbox entry n when it is a result or
// a handled marker: <id>.<digits>.result or .handled.
func (p *plan) sawEntry(n string) {
	for _, s := range []string{resultSuffix, handledSuffix} {
		if rest, ok := strings.CutSuffix(n, s); ok {
			if dot := strings.LastIndexByte(rest, '.'); dot > 0 {
				p.sawSeq(rest[:dot], rest[dot+1:], "inbox entry "+filepath.Join(p.h.Inbox(), n))
			}
		}
	}
}
