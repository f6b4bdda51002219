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
// Cancellation. The context of an append ends it only while its wake has
// to wait, as it ended a lone append's wait for the lock before batching:
// a wake whose context ends while it waits behind a batch in flight, or in
// a batch whose first attempt found the lock held by another process, is
// withdrawn: it is not written, and its append returns process-failed
// wrapping fsutil.ErrInterrupted, at once. A wake whose batch took the lock
// at its first attempt, or whose batch holds the lock by now, is sealed: it
// is written and its append returns it (or the batch's error), whatever its
// context does. (A context that ends during that first attempt, which is
// bounded and never waits for a holder, is looked at once the attempt has
// ended; so is one of a wake pending while no batch is in flight, which is
// about to become the next batch.) The line is drawn under one mutex, so every append is one or the
// other, never both or neither. A batch whose wakes all withdrew stops
// waiting for the lock and writes nothing.
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
	live    int                // members not withdrawn
	waiting bool               // its first attempt found the lock held
	sealed  bool               // the lock is held: no member withdraws any more
	tried   chan struct{}      // closed once waiting or sealed
	stop    context.CancelFunc // ends the lock wait: every member withdrew
}

// settle marks b waiting or sealed, under queues' mutex, and closes tried
// the first time.
func (b *batch) settle(sealed bool) {
	if !b.waiting && !b.sealed {
		close(b.tried)
	}
	b.waiting, b.sealed = !sealed, sealed
}

type queueKey struct {
	dev, ino uint64
	name     string
}

// queue is the pending wakes of one queue; it exists while its committer
// runs.
type queue struct {
	key      queueKey
	pending  []*request
	inflight bool          // a batch is being committed
	formed   chan struct{} // closed when the pending wakes become a batch
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
	q := &queue{key: k, pending: []*request{r}, formed: make(chan struct{})}
	r.q = q
	if queues.m == nil {
		queues.m = map[queueKey]*queue{}
	}
	queues.m[k] = q
	go q.run(os.NewFile(uintptr(fd), state.Name()))
	return nil
}

// wait returns r's wake once it is written, or withdraws r when ctx ends
// while r waits (see Cancellation above).
func (r *request) wait(ctx context.Context) (Wake, error) {
	select {
	case <-r.done:
		return r.w, r.err
	case <-ctx.Done():
	}
	for {
		queues.Lock()
		b, q := r.b, r.q
		switch {
		case b == nil && !q.inflight: // about to become a batch
			formed := q.formed
			queues.Unlock()
			<-formed
			continue
		case b == nil: // behind the batch in flight
			q.pending = slices.DeleteFunc(r.q.pending, func(p *request) bool { return p == r })
		case b.sealed:
			queues.Unlock()
			<-r.done
			return r.w, r.err
		case b.waiting:
			r.withdrawn = true
			if b.live--; b.live == 0 {
				b.stop()
			}
		default: // the batch's first attempt at the lock
			queues.Unlock()
			<-b.tried
			continue
		}
		queues.Unlock()
		return Wake{}, fsutil.Interrupted(ctx, "waiting for the wake queue %q, which another writer holds", filepath.Join(r.q.key.name, FileName))
	}
}

// run commits the queue's pending wakes, batch after batch, until none is
// left; state is the committer's own handle of the state directory.
func (q *queue) run(state *os.File) {
	defer state.Close()
	queues.Lock()
	for len(q.pending) > 0 {
		members := q.pending
		q.pending = nil
		ctx, stop := context.WithCancel(context.Background())
		b := &batch{live: len(members), stop: stop, tried: make(chan struct{})}
		for _, r := range members {
			r.b = b
		}
		q.inflight = true
		close(q.formed)
		q.formed = make(chan struct{})
		queues.Unlock()
		q.commit(ctx, b, state, members)
		stop()
		queues.Lock()
	}
	delete(queues.m, q.key)
	queues.Unlock()
}

// commit takes the lock for the batch b, seals it, writes its members that
// were not withdrawn and hands each its wake or the batch's error. The
// batch is out of flight before any append returns, so wakes that come
// after it are not counted as waiting behind it.
func (q *queue) commit(ctx context.Context, b *batch, state *os.File, members []*request) {
	l, err := openLocked(ctx, state, true, func() {
		queues.Lock()
		b.settle(false)
		queues.Unlock()
	})
	queues.Lock()
	b.settle(true)
	members = slices.DeleteFunc(members, func(r *request) bool { return r.withdrawn })
	queues.Unlock()
	if len(members) > 0 {
		batchSealed(len(members))
		if err == nil {
			err = write(state, l.File(), members)
		}
	}
	l.Release()
	queues.Lock()
	q.inflight = false
	queues.Unlock()
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
