package procevent_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/wake"
)

const (
	maxSeq    = "9223372036854775807" // 2^63-1, the last queue-seq
	maxSrcSeq = "9007199254740991"    // 2^53-1, the last sequence of a source
)

// [CAP-1] [CAP-3]: a source sequence never wraps. A counter one short of
// the last sequence (2^53-1, the greatest a JSON meta carries exactly) gives
// the last sequence, which is captured, listed and handled like any other;
// then the source is refused with sequence-exhausted before anything is
// polled, whether the counter, a handled marker or a result name says the
// last sequence is used; a counter or an inbox name past it (up to past
// 2^63-1) is refused and reported by doctor, never skipped or wrapped.
func TestSourceSequenceNeverWraps(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		f.registerExt(id)
	}
	f.ok("procevent", "start", "s4") // creates the inbox
	counter := func(id, text string) { f.write(filepath.Join(f.h.Registrations(), id+".seq"), text, 0o600) }

	counter("s1", "9007199254740990\n")
	if out := f.ok("procevent", "start", "s1"); out != "captured: "+filepath.Join(f.h.Inbox(), "s1."+maxSrcSeq+".result")+"\n" {
		t.Fatalf("start at the last sequence printed %q", out)
	}
	if out := f.ok("procevent", "inbox"); !strings.Contains(out, "s1."+maxSrcSeq+".result") {
		t.Fatalf("inbox does not list the last sequence:\n%s", out)
	}
	if ws := f.wakes(); ws[len(ws)-1].Key != "procevent:s1:"+maxSrcSeq {
		t.Fatalf("the last sequence was not announced: %+v", ws)
	}
	f.ok("procevent", "handled", "s1", maxSrcSeq)
	if len(f.log("poll")) != 2 {
		t.Fatalf("poll log %v", f.log("poll"))
	}
	if _, errs, code := f.fm("procevent", "handled", "s1", maxSeq); code != 2 || !strings.HasPrefix(errs, "error[usage]") {
		t.Fatalf("handled past the last sequence: exit %d %s", code, errs)
	}
	polls := len(f.log("poll"))
	errs := f.fails("sequence-exhausted", "procevent", "start", "s1")
	if !strings.Contains(errs, "register it under a new source id") {
		t.Fatalf("the refusal does not say what to do: %s", errs)
	}

	// A handled marker of the last sequence, with no counter.
	f.write(filepath.Join(f.h.Inbox(), "s2."+maxSrcSeq+".handled"), "", 0o600)
	f.fails("sequence-exhausted", "procevent", "start", "s2")
	// An inbox name past the last sequence.
	f.write(filepath.Join(f.h.Inbox(), "s3.9223372036854775808.result"), "x", 0o600)
	f.fails("sequence-exhausted", "procevent", "start", "s3")
	// A counter past the last sequence.
	counter("s4", "9007199254740992\n")
	f.fails("sequence-exhausted", "procevent", "start", "s4")

	if n := len(f.log("poll")); n != polls {
		t.Fatalf("%d poll(s) ran for sources whose sequence cannot advance", n-polls)
	}
	for _, n := range f.inbox() {
		if strings.Contains(n, ".-") {
			t.Fatalf("a wrapped sequence was captured: %s", n)
		}
	}
	out, _, code := f.fm("doctor")
	if code != 1 || strings.Count(out, "[sequence-exhausted]") != 4 {
		t.Fatalf("doctor exit %d, want 4 sequence-exhausted findings:\n%s", code, out)
	}
}

// [WAKE-1] [CAP-2]: a wake queue that cannot advance (its last line or its
// high-water mark at 2^63-1) is refused with sequence-exhausted before the
// source is polled, so nothing is captured that could not be announced, and
// no append ever writes a queue-seq that readers skip. doctor reports it.
func TestWakeQueueExhaustedRefusesBeforePolling(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.ok("procevent", "start", "s1")
	queue := f.h.WakeQueue()
	q, err := os.OpenFile(queue, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(q, "%d\t%s\tcheck\tforged\tforged\n", time.Now().Unix(), maxSeq)
	q.Close()
	before := f.read(queue)
	polls := len(f.log("poll"))
	errs := f.fails("sequence-exhausted", "procevent", "start", "s1")
	if !strings.Contains(errs, "move .wake-queue and .wake-queue.seq aside") {
		t.Fatalf("the refusal does not say what to do: %s", errs)
	}
	f.fails("sequence-exhausted", "procevent", "reconcile", "--reannounce-after", "0")
	if f.read(queue) != before || len(f.log("poll")) != polls || len(f.inbox()) != 2 {
		t.Fatalf("an exhausted queue still polled, captured or appended; inbox %v", f.inbox())
	}
	if out := f.ok("wake", "list", "--after", "1"); !strings.Contains(out, "\t"+maxSeq+"\tcheck\tforged") {
		t.Fatalf("wake list hides the last line: %q", out)
	}
	out, _, code := f.fm("doctor")
	if code != 1 || !strings.Contains(out, "[sequence-exhausted]") {
		t.Fatalf("doctor exit %d:\n%s", code, out)
	}

	// The operator's fix: move both aside; the queue starts again at 1.
	os.Rename(queue, queue+".old")
	os.Rename(queue+".seq", queue+".seq.old")
	if out := f.ok("procevent", "start", "s1"); !strings.HasSuffix(out, "/s1.2.result\n") {
		t.Fatalf("start after the queue was moved aside: %q", out)
	}
	if ws := f.wakes(); len(ws) != 1 || ws[0].Seq != 1 {
		t.Fatalf("wakes after the fix: %+v", ws)
	}
}

// writeQueue writes prefix and then wakes from..to (unrelated keys, time
// now) straight into the home's queue, buffered, so a large history is
// quick to make.
func writeQueue(t *testing.T, path, prefix string, from, to int) {
	t.Helper()
	writeQueueAt(t, path, prefix, from, to, time.Now())
}

// writeQueueAt is writeQueue with the wakes' time at.
func writeQueueAt(t *testing.T, path, prefix string, from, to int, at time.Time) {
	t.Helper()
	q, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(q, 1<<20)
	w.WriteString(prefix)
	now := strconv.FormatInt(at.Unix(), 10)
	for i := from; i <= to; i++ {
		fmt.Fprintf(w, "%s\t%d\tcheck\tprocevent:old%d:%d\tcheck: procevent sig old%d %d\n", now, i, i%1000, i, i%1000, i)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
}

// [CAP-2] [WAKE-1]: a reconcile pass does not load the queue's history. With
// an unhandled result due for re-announcement and a queue of 200,000 lines
// (2,000,000 with FM_BIG_QUEUE=1), one `fm procevent reconcile` child's peak
// RSS stays under a bound that a pass holding the queue in memory exceeds.
// The worst case is measured: every line is younger than the interval and
// none is the result's, so the pass reads the whole queue (backwards,
// through a fixed buffer). The figures go to docs/performance.md.
func TestReconcileMemoryBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	tok := f.registerExt("s1")
	f.ok("procevent", "start", "s1")
	f.ok("procevent", "retire", "s1", "--if-owner", tok)
	n := 200_000
	if os.Getenv("FM_BIG_QUEUE") != "" {
		n = 2_000_000
	}
	// The capture an hour old, every wake younger than the interval.
	meta := filepath.Join(f.h.Inbox(), "s1.1.meta.json")
	m := regexp.MustCompile(`"captured_at":[0-9]+`)
	f.write(meta, m.ReplaceAllString(f.read(meta), fmt.Sprintf(`"captured_at":%d`, time.Now().Unix()-3600)), 0o600)
	writeQueue(t, f.h.WakeQueue(), "", 1, n)
	cmd := f.fmCmd("procevent", "reconcile", "--reannounce-after", "10m")
	begin := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(begin)
	if err != nil || !strings.Contains(string(out), "reannounced=1") {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss // KiB
	t.Logf("reconcile over %d wakes: %s, peak RSS %d KiB", n, took.Round(time.Millisecond), rss)
	if rss > 40*1024 {
		t.Fatalf("reconcile over %d wakes peaked at %d KiB RSS: it holds the queue in memory", n, rss)
	}
	if ws, _ := wake.List(f.h.State, int64(n)); len(ws) != 1 || ws[0].Seq != int64(n)+1 {
		t.Fatalf("the re-announcement: %+v", ws)
	}
	// The next pass finds the re-announcement at the tail and stops there;
	// a history older than the interval is not read past its last wake; and
	// doctor and compact read the whole queue in bounded memory too.
	run := func(what, want string, args ...string) {
		t.Helper()
		cmd := f.fmCmd(args...)
		begin := time.Now()
		out, _ := cmd.CombinedOutput()
		rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss
		t.Logf("%s: %s, peak RSS %d KiB", what, time.Since(begin).Round(time.Millisecond), rss)
		if !strings.Contains(string(out), want) || rss > 40*1024 {
			t.Fatalf("%s printed %q, peak RSS %d KiB", what, out, rss)
		}
	}
	run("next pass", "reannounced=0", "procevent", "reconcile", "--reannounce-after", "10m")
	writeQueueAt(t, f.h.WakeQueue(), "", 1, n, time.Now().Add(-24*time.Hour))
	run("pass over a day-old history", "reannounced=1", "procevent", "reconcile", "--reannounce-after", "10m")
	run("doctor", fmt.Sprintf("wakes        %d queued", n+1), "doctor")
	run("wake compact", fmt.Sprintf("compacted: kept=10000 dropped=%d", n-9999), "wake", "compact")
}

// [CAP-1] [CAP-2] [WAKE-1]: when the queue stops taking wakes between the
// pre-poll check and the announcement (here a line at 2^63-1 lands during
// the poll), the capture stays durable and listed, `start` exits 1 with one
// error line that names the captured file and the cause, and once the
// operator moves the queue aside, reconcile announces the result.
func TestCaptureOutlivesExhaustedQueue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.ok("procevent", "start", "s1")
	f.mode("poll", "slow")
	cmd, out, errs := f.background("procevent", "start", "s1")
	waitFor(t, 20*time.Second, "the slow poll", func() bool { return len(f.log("poll")) == 2 })
	queue := f.h.WakeQueue()
	q, err := os.OpenFile(queue, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(q, "%d\t%s\tcheck\tforged\tforged\n", time.Now().Unix(), maxSeq)
	q.Close()
	result := filepath.Join(f.h.Inbox(), "s1.2.result")
	if code := waitExit(t, cmd, 30*time.Second); code != 1 || out.String() != "" ||
		!strings.HasPrefix(errs.String(), "error[sequence-exhausted]: captured "+result+" (durable, listed by fm procevent inbox) but could not announce it") ||
		strings.Count(errs.String(), "\n") != 1 {
		t.Fatalf("start: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}
	if inbox := f.ok("procevent", "inbox"); !strings.Contains(inbox, result) {
		t.Fatalf("the capture is not listed:\n%s", inbox)
	}
	os.Rename(queue, queue+".old")
	os.Rename(queue+".seq", queue+".seq.old")
	if out := f.ok("procevent", "reconcile", "--reannounce-after", "0"); !strings.Contains(out, "reannounced=2") {
		t.Fatalf("reconcile after the fix: %q", out)
	}
	if ws := f.wakes(); len(ws) < 2 || ws[1].Key != "procevent:s1:2" || ws[1].Seq != 2 {
		t.Fatalf("wakes after the fix: %+v", ws)
	}
}

// [CAP-2] [WAKE-1]: serve keeps a served home's queue bounded. Past 16 MiB
// its maintenance compacts the queue to the latest 10,000 wakes plus the
// latest wake of each unhandled result (here far back in the history), and
// queue-seqs go on from the high-water mark.
func TestServeCompactsALargeQueue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	tok := f.registerExt("s1")
	f.ok("procevent", "start", "s1") // unhandled, announced with queue-seq 1
	f.ok("procevent", "retire", "s1", "--if-owner", tok)
	queue := f.h.WakeQueue()
	const n = 250_000
	writeQueue(t, queue, f.read(queue), 2, n)
	serve, log := f.serve()
	waitFor(t, 60*time.Second, "the compaction", func() bool { return strings.Contains(log.String(), "compacted-wakes:") })
	serve.Process.Signal(syscall.SIGTERM)
	waitExit(t, serve, 30*time.Second)
	if !strings.Contains(log.String(), fmt.Sprintf("compacted-wakes: kept=10001 dropped=%d\n", n-10001)) {
		t.Fatalf("serve log:\n%s", log)
	}
	ws := f.wakes()
	if len(ws) != 10001 || ws[0].Key != "procevent:s1:1" || ws[1].Seq != n-9999 || ws[10000].Seq != n {
		t.Fatalf("%d wakes kept, first %+v", len(ws), ws[:2])
	}
	f.registerExt("s1")
	f.ok("procevent", "start", "s1")
	if ws := f.wakes(); ws[len(ws)-1].Seq != n+1 {
		t.Fatalf("the next wake: %+v", ws[len(ws)-1])
	}
}
