package wake

import (
	"bufio"
	"context"
	"os"
	"path/filepath"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
)

// Compaction.
//
// Compact rewrites the queue to what its consumers still need: the last
// `window` well-formed wakes, and for every key that keep accepts (the
// procevent layer passes the keys of the results that are still unhandled)
// the latest wake with that key. Everything else goes, bad lines included;
// kept lines stay byte for byte, in their order, with their queue-seqs.
//
// It runs under the queue's lock, so no wake is appended meanwhile, and it is
// crash-safe: the new queue is written to compactTemp, fsynced, made 0600,
// the high-water mark is raised to the queue's last queue-seq if it was
// below it (a queue written before the mark existed), the new file is
// renamed over the queue and the directory fsynced. A crash at any point
// leaves the old queue or the new one, never a mix; a stale compactTemp is
// removed by the next Compact. Writers waiting for the lock find the name
// replaced and lock the new file (openLocked); Watch re-reads a replaced
// queue from its start past the last queue-seq it emitted.

// compactTemp is the new queue while Compact writes it.
const compactTemp = FileName + ".compact"

// CompactResult says what Compact did.
type CompactResult struct {
	Kept, Dropped int // lines kept and dropped (bad lines are dropped)
	Mark          int64
}

// Compact compacts the queue in the state directory state (see above). An
// absent queue is left absent.
func Compact(ctx context.Context, state *os.File, window int, keep func(key string) bool) (CompactResult, error) {
	var res CompactResult
	l, err := openLocked(ctx, state, false, nil)
	if l == nil {
		return res, err
	}
	defer l.Release()
	f := l.File()
	if _, err := check(f); err != nil {
		return res, err
	}
	// First pass: how many wakes, the last queue-seq, and where the latest
	// wake of each kept key ends.
	total, last := 0, int64(0)
	latest := map[string]int64{}
	if _, _, err := scan(f, 0, func(w Wake, _ []byte, end int64) error {
		total++
		last = w.Seq
		if keep(w.Key) {
			latest[w.Key] = end
		}
		return nil
	}); err != nil {
		return res, err
	}
	if res.Mark, err = readMark(state); err != nil {
		return res, err
	}
	if last > res.Mark {
		if err := writeMark(state, last); err != nil {
			return res, err
		}
		res.Mark = last
	}
	// Second pass: write the lines to keep.
	out, err := fsutil.NewAt(state, fsutil.NewOptions{Temp: compactTemp, Stale: true})
	if err != nil {
		return res, errcode.Wrap(errcode.Internal, err, "create %q", filepath.Join(state.Name(), compactTemp))
	}
	defer out.Abort()
	bw := bufio.NewWriterSize(out, readBuf)
	i := 0
	_, bad, err := scan(f, 0, func(w Wake, line []byte, end int64) error {
		i++
		if i > total-window || latest[w.Key] == end {
			res.Kept++
			_, err := bw.Write(line)
			return err
		}
		res.Dropped++
		return nil
	})
	res.Dropped += bad
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = out.Replace(FileName)
	}
	if err != nil {
		return res, errcode.Wrap(errcode.Internal, err, "compact wake queue %q", f.Name())
	}
	return res, nil
}
