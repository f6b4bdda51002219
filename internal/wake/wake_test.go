package wake

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
)

func stateDir(t *testing.T) (string, *os.File) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return dir, f
}

// [WAKE-1]: concurrent appends get unique, gap-free queue-seqs; every line
// has five tab-separated fields, tabs and newlines flattened; the file is a
// private 0600 file.
func TestAppendConcurrent(t *testing.T) {
	dir, state := stateDir(t)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			if _, err := Append(context.Background(), state, "check", "k\t"+string(rune('a'+i%26)), "line one\nline\ttwo"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	ws, err := List(dir, 0)
	if err != nil || len(ws) != 40 {
		t.Fatalf("list: %v, %d wakes", err, len(ws))
	}
	for i, w := range ws {
		if w.Seq != int64(i+1) || w.Payload != "line one line two" || strings.ContainsAny(w.Key, "\t\n") || w.Kind != "check" {
			t.Fatalf("wake %d = %+v", i, w)
		}
	}
	fi, err := os.Lstat(filepath.Join(dir, FileName))
	if err != nil || fi.Mode() != 0o600 {
		t.Fatalf("queue mode %v %v", fi.Mode(), err)
	}
	if after, _ := List(dir, 38); len(after) != 2 || after[0].Seq != 39 {
		t.Fatalf("List after 38 = %+v", after)
	}
}

// [WAKE-1]: a torn final line (a crash mid-append) is ignored by readers and
// terminated by the next append, which continues the sequence.
func TestTornTail(t *testing.T) {
	dir, state := stateDir(t)
	if _, err := Append(context.Background(), state, "check", "a", "one"); err != nil {
		t.Fatal(err)
	}
	q, err := os.OpenFile(filepath.Join(dir, FileName), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	q.WriteString("17000\t2\tche")
	q.Close()
	if ws, _ := List(dir, 0); len(ws) != 1 {
		t.Fatalf("a torn line was listed: %+v", ws)
	}
	w, err := Append(context.Background(), state, "check", "b", "two")
	if err != nil || w.Seq != 2 {
		t.Fatalf("append after a torn tail: %+v %v", w, err)
	}
	if ws, _ := List(dir, 0); len(ws) != 2 || ws[1].Key != "b" {
		t.Fatalf("after repair: %+v", ws)
	}
}

// The queue is refused when it is a link, shared, or not private; a bad kind
// or an oversized field is refused before anything is written.
func TestRefusals(t *testing.T) {
	dir, state := stateDir(t)
	if _, err := Append(context.Background(), state, "Check!", "k", "p"); err == nil {
		t.Fatal("a bad kind was accepted")
	}
	if _, err := Append(context.Background(), state, "check", strings.Repeat("k", MaxField+1), "p"); err == nil {
		t.Fatal("an oversized key was accepted")
	}
	target := filepath.Join(dir, "elsewhere")
	os.WriteFile(target, nil, 0o600)
	os.Symlink(target, filepath.Join(dir, FileName))
	if _, err := Append(context.Background(), state, "check", "k", "p"); !errcode.Is(err, errcode.LinkUnsafe) {
		t.Fatalf("append through a symlink: %v", err)
	}
	if _, err := List(dir, 0); !errcode.Is(err, errcode.LinkUnsafe) {
		t.Fatalf("list through a symlink: %v", err)
	}
	os.Remove(filepath.Join(dir, FileName))
	os.WriteFile(filepath.Join(dir, FileName), nil, 0o644)
	os.Chmod(filepath.Join(dir, FileName), 0o644)
	if _, err := Append(context.Background(), state, "check", "k", "p"); !errcode.Is(err, errcode.ModeUnsafe) {
		t.Fatalf("append to a 0644 queue: %v", err)
	}
	if data, _ := os.ReadFile(target); len(data) != 0 {
		t.Fatal("the link's target was written")
	}
}

// [WAKE-2]: Watch emits the queued wakes after `after`, then each new one,
// follows a queue created after it started, and returns nil on cancel.
func TestWatch(t *testing.T) {
	dir, state := stateDir(t)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan Wake, 10)
	done := make(chan error, 1)
	go func() { done <- Watch(ctx, dir, 1, func(w Wake) error { got <- w; return nil }) }()
	for _, k := range []string{"a", "b", "c"} {
		if _, err := Append(context.Background(), state, "check", k, "p"); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"b", "c"} {
		select {
		case w := <-got:
			if w.Key != want {
				t.Fatalf("watch emitted %+v, want key %s", w, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("watch did not emit %s", want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("watch returned %v", err)
	}
}

// [WAKE-2]: a FIFO planted at the queue's name is refused at once (it is not
// a regular file) by List, Watch and Append; the open never blocks waiting
// for a writer, which no signal would interrupt.
func TestFIFOQueueNeverBlocks(t *testing.T) {
	dir, state := stateDir(t)
	fifo := filepath.Join(dir, FileName)
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := List(dir, 0); !errcode.Is(err, errcode.PathUnsafe) {
			t.Errorf("List of a FIFO queue: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := Watch(ctx, dir, 0, func(Wake) error { return nil }); !errcode.Is(err, errcode.PathUnsafe) {
			t.Errorf("Watch of a FIFO queue: %v", err)
		}
		if _, err := Append(context.Background(), state, "check", "k", "p"); !errcode.Is(err, errcode.PathUnsafe) {
			t.Errorf("Append to a FIFO queue: %v", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		// Unblock the stuck open before failing, so the test binary can end.
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		t.Fatal("reading a FIFO wake queue blocked")
	}
}

// [WAKE-1] [HOME-4] A queue of the earlier Firstmate implementation (0644,
// its .wake-queue.lock beside it) is refused by readers and writers with
// home-import-needed, which says what to do; a loose queue without that lock
// stays mode-unsafe.
func TestEarlierQueueNeedsImport(t *testing.T) {
	dir, state := stateDir(t)
	q := filepath.Join(dir, FileName)
	if err := os.WriteFile(q, []byte("1\t1\tcheck\tk\tp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(q, 0o644)
	if _, err := List(dir, 0); !errcode.Is(err, errcode.ModeUnsafe) {
		t.Fatalf("list of a 0644 queue: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".wake-queue.lock"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := List(dir, 0); !errcode.Is(err, errcode.HomeImportNeeded) || !strings.Contains(err.Error(), "fm home import") {
		t.Fatalf("list of the earlier implementation's queue: %v", err)
	}
	if _, err := Append(context.Background(), state, "check", "k", "p"); !errcode.Is(err, errcode.HomeImportNeeded) {
		t.Fatalf("append to the earlier implementation's queue: %v", err)
	}
}

// [WAKE-1] A line of the queue whose key or payload holds a control
// character (an escape sequence, a carriage return), a formatting character
// or bytes that are not UTF-8 (a queue another program wrote, or an edit) is
// a bad line: readers skip and count it, so `fm wake list` never prints it;
// Append flattens the same characters to spaces, so what fm writes always
// reads back.
func TestUnprintableFieldsAreBadLines(t *testing.T) {
	dir, state := stateDir(t)
	var q strings.Builder
	for i, p := range []string{"ok", "a\x1b[2Jb", "over\rwritten", "a\u202eb", "a\xffb", "a\u2028b", "a\x7fb"} {
		q.WriteString(strconv.Itoa(1700000000+i) + "\t" + strconv.Itoa(i+1) + "\tcheck\tk" + strconv.Itoa(i) + "\t" + p + "\n")
	}
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte(q.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	ws, err := List(dir, 0)
	if err != nil || len(ws) != 1 || ws[0].Payload != "ok" {
		t.Fatalf("List: %+v %v", ws, err)
	}
	if st, err := ReadStats(dir); err != nil || st.Bad != 6 {
		t.Fatalf("ReadStats: %+v %v", st, err)
	}
	w, err := Append(context.Background(), state, "check", "key\x1b", "pay\u202eload\xff\r")
	if err != nil || w.Key != "key " || w.Payload != "pay load\uFFFD " {
		t.Fatalf("Append: %+v %v", w, err)
	}
	if ws, _ := List(dir, 0); len(ws) != 2 || ws[1] != w {
		t.Fatalf("the appended wake does not read back: %+v", ws)
	}
}
