package wake

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// appendN appends n wakes with keys k<i> and fails the test on an error.
func appendN(t *testing.T, state *os.File, n int) {
	t.Helper()
	for i := range n {
		if _, err := Append(context.Background(), state, "check", fmt.Sprintf("k%d", i), "p"); err != nil {
			t.Fatal(err)
		}
	}
}

func writeRaw(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// [WAKE-1]: a queue-seq never wraps. A last line or a high-water mark at
// 2^63-1 makes Append (and Exhausted) refuse with sequence-exhausted and
// write nothing, instead of writing a negative queue-seq that every reader
// skips; the line at 2^63-1 itself stays readable. A mark past 2^63-1 is
// exhausted too, and a malformed mark is schema-invalid.
func TestQueueSeqNeverWraps(t *testing.T) {
	dir, state := stateDir(t)
	queue := filepath.Join(dir, FileName)
	writeRaw(t, queue, "1\t1\tcheck\ta\tp\n1\t9223372036854775807\tcheck\tforged\tp\n")
	for i := range 3 {
		w, err := Append(context.Background(), state, "check", "b", "p")
		if !errcode.Is(err, errcode.SequenceExhausted) {
			t.Fatalf("append %d after queue-seq 2^63-1: %+v %v", i, w, err)
		}
	}
	if err := Exhausted(state); !errcode.Is(err, errcode.SequenceExhausted) {
		t.Fatalf("Exhausted: %v", err)
	}
	if data, _ := os.ReadFile(queue); strings.Count(string(data), "\n") != 2 {
		t.Fatalf("an exhausted queue was written: %q", data)
	}
	if ws, _ := List(dir, 1); len(ws) != 1 || ws[0].Seq != MaxSeq {
		t.Fatalf("the last line is not listed: %+v", ws)
	}

	os.Remove(queue)
	for mark, code := range map[string]errcode.Code{
		"9223372036854775807\n": errcode.SequenceExhausted,
		"9223372036854775808\n": errcode.SequenceExhausted,
		"99999999999999999999":  errcode.SequenceExhausted,
		"-3\n":                  errcode.SchemaInvalid,
		"\n":                    errcode.SchemaInvalid,
	} {
		writeRaw(t, filepath.Join(dir, MarkName), mark)
		if w, err := Append(context.Background(), state, "check", "b", "p"); !errcode.Is(err, code) {
			t.Fatalf("mark %q: append gave %+v %v, want %s", mark, w, err, code)
		}
		if _, err := os.Lstat(queue); err == nil && Exhausted(state) == nil {
			t.Fatalf("mark %q: Exhausted says the queue can advance", mark)
		}
	}
	writeRaw(t, filepath.Join(dir, MarkName), "9223372036854775806")
	if w, err := Append(context.Background(), state, "check", "b", "p"); err != nil || w.Seq != MaxSeq {
		t.Fatalf("the last queue-seq: %+v %v", w, err)
	}
}

// [WAKE-1] [WAKE-2]: one bad line never hides the lines after it: an
// oversized line (larger than a reader's buffer), malformed lines and a line
// whose queue-seq is far ahead of the others are skipped or read on their
// own, and List, Recent, Watch and ReadStats all see every later wake.
func TestBadLineNeverHidesLaterWakes(t *testing.T) {
	dir, state := stateDir(t)
	queue := filepath.Join(dir, FileName)
	good := func(seq int, key string) string {
		return fmt.Sprintf("%d\t%d\tcheck\t%s\tp\n", time.Now().Unix(), seq, key)
	}
	writeRaw(t, queue, good(1, "a")+strings.Repeat("x", 3*readBuf)+"\n"+"1\t-5\tcheck\tneg\tp\n"+good(1000, "ahead")+
		"1\t2\tcheck\n"+strings.Repeat("\t", 2*readBuf)+"\n"+good(2, "b")+good(3, "c"))
	want := []string{"a", "ahead", "b", "c"}
	keys := func(ws []Wake) []string {
		var out []string
		for _, w := range ws {
			out = append(out, w.Key)
		}
		return out
	}
	ws, err := List(dir, 0)
	if err != nil || !slices.Equal(keys(ws), want) {
		t.Fatalf("List: %v %v", keys(ws), err)
	}
	var back []Wake
	if err := Recent(dir, func(w Wake) bool { back = append(back, w); return true }); err != nil {
		t.Fatal(err)
	}
	slices.Reverse(back)
	if !slices.Equal(keys(back), want) {
		t.Fatalf("Recent: %v", keys(back))
	}
	st, err := ReadStats(dir)
	if err != nil || st.Wakes != 4 || st.Bad != 4 || st.LastSeq != 3 {
		t.Fatalf("ReadStats: %+v %v", st, err)
	}
	// Watch from the start, then a wake appended while it runs.
	got := watch(t, dir, 0, func() {
		if _, err := Append(context.Background(), state, "check", "d", "p"); err != nil {
			t.Fatal(err)
		}
	}, 5)
	if !slices.Equal(keys(got), append(want, "d")) {
		t.Fatalf("Watch: %v", keys(got))
	}
}

// watch runs Watch from after, calls during once the queued wakes are
// read, and returns the first n wakes it emitted.
func watch(t *testing.T, dir string, after int64, during func(), n int) []Wake {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := make(chan Wake, 100)
	done := make(chan error, 1)
	go func() { done <- Watch(ctx, dir, after, func(w Wake) error { ch <- w; return nil }) }()
	time.Sleep(3 * PollInterval)
	during()
	var got []Wake
	deadline := time.After(10 * time.Second)
	for len(got) < n {
		select {
		case w := <-ch:
			got = append(got, w)
		case <-deadline:
			t.Fatalf("Watch emitted %d of %d wakes: %+v", len(got), n, got)
		}
	}
	time.Sleep(3 * PollInterval) // nothing more, nothing twice
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(ch)
	for w := range ch {
		got = append(got, w)
	}
	return got
}

// [WAKE-1]: queue-seq only grows: after the queue is removed, truncated in
// place or compacted, the next wake continues from the high-water mark,
// which is a private 0600 file holding the last queue-seq as decimal text.
func TestSeqSurvivesRemovalTruncationCompaction(t *testing.T) {
	dir, state := stateDir(t)
	queue := filepath.Join(dir, FileName)
	appendN(t, state, 5)
	os.Remove(queue)
	next := func(want int64) {
		t.Helper()
		w, err := Append(context.Background(), state, "check", "x", "p")
		if err != nil || w.Seq != want {
			t.Fatalf("next wake %+v %v, want queue-seq %d", w, err, want)
		}
	}
	next(6)
	if err := os.Truncate(queue, 0); err != nil {
		t.Fatal(err)
	}
	next(7)
	if _, err := Compact(context.Background(), state, 0, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(queue); len(data) != 0 {
		t.Fatalf("compacting to nothing left %q", data)
	}
	next(8)
	fi, err := os.Lstat(filepath.Join(dir, MarkName))
	data, _ := os.ReadFile(filepath.Join(dir, MarkName))
	if err != nil || fi.Mode() != 0o600 || string(data) != "8\n" {
		t.Fatalf("mark %v %q %v", fi.Mode(), data, err)
	}
}

// [WAKE-2]: a watcher resuming after queue-seq 5 keeps delivering every new
// wake, once each, when the queue is truncated in place, removed and
// recreated, or compacted while it runs.
func TestWatchAcrossTruncationAndCompaction(t *testing.T) {
	dir, state := stateDir(t)
	queue := filepath.Join(dir, FileName)
	appendN(t, state, 5)
	step := func(change func()) {
		change()
		if _, err := Append(context.Background(), state, "check", "new", "p"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * PollInterval)
	}
	got := watch(t, dir, 5, func() {
		step(func() { os.Truncate(queue, 0) })
		step(func() { os.Remove(queue) })
		step(func() {
			if _, err := Compact(context.Background(), state, 1, func(string) bool { return false }); err != nil {
				t.Fatal(err)
			}
		})
		appendN(t, state, 30)
		time.Sleep(3 * PollInterval)
		step(func() { os.Truncate(queue, 0) })
		// Rewritten in place, longer than before, between two polls: the
		// old offset now falls inside other lines.
		var b strings.Builder
		for s := 40; s <= 80; s++ {
			fmt.Fprintf(&b, "%d\t%d\tcheck\trewritten\tp\n", time.Now().Unix(), s)
		}
		writeRaw(t, queue, b.String())
	}, 75)
	var seqs []int64
	for _, w := range got {
		seqs = append(seqs, w.Seq)
	}
	var want []int64
	for s := int64(6); s <= 80; s++ {
		want = append(want, s)
	}
	if !slices.Equal(seqs, want) {
		t.Fatalf("Watch --after 5 emitted %v", seqs)
	}
}

// Compact keeps the last window wakes and the latest wake of each kept key,
// byte for byte and in order, drops the rest and every bad line, leaves a
// private 0600 queue, and never lowers the mark.
func TestCompactKeeps(t *testing.T) {
	dir, state := stateDir(t)
	queue := filepath.Join(dir, FileName)
	for i := range 100 {
		if _, err := Append(context.Background(), state, "check", fmt.Sprintf("k%d", i%10), fmt.Sprintf("p%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	q, _ := os.OpenFile(queue, os.O_WRONLY|os.O_APPEND, 0)
	q.WriteString("garbage\n")
	q.Close()
	before, _ := List(dir, 0)
	res, err := Compact(context.Background(), state, 5, func(k string) bool { return k == "k3" || k == "k9" })
	if err != nil || res.Kept != 6 || res.Dropped != 95 || res.Mark != 100 {
		t.Fatalf("Compact: %+v %v", res, err)
	}
	after, _ := List(dir, 0)
	want := []Wake{before[93], before[95], before[96], before[97], before[98], before[99]}
	if !slices.Equal(after, want) {
		t.Fatalf("kept %+v", after)
	}
	if fi, err := os.Lstat(queue); err != nil || fi.Mode() != 0o600 {
		t.Fatalf("compacted queue: %v %v", fi, err)
	}
	if st, _ := ReadStats(dir); st.Bad != 0 {
		t.Fatalf("a bad line survived: %+v", st)
	}
}

// [WAKE-1] [WAKE-2]: the backward reader (reconcile's) sees exactly the
// wakes the forward reader sees, in reverse, for random queues of good,
// malformed, oversized and torn lines, whatever the block size splits.
func TestBackwardsAgreesWithForward(t *testing.T) {
	dir, _ := stateDir(t)
	queue := filepath.Join(dir, FileName)
	rng := rand.New(rand.NewPCG(1, 2))
	cases := 400
	if testing.Short() {
		cases = 100
	}
	for c := range cases {
		var b strings.Builder
		for i := range rng.IntN(40) {
			switch rng.IntN(6) {
			case 0:
				b.WriteString(strings.Repeat("x", rng.IntN(3*maxLine)) + "\n")
			case 1:
				fmt.Fprintf(&b, "1\t%d\tcheck\t%s\tp\n", i+1, strings.Repeat("k", rng.IntN(2*MaxField)))
			case 2:
				b.WriteString("\n")
			default:
				fmt.Fprintf(&b, "1700000000\t%d\tcheck\tk%d\tp\n", i+1, i)
			}
		}
		if rng.IntN(3) == 0 {
			b.WriteString("1700000000\t99\tcheck\tk\ttorn")
		}
		writeRaw(t, queue, b.String())
		fwd, err := List(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(queue)
		if err != nil {
			t.Fatal(err)
		}
		block := int64(1 + rng.IntN(300))
		var back []Wake
		_, err = backwardsBy(f, int64(b.Len()), block, func(w Wake) bool { back = append(back, w); return true })
		f.Close()
		slices.Reverse(back)
		if err != nil || !slices.Equal(fwd, back) {
			t.Fatalf("case %d (block %d): forward %d wakes, backward %d (%v)\n%q", c, block, len(fwd), len(back), err, b.String())
		}
	}
}

// [WAKE-1]: the high-water mark is a private file like the queue: a
// symlink, a second hard link or a loose mode at its name refuses the
// append (nothing is written, the link's target untouched), and a stale
// temporary file left by a killed writer is replaced, never followed.
func TestMarkRefusals(t *testing.T) {
	dir, state := stateDir(t)
	mark := filepath.Join(dir, MarkName)
	target := filepath.Join(dir, "elsewhere")
	writeRaw(t, target, "5\n")
	os.Symlink(target, mark)
	if _, err := Append(context.Background(), state, "check", "k", "p"); !errcode.Is(err, errcode.LinkUnsafe) {
		t.Fatalf("append with a symlinked mark: %v", err)
	}
	os.Remove(mark)
	os.Link(target, mark)
	if _, err := Append(context.Background(), state, "check", "k", "p"); !errcode.Is(err, errcode.LinkUnsafe) {
		t.Fatalf("append with a hard-linked mark: %v", err)
	}
	os.Remove(mark)
	writeRaw(t, mark, "5\n")
	os.Chmod(mark, 0o644)
	if _, err := Append(context.Background(), state, "check", "k", "p"); !errcode.Is(err, errcode.ModeUnsafe) {
		t.Fatalf("append with a 0644 mark: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, FileName)); err == nil {
		if data, _ := os.ReadFile(filepath.Join(dir, FileName)); len(data) != 0 {
			t.Fatalf("a refused append wrote %q", data)
		}
	}
	os.Chmod(mark, 0o600)
	os.Symlink(target, filepath.Join(dir, markTemp))
	if w, err := Append(context.Background(), state, "check", "k", "p"); err != nil || w.Seq != 6 {
		t.Fatalf("append past a planted temp link: %+v %v", w, err)
	}
	if data, _ := os.ReadFile(target); string(data) != "5\n" {
		t.Fatalf("the planted link's target was written: %q", data)
	}
}

// [WAKE-2] A line with a lower queue-seq appended by hand behind a running
// watcher is emitted (a continued read never hides a line), but it never
// lowers the watcher's floor: once the queue is compacted (replaced), the
// watcher re-reads it from the start past the highest queue-seq it had,
// and emits no wake a second time nor one it was told to skip (--after 3).
func TestWatchFloorNeverDrops(t *testing.T) {
	dir, state := stateDir(t)
	queue := filepath.Join(dir, FileName)
	appendN(t, state, 3)
	got := watch(t, dir, 3, func() {
		q, err := os.OpenFile(queue, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(q, "%d\t2\tcheck\thand\tp\n", time.Now().Unix())
		q.Close()
		time.Sleep(3 * PollInterval)
		if _, err := Compact(context.Background(), state, 100, func(string) bool { return false }); err != nil {
			t.Fatal(err)
		}
		if _, err := Append(context.Background(), state, "check", "new", "p"); err != nil {
			t.Fatal(err)
		}
	}, 2)
	var seqs []int64
	for _, w := range got {
		seqs = append(seqs, w.Seq)
	}
	if !slices.Equal(seqs, []int64{2, 4}) {
		t.Fatalf("Watch --after 3 emitted %v, want [2 4]", seqs)
	}
}

// BenchmarkLastSeq times the look at a queue's last queue-seq that every
// append and every poll's Exhausted check make, on a queue of 10,000 wakes.
func BenchmarkLastSeq(b *testing.B) {
	queue := filepath.Join(b.TempDir(), FileName)
	var q strings.Builder
	for i := range 10000 {
		fmt.Fprintf(&q, "1700000000\t%d\tcheck\tsource-%d\tsha256:%064d\n", i+1, i%200, i)
	}
	if err := os.WriteFile(queue, []byte(q.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(queue)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.ReportAllocs()
	for b.Loop() {
		if seq, torn, err := lastSeq(f, int64(q.Len())); seq != 10000 || torn || err != nil {
			b.Fatalf("lastSeq: %d, %v, %v", seq, torn, err)
		}
	}
}

// [WAKE-1] Whatever is planted at markTemp (the mark's fixed temporary
// name) is never opened nor written through, never makes the mark wrong,
// and never stops an append: a FIFO a reader holds open (an
// open for writing would hang up its reader), a symbolic link, a hard link
// to another file, a 0644 file, a huge file, a directory that cannot be
// unlinked and, as root, a device node, a file of another user and a file
// bind-mounted there (an open for writing would write the file mounted).
func TestMarkTempPlanted(t *testing.T) {
	root := os.Geteuid() == 0
	for _, tc := range []struct {
		name  string
		root  bool
		plant func(t *testing.T, dir, temp string) (check func(t *testing.T))
	}{
		{name: "fifo with a reader", plant: func(t *testing.T, dir, temp string) func(t *testing.T) {
			if err := unix.Mkfifo(temp, 0o600); err != nil {
				t.Fatal(err)
			}
			fd, err := unix.Open(temp, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Close(fd) })
			return func(t *testing.T) {
				// A FIFO's reader is hung up once a writer opened and closed it.
				fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				if _, err := unix.Poll(fds, 0); err != nil {
					t.Fatal(err)
				}
				if fds[0].Revents&unix.POLLHUP != 0 {
					t.Fatal("the planted FIFO was opened for writing")
				}
			}
		}},
		{name: "symlink", plant: func(t *testing.T, dir, temp string) func(t *testing.T) {
			target := filepath.Join(dir, "target")
			writeRaw(t, target, "precious\n")
			os.Symlink(target, temp)
			return unchanged(target, "precious\n")
		}},
		{name: "hard link", plant: func(t *testing.T, dir, temp string) func(t *testing.T) {
			target := filepath.Join(dir, "target")
			writeRaw(t, target, "precious\n")
			os.Link(target, temp)
			return unchanged(target, "precious\n")
		}},
		{name: "0644 file", plant: func(t *testing.T, dir, temp string) func(t *testing.T) {
			writeRaw(t, temp, "precious\n")
			os.Chmod(temp, 0o644)
			return func(*testing.T) {}
		}},
		{name: "huge file", plant: func(t *testing.T, dir, temp string) func(t *testing.T) {
			writeRaw(t, temp, "")
			os.Truncate(temp, 1<<40)
			return func(*testing.T) {}
		}},
		{name: "directory", plant: func(t *testing.T, dir, temp string) func(t *testing.T) {
			os.Mkdir(temp, 0o700)
			writeRaw(t, filepath.Join(temp, "inside"), "precious\n")
			return unchanged(filepath.Join(temp, "inside"), "precious\n")
		}},
		{name: "device", root: true, plant: func(t *testing.T, dir, temp string) func(t *testing.T) {
			if err := unix.Mknod(temp, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
				t.Skip("no mknod here:", err)
			}
			return func(*testing.T) {}
		}},
		{name: "foreign owner", root: true, plant: func(t *testing.T, dir, temp string) func(t *testing.T) {
			writeRaw(t, temp, "precious\n")
			os.Chown(temp, 65534, 65534)
			return func(*testing.T) {}
		}},
		{name: "bind mount", root: true, plant: func(t *testing.T, dir, temp string) func(t *testing.T) {
			target := filepath.Join(t.TempDir(), "target")
			writeRaw(t, target, "precious\n")
			writeRaw(t, temp, "")
			if err := unix.Mount(target, temp, "", unix.MS_BIND, ""); err != nil {
				t.Skip("no bind mount here:", err)
			}
			t.Cleanup(func() { unix.Unmount(temp, unix.MNT_DETACH) })
			return unchanged(target, "precious\n")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && !root {
				t.Skip("needs root")
			}
			dir, state := stateDir(t)
			temp := filepath.Join(dir, markTemp)
			appendN(t, state, 2)
			check := tc.plant(t, dir, temp)
			for i := range 3 {
				w, err := Append(context.Background(), state, "check", "k", "p")
				check(t)
				if err != nil || w.Seq != int64(3+i) {
					t.Fatalf("append %d past the planted %s: %+v %v", i, tc.name, w, err)
				}
				if n, err := readMark(state); err != nil || n != w.Seq {
					t.Fatalf("mark after append %d: %d %v", i, n, err)
				}
			}
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if n := e.Name(); n != FileName && n != MarkName && n != markTemp && n != "target" {
					t.Fatalf("left behind: %s", n)
				}
			}
		})
	}
}

// unchanged checks that the file at path still holds want.
func unchanged(path, want string) func(t *testing.T) {
	return func(t *testing.T) {
		t.Helper()
		if got, err := os.ReadFile(path); err != nil || string(got) != want {
			t.Fatalf("%s was written through: %q %v", path, got, err)
		}
	}
}
