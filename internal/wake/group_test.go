package wake

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
)

// markRenames counts, through inotify, the renames onto the high-water mark
// in dir from now on: one per mark write (a temporary file renamed over it).
// The kernel merges an event into an identical one still unread (the
// cookie is not compared), so the creations of the temporary files are
// watched too: they lie between two renames.
func markRenames(t *testing.T, dir string) (count func() int) {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Skipf("inotify: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_TO|unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}
	n := 0
	return func() int {
		buf := make([]byte, 64<<10)
		for {
			m, err := unix.Read(fd, buf)
			if err == unix.EAGAIN {
				return n
			}
			if err != nil {
				t.Fatal(err)
			}
			for off := 0; off+unix.SizeofInotifyEvent <= m; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
				if name == MarkName && ev.Mask&unix.IN_MOVED_TO != 0 {
					n++
				}
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}

// waitQueued waits until the committer of the queue of state runs and n
// wakes are pending, not yet in a batch.
func waitQueued(t *testing.T, state *os.File, n int) {
	t.Helper()
	k := queueKey{name: state.Name()}
	var st unix.Stat_t
	if err := unix.Fstat(int(state.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	k.dev, k.ino = st.Dev, st.Ino
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		queues.Lock()
		got := -1
		if q := queues.m[k]; q != nil {
			got = len(q.pending)
		}
		queues.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d wakes pending (-1: no committer), want %d", got, n)
		}
	}
}

// [WAKE-1]: concurrent appends of one process share one lock, one mark
// write, one write and one fsync per batch: 50 appends that queue while
// another process holds the queue are written as two batches (the one that
// took the lock first, and all that came while it waited), so the mark is
// renamed twice, not 50 times. Each append still gets its own wake: the
// queue-seqs are consecutive, each line is exactly the wake its append
// returned, and the mark is the last queue-seq.
func TestAppendGroupCommit(t *testing.T) {
	dir, state := stateDir(t)
	if _, err := Append(context.Background(), state, "check", "first", "p"); err != nil {
		t.Fatal(err)
	}
	renames := markRenames(t, dir)
	kill := holdQueue(t, dir)
	const n = 50
	got := make([]Wake, n)
	var wg sync.WaitGroup
	wg.Go(func() {
		var err error
		if got[0], err = Append(context.Background(), state, "check", "k0", "p0"); err != nil {
			t.Error(err)
		}
	})
	// The first append's batch waits for the holder; the others queue
	// behind it.
	waitQueued(t, state, 0)
	for i := 1; i < n; i++ {
		wg.Go(func() {
			var err error
			if got[i], err = Append(context.Background(), state, "check", fmt.Sprintf("k%d", i), fmt.Sprintf("p\t%d", i)); err != nil {
				t.Error(err)
			}
		})
	}
	waitQueued(t, state, n-1)
	kill()
	wg.Wait()
	if t.Failed() {
		return
	}
	ws, err := List(dir, 0)
	if err != nil || len(ws) != n+1 {
		t.Fatalf("List: %d wakes, %v", len(ws), err)
	}
	bySeq := map[int64]Wake{}
	for i, w := range got {
		if w.Key != fmt.Sprintf("k%d", i) || w.Payload != fmt.Sprintf("p %d", i) && i > 0 {
			t.Fatalf("append %d returned %+v", i, w)
		}
		bySeq[w.Seq] = w
	}
	for i, w := range ws[1:] {
		if w.Seq != int64(i+2) || bySeq[w.Seq] != w {
			t.Fatalf("line %d is %+v, its append returned %+v", i+2, w, bySeq[w.Seq])
		}
	}
	if got[0].Seq != 2 {
		t.Fatalf("the first batch's wake has queue-seq %d, want 2", got[0].Seq)
	}
	if mark, err := readMark(state); err != nil || mark != n+1 {
		t.Fatalf("mark %d %v, want %d", mark, err, n+1)
	}
	if r := renames(); r != 2 {
		t.Fatalf("the mark was written %d times for two batches", r)
	}
}

// [WAKE-1]: an append whose context ends while its wake waits (behind a
// batch in flight, or in a batch that waits for another process's lock)
// returns process-failed (fsutil.ErrInterrupted) at once and is never
// written; the wakes around it are written with consecutive queue-seqs. A
// batch whose wakes all withdrew stops waiting for the lock.
func TestAppendCancelWhileQueued(t *testing.T) {
	dir, state := stateDir(t)
	if _, err := Append(context.Background(), state, "check", "first", "p"); err != nil {
		t.Fatal(err)
	}
	kill := holdQueue(t, dir)
	type result struct {
		w   Wake
		err error
	}
	start := func(key string) (context.CancelFunc, chan result) {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		ch := make(chan result, 1)
		go func() {
			w, err := Append(ctx, state, "check", key, "p")
			ch <- result{w, err}
		}()
		return cancel, ch
	}
	interrupted := func(name string, ch chan result) {
		t.Helper()
		select {
		case r := <-ch:
			if !errcode.Is(r.err, errcode.ProcessFailed) || !errors.Is(r.err, fsutil.ErrInterrupted) || !errors.Is(r.err, context.Canceled) {
				t.Fatalf("%s: cancelled append returned %+v %v", name, r.w, r.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: a cancelled append did not return", name)
		}
	}

	// Alone: its batch waits for the holder; cancelled, it gives up the wait.
	cancel, ch := start("alone")
	waitQueued(t, state, 0)
	time.Sleep(50 * time.Millisecond)
	cancel()
	interrupted("alone", ch)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		queues.Lock()
		idle := len(queues.m) == 0
		queues.Unlock()
		if idle {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a batch whose every wake withdrew still waits for the lock")
		}
	}

	// Pending behind a waiting batch (c), and in a waiting batch (a); b and
	// d stay.
	cancelA, chA := start("a")
	waitQueued(t, state, 0)
	_, chB := start("b")
	waitQueued(t, state, 1)
	cancelC, chC := start("c")
	waitQueued(t, state, 2)
	_, chD := start("d")
	waitQueued(t, state, 3)
	cancelC()
	interrupted("c", chC)
	waitQueued(t, state, 2)
	// a was its batch's only wake: the batch stops waiting, and b and d
	// form the next one, which waits for the holder in its turn.
	cancelA()
	interrupted("a", chA)
	waitQueued(t, state, 0)
	select {
	case r := <-chB:
		t.Fatalf("b returned while the holder holds the queue: %+v %v", r.w, r.err)
	case r := <-chD:
		t.Fatalf("d returned while the holder holds the queue: %+v %v", r.w, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	kill()
	for i, ch := range []chan result{chB, chD} {
		r := <-ch
		if r.err != nil || r.w.Seq != int64(i+2) {
			t.Fatalf("wake %d after the holder: %+v %v", i, r.w, r.err)
		}
	}
	ws, err := List(dir, 0)
	if err != nil || len(ws) != 3 || ws[1].Key != "b" || ws[2].Key != "d" {
		t.Fatalf("queue: %+v %v", ws, err)
	}
	if mark, err := readMark(state); err != nil || mark != 3 {
		t.Fatalf("mark %d %v", mark, err)
	}
}

// [WAKE-1]: once its batch holds the lock a wake is sealed: a context that
// ends then changes nothing, the wake is written and its append returns it.
// A context already ended ends nothing that need not wait either: with the
// lock free at the first attempt the wake is written, as a lone append's
// was before batching.
func TestAppendSealedIgnoresCancel(t *testing.T) {
	dir, state := stateDir(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	batchSealed = func(int) { cancel() }
	t.Cleanup(func() { batchSealed = func(int) {} })
	w, err := Append(ctx, state, "check", "k", "p")
	if err != nil || w.Seq != 1 || ctx.Err() == nil {
		t.Fatalf("sealed append: %+v %v (ctx %v)", w, err, ctx.Err())
	}
	batchSealed = func(int) {}
	w2, err := Append(ctx, state, "check", "k2", "p")
	if err != nil || w2.Seq != 2 {
		t.Fatalf("append with an ended context and a free lock: %+v %v", w2, err)
	}
	if ws, err := List(dir, 0); err != nil || len(ws) != 2 || ws[0] != w || ws[1] != w2 {
		t.Fatalf("queue %+v %v", ws, err)
	}
}

// [WAKE-1]: a batch that would pass MaxSeq writes the wakes that fit, in
// order, and refuses the rest with sequence-exhausted; a torn tail is
// terminated once, before the batch.
func TestAppendBatchPastMaxSeq(t *testing.T) {
	dir, state := stateDir(t)
	queue := filepath.Join(dir, FileName)
	writeRaw(t, queue, "1\t3\tcheck\ta\tp\n17000\t4\tche")
	writeRaw(t, filepath.Join(dir, MarkName), fmt.Sprintf("%d\n", MaxSeq-2))
	kill := holdQueue(t, dir)
	var wg sync.WaitGroup
	first := make(chan error, 1)
	wg.Go(func() {
		_, err := Append(context.Background(), state, "check", "lead", "p")
		first <- err
	})
	waitQueued(t, state, 0)
	var mu sync.Mutex
	var ok []Wake
	var refused int
	for i := range 4 {
		wg.Go(func() {
			w, err := Append(context.Background(), state, "check", fmt.Sprint(i), "p")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok = append(ok, w)
			case errcode.Is(err, errcode.SequenceExhausted):
				refused++
			default:
				t.Error(err)
			}
		})
	}
	waitQueued(t, state, 4)
	kill()
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatalf("the first batch: %v", err)
	}
	if len(ok) != 1 || ok[0].Seq != MaxSeq || refused != 3 {
		t.Fatalf("second batch: written %+v, %d refused", ok, refused)
	}
	data, _ := os.ReadFile(queue)
	if strings.Count(string(data), tornEnd) != 1 || !strings.HasSuffix(string(data), ok[0].Line()) {
		t.Fatalf("queue %q", data)
	}
	if ws, _ := List(dir, 0); len(ws) != 3 || ws[1].Seq != MaxSeq-1 || ws[2] != ok[0] {
		t.Fatalf("listed %+v", ws)
	}
}

// [WAKE-1]: the committer writes through its own handle of the state
// directory: the caller whose append started it may withdraw and close its
// handle, and the descriptor number be reused for another directory, while
// later wakes of its queue are still being committed; they go to the
// queue's directory and nowhere else.
func TestAppendOutlivesCallersHandle(t *testing.T) {
	dir, state := stateDir(t)
	if _, err := Append(context.Background(), state, "check", "first", "p"); err != nil {
		t.Fatal(err)
	}
	kill := holdQueue(t, dir)
	first, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	withdrawn := make(chan error, 1)
	go func() {
		_, err := Append(ctx, first, "check", "withdrawn", "p")
		withdrawn <- err
	}()
	waitQueued(t, state, 0)
	done := make(chan error, 1)
	go func() {
		_, err := Append(context.Background(), state, "check", "kept", "p")
		done <- err
	}()
	waitQueued(t, state, 1)
	cancel()
	if err := <-withdrawn; !errcode.Is(err, errcode.ProcessFailed) {
		t.Fatalf("withdrawn append: %v", err)
	}
	fd := first.Fd()
	first.Close()
	other := t.TempDir()
	reuse, err := os.Open(other)
	if err != nil {
		t.Fatal(err)
	}
	defer reuse.Close()
	t.Logf("descriptor %d, reused as %d", fd, reuse.Fd())
	kill()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ws, err := List(dir, 0); err != nil || len(ws) != 2 || ws[1].Key != "kept" {
		t.Fatalf("queue %+v %v", ws, err)
	}
	if names, _ := os.ReadDir(other); len(names) != 0 {
		t.Fatalf("the other directory was written: %v", names)
	}
}
