package wake_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/wake"
)

// FuzzAppend starts from arbitrary queue bytes (complete lines, garbage, a
// torn last line left by a crash mid-append) and appends one wake with an
// arbitrary key and payload ([WAKE-1]). Readers must see exactly what they
// saw before plus that wake: an append never hides, changes or resurrects
// anything (a torn line stays unreadable once terminated), its queue-seq is
// one more than the last complete line's, and tabs and newlines in its key
// and payload became spaces.
func FuzzAppend(f *testing.F) {
	line := "1700000000\t7\tcheck\tprocevent:s:1\tcheck: procevent fake s 1\n"
	for _, q := range []string{"", line, line + line[:20], line + line[:len(line)-1], line + "1700000000\t8\tcheck\tprocevent:s:2\t",
		line + "1700000000\t8\tcheck\tproc", line + "1700000000\t8\tch", line + "garbage\n", "\n\n", line + "17\t9\tCHECK\tk\tp\n", "x\ty\tcheck\tk\tp\n",
		line + "1\t9223372036854775807\tcheck\tk\tp\n", line + strings.Repeat("x", 70000) + "\n" + line, strings.Repeat("y", 70000)} {
		f.Add([]byte(q), "procevent:s:2", "check: procevent fake s 2")
	}
	f.Add([]byte(line), "a\tb\nc", "d\re")
	dir := f.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		f.Fatal(err)
	}
	state, err := os.Open(dir)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, queue []byte, key, payload string) {
		key, payload = key[:min(len(key), wake.MaxField)], payload[:min(len(payload), wake.MaxField)]
		path := filepath.Join(dir, wake.FileName)
		os.Remove(path)
		os.Remove(filepath.Join(dir, wake.MarkName))
		if err := os.WriteFile(path, queue, 0o600); err != nil {
			t.Fatal(err)
		}
		before, err := wake.List(dir, 0)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		var last int64
		for _, l := range strings.Split(string(queue[:strings.LastIndexByte(string(queue), '\n')+1]), "\n") {
			if p, ok := wake.Parse(l); ok {
				last = p.Seq
			}
		}
		w, err := wake.Append(context.Background(), state, "check", key, payload)
		if last == wake.MaxSeq {
			if !errcode.Is(err, errcode.SequenceExhausted) {
				t.Fatalf("append after queue-seq %d: %+v %v", last, w, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Append: %v", err)
		}
		after, err := wake.List(dir, 0)
		if err != nil {
			t.Fatalf("List after Append: %v", err)
		}
		if !reflect.DeepEqual(after, append(before, w)) {
			t.Fatalf("queue %q: readers saw %d wakes, then %d after one append:\n%+v", queue, len(before), len(after), after)
		}
		if w.Seq != last+1 || strings.ContainsAny(w.Key+w.Payload, "\t\n\r") {
			t.Fatalf("appended %+v after last complete queue-seq %d", w, last)
		}
	})
}
