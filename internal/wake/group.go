package wake

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
)

// Group commit.
//
// fm procevent serve appends one wake per capture from hundreds of
// goroutines at once, and an append's fixed cost (the lock with its orphan
// look-up, the mark rewritten and fsynced, the fsync of the queue) dwarfs
// its line. So the appends of one process to one queue are combined: an
// append joins the pending wakes of its queue, and the queue's committer
// takes all of them as one batch, for which it takes the lock once, reads
// the mark and the tail once, raises the mark once (to the batch's last
// queue-seq), writes every line in one write(2) and fsyncs once. Wakes that
// arrive while a batch is in flight form the next batch. Nothing ever waits
// for company: the first append of an idle queue starts the committer at
// once, so a lone append costs what it did before batching.
//
// Every rule of a single append holds for each wake of a batch: queue-seqs
// are handed out in the batch's order, one more each than the greater of
// the mark and the last line; the mark is durable before any line is
// written; a torn tail is terminated first; the append returns only once its
// line and the mark are fsynced. Wakes past MaxSeq get sequence-exhausted
// and are not written; the ones before them are. The lock is the same
// fsutil.Lock every other writer (fm wake compact, another process's
// append) takes, so a batch is one append to them.
//
// Cancellation. A wake whose context ends before its batch holds the
// queue's lock (while it waits behind a batch in flight, or while its batch
// waits for another process's lock) is withdrawn: it is not written, and
// its append returns process-failed wrapping fsutil.ErrInterrupted, at once.
// Once its batch holds the lock the wake is sealed: it is written and its
// append returns it (or the batch's error), whatever its context does. The
// line between the two is drawn under one mutex, so every append is one or
// the other. A batch whose wakes were all withdrawn stops waiting for the
// lock and writes nothing.
//
// Batches are per queue: a queue is the state directory's device and inode
// (any handle pinned to that directory writes the same files) and the name
// the caller opened it by (which errors show). The committer writes through
// its own duplicate of the first caller's handle, so a caller that withdraws
// and closes its handle never pulls the directory from under a batch.

// request is one wake waiting to be appended.
type request struct {
	kind, key, payload string
	q                  *queue
	b                  *batch // the batch it is in; nil while pending
	withdrawn          bool
	w                  Wake
	err                error
	done               chan struct{} // closed once w or err is final
}

// batch is the wakes one lock acquisition writes.
type batch struct {
	live   int                // members not withdrawn
	sealed bool               // the lock is held: no member withdraws any more
	stop   context.CancelFunc // ends the lock wait: every member withdrew
}

type queueKey struct {
	dev, ino uint64
	name     string
}

// queue is the pending wakes of one queue; it exists while its committer
// runs.
type queue struct {
	key     queueKey
	pending []*request
}

// queues guards every queue, request and batch of the process.
var queues struct {
	sync.Mutex
	m map[queueKey]*queue
}

// batchSealed is called with the number of wakes a batch will write once it
// holds the lock (a test cancels contexts there).
var batchSealed = func(n int) {}

// enqueue adds the wake r to the queue of the state directory state,
// starting the queue's committer when none runs.
func enqueue(state *os.File, r *request) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(state.Fd()), &st); err != nil {
		return errcode.Wrap(errcode.Internal, err, "stat state directory %q", state.Name())
	}
	k := queueKey{st.Dev, st.Ino, state.Name()}
	queues.Lock()
	defer queues.Unlock()
	if q := queues.m[k]; q != nil {
		r.q = q
		q.pending = append(q.pending, r)
		return nil
	}
	fd, err := unix.FcntlInt(state.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "duplicate the handle of state directory %q", state.Name())
	}
	q := &queue{key: k, pending: []*request{r}}
	r.q = q
	if queues.m == nil {
		queues.m = map[queueKey]*queue{}
	}
	queues.m[k] = q
	go q.run(os.NewFile(uintptr(fd), state.Name()))
	return nil
}

// wait returns r's wake once it is written, or withdraws r when ctx ends
// before r's batch holds the lock (see Cancellation above).
func (r *request) wait(ctx context.Context) (Wake, error) {
	select {
	case <-r.done:
		return r.w, r.err
	case <-ctx.Done():
	}
	queues.Lock()
	switch {
	case r.b == nil:
		r.q.pending = slices.DeleteFunc(r.q.pending, func(p *request) bool { return p == r })
	case !r.b.sealed:
		r.withdrawn = true
		if r.b.live--; r.b.live == 0 {
			r.b.stop()
		}
	default:
		queues.Unlock()
		<-r.done
		return r.w, r.err
	}
	queues.Unlock()
	return Wake{}, fsutil.Interrupted(ctx, "waiting for the wake queue %q, which another writer holds", filepath.Join(r.q.key.name, FileName))
}

// run commits the queue's pending wakes, batch after batch, until none is
// left; state is the committer's own handle of the state directory.
func (q *queue) run(state *os.File) {
	defer state.Close()
	for {
		queues.Lock()
		members := q.pending
		q.pending = nil
		if len(members) == 0 {
			delete(queues.m, q.key)
			queues.Unlock()
			return
		}
		ctx, stop := context.WithCancel(context.Background())
		b := &batch{live: len(members), stop: stop}
		for _, r := range members {
			r.b = b
		}
		queues.Unlock()
		b.commit(ctx, state, members)
		stop()
	}
}

// commit takes the lock for the batch b, seals it, writes its members that
// were not withdrawn and hands each its wake or the batch's error.
func (b *batch) commit(ctx context.Context, state *os.File, members []*request) {
	l, err := openLocked(ctx, state, true)
	queues.Lock()
	b.sealed = true
	members = slices.DeleteFunc(members, func(r *request) bool { return r.withdrawn })
	queues.Unlock()
	if len(members) > 0 {
		batchSealed(len(members))
		if err == nil {
			err = write(state, l.File(), members)
		}
	}
	l.Release()
	for _, r := range members {
		if err != nil && r.err == nil {
			r.w, r.err = Wake{}, err
		}
		close(r.done)
	}
}

// write appends the wakes rs to the locked queue f of state: one mark, one
// write, one fsync. A wake past MaxSeq gets its own sequence-exhausted
// error; the returned error is every other wake's.
func write(state, f *os.File, rs []*request) error {
	size, err := check(f)
	if err != nil {
		return err
	}
	first, fit, torn, err := next(state, f, size, len(rs))
	if err != nil {
		return err
	}
	for _, r := range rs[fit:] {
		r.err = exhausted(filepath.Join(state.Name(), FileName), MaxSeq)
	}
	rs = rs[:fit]
	if err := writeMark(state, first+int64(fit-1)); err != nil {
		return err
	}
	now := time.Now().Unix()
	var buf []byte
	if torn {
		// Terminate the torn tail so that it can never parse: a tail cut
		// after its fourth tab would otherwise become a complete wake with a
		// truncated key or payload and the next wake's queue-seq. Five more
		// tabs give any tail at least six fields, and Parse wants exactly
		// five.
		buf = append(buf, tornEnd...)
	}
	for i, r := range rs {
		r.w = Wake{Time: now, Seq: first + int64(i), Kind: r.kind, Key: r.key, Payload: r.payload}
		buf = append(buf, r.w.Line()...)
	}
	if _, err := f.Write(buf); err != nil {
		return errcode.Wrap(errcode.Internal, err, "append to wake queue %q", f.Name())
	}
	if err := f.Sync(); err != nil {
		return errcode.Wrap(errcode.Internal, err, "sync wake queue %q", f.Name())
	}
	return nil
}
