package homeimport

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// echoWeb makes the fixture's built-in source web print one line when
// polled, so `fm procevent start web` captures.
func (f *fixture) echoWeb() {
	f.write(filepath.Join(f.h.Registrations(), "web.source"), []byte("adapter=web\nargc=2\nargv:\n/bin/echo\nnew event\n"), 0o600)
}

// appendQueue appends raw bytes to the fixture's wake queue.
func (f *fixture) appendQueue(s string) {
	f.t.Helper()
	q, err := os.OpenFile(f.h.WakeQueue(), os.O_APPEND|os.O_WRONLY, 0)
	f.must(err)
	_, err = q.WriteString(s)
	f.must(err)
	f.must(q.Close())
}

// counter reads a source's counter after the import ("" when absent).
func (f *fixture) counter(id string) string {
	data, err := os.ReadFile(filepath.Join(f.h.Registrations(), id+".seq"))
	if os.IsNotExist(err) {
		return ""
	}
	f.must(err)
	return strings.TrimSpace(string(data))
}

// [CAP-1] [HOME-4] The observed case: web.1 and web.2 are in the inbox, the
// queue announced procevent:web:3 whose files were removed by hand. After
// the import, start captures web.4, never web.3 again.
func TestImportCounterFromQueueKey(t *testing.T) {
	f := newFixture(t)
	f.echoWeb()
	f.appendQueue("1700000100\t6\tcheck\tprocevent:web:3\tcheck: procevent web web 3\n")
	f.fm(0, "home", "import")
	out := f.fm(0, "procevent", "start", "web")
	if exists(filepath.Join(f.h.Inbox(), "web.3.result")) || !exists(filepath.Join(f.h.Inbox(), "web.4.result")) {
		t.Fatalf("start after the import did not capture web.4 (output %q)", out)
	}
	q, err := os.ReadFile(f.h.WakeQueue())
	f.must(err)
	if n := strings.Count(string(q), "\tprocevent:web:3\t"); n != 1 {
		t.Fatalf("the queue holds %d wakes with key procevent:web:3:\n%s", n, q)
	}
}

// [CAP-1] [HOME-4] Every evidence of a used sequence raises the counter:
// a queue key of any wake kind, anywhere in the queue (not only its last
// line), a torn last line whose key is whole, a bad line, a watcher marker
// (read before it is removed), for ids with no registration or inbox entry
// left. The counter only rises.
func TestImportCounterFromEveryEvidence(t *testing.T) {
	f := newFixture(t)
	marker := func(key string) {
		f.write(filepath.Join(f.h.State, ".seen-procevent-"+hex.EncodeToString([]byte(key))), nil, 0o600)
	}
	f.must(os.MkdirAll(f.h.Registrations(), 0o755))
	f.write(filepath.Join(f.h.Registrations(), "high.seq"), []byte("40\n"), 0o600)
	// A queue whose lines are out of order: the highest keys come first.
	q := "1699999990\t1\tcheck\tprocevent:gone:9\tcheck: procevent web gone 9\n" +
		"1699999991\t2\tnote\tprocevent:web:6\tsomething else\n" +
		"x\ty\tcheck\tprocevent:bad:4\tpayload\textra field\n" +
		"1699999992\t3\tcheck\tprocevent:high:12\tcheck: procevent web high 12\n" +
		string(f.queue) +
		"1700000100\t8\tcheck\tprocevent:torn:5\tcheck: proc"
	f.write(f.h.WakeQueue(), []byte(q), 0o644)
	marker("procevent:mark:11")
	marker("procevent:web:5")
	out := f.fm(0, "home", "import")
	for id, want := range map[string]string{"gone": "9", "web": "6", "bad": "4", "torn": "5", "mark": "11", "high": "40", "mail": "3"} {
		if got := f.counter(id); got != want {
			t.Errorf("counter of %s is %q, want %q\n%s", id, got, want, out)
		}
	}
	// Re-running changes nothing: the evidence is read again (the queue is
	// kept), the markers are gone, and the counters only rise.
	f.fm(0, "home", "import")
	if got := f.counter("mark"); got != "11" {
		t.Fatalf("a second import moved the counter of mark to %q", got)
	}
}

// [CAP-1] A key whose sequence is past the last sequence (2^53-1), in the
// queue or a marker, is never used: the import refuses with
// sequence-exhausted, names where it read it, and changes nothing.
func TestImportRefusesKeyPastBound(t *testing.T) {
	for name, plant := range map[string]func(f *fixture) string{
		"queue": func(f *fixture) string {
			f.appendQueue("1700000100\t6\tcheck\tprocevent:web:9007199254740992\tx\n")
			return f.h.WakeQueue()
		},
		"marker": func(f *fixture) string {
			n := ".seen-procevent-" + hex.EncodeToString([]byte("procevent:web:99999999999999999999"))
			f.write(filepath.Join(f.h.State, n), nil, 0o600)
			return n
		},
		"inbox": func(f *fixture) string {
			f.write(filepath.Join(f.h.Inbox(), "web.9007199254740992.result"), []byte("x\n"), 0o600)
			f.write(filepath.Join(f.h.Inbox(), "web.9007199254740992.adapter"), []byte("web\n"), 0o600)
			return "web.9007199254740992.result"
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			where := plant(f)
			f.importRefused("sequence-exhausted", where)
		})
	}
}

// [CAP-1] A home already imported while the queue was not read as evidence
// (a counter below a key in the queue) is put right by running the import
// again: the counter rises to the key, and nothing else changes.
func TestImportRaisesCounterOfImportedHome(t *testing.T) {
	f := newFixture(t)
	f.echoWeb()
	f.fm(0, "home", "import")
	f.write(filepath.Join(f.h.Registrations(), "web.seq"), []byte("2\n"), 0o600)
	f.appendQueue("1700000100\t9\tcheck\tprocevent:web:3\tcheck: procevent web web 3\n")
	out := f.fm(0, "home", "import")
	if got := f.counter("web"); got != "3" || !strings.Contains(out, "counter web: next sequence 4") {
		t.Fatalf("counter of web %q after a second import:\n%s", got, out)
	}
	f.fm(0, "procevent", "start", "web")
	if !exists(filepath.Join(f.h.Inbox(), "web.4.result")) {
		t.Fatal("start did not capture web.4")
	}
	if out := f.fm(0, "home", "import"); !strings.Contains(out, "imported: sources=0 results=0") {
		t.Fatalf("a third import is not a no-op:\n%s", out)
	}
}

// [HOME-4] Names the import reads from a home it did not write reach its
// report only escaped: a newline, a control character, a bidirectional
// override or invalid UTF-8 in a marker, a runtime file or an ignored
// result never ends a line of the report or forges the next one.
func TestImportReportEscapesNames(t *testing.T) {
	f := newFixture(t)
	hostile := []string{"\nimported: sources=99 results=99 unhandled=0 transfers=0", "\x1b[2Jcleared", "\u202eevil", "\xff\xfe"}
	for i, h := range hostile {
		f.write(filepath.Join(f.h.State, markerPrefix+h), nil, 0o600)
		f.write(filepath.Join(f.h.Registrations(), "."+h+".output"), nil, 0o600)
		f.write(filepath.Join(f.h.Inbox(), "web."+strconv.Itoa(i+1)+h+".result"), nil, 0o600)
	}
	for _, args := range [][]string{{"home", "import", "--dry-run"}, {"home", "import"}} {
		out := f.fm(0, args...)
		for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			if !utf8.ValidString(l) || strings.ContainsAny(l, "\x1b\u202e") || strings.HasPrefix(l, "imported: sources=99") {
				t.Errorf("fm %s printed a forged or raw line %q", strings.Join(args, " "), l)
			}
		}
		if n := strings.Count(out, `\u202eevil`); n < 3 {
			t.Errorf("fm %s: the escaped names are not all shown (%d):\n%s", strings.Join(args, " "), n, out)
		}
	}
}

// [CAP-1] A counter the import reads is read by fm's own rule
// (procevent.ParseCounter), before any change: a counter fm would refuse
// later ("+5", " 5", "-0", past the last sequence) is refused by the import
// at once, and nothing changes (an import that planned with a looser rule
// failed half-way, when fm's writer read the same file).
func TestImportReadsCountersAsFmDoes(t *testing.T) {
	for text, code := range map[string]string{"+5\n": "schema-invalid", " 5\n": "schema-invalid", "-0\n": "schema-invalid", "9007199254740992\n": "sequence-exhausted"} {
		t.Run(strings.TrimSpace(text), func(t *testing.T) {
			f := newFixture(t)
			path := filepath.Join(f.h.Registrations(), "web.seq")
			f.write(path, []byte(text), 0o600)
			f.importRefused(code, path)
		})
	}
}

// [HOME-4] A refusal that names files the import found (a runner file, a
// claim, a lock's owner, a foreign invocation record) stays one error line
// whatever their names hold: each name is shown escaped.
func TestImportBusyNamesEscaped(t *testing.T) {
	f := newFixture(t)
	forged := "x\nerror[ok]: nothing is busy\u202e\x1b[2J"
	f.write(filepath.Join(f.h.Registrations(), forged+".runner"), []byte("not a pid\n"), 0o600)
	f.must(os.MkdirAll(f.h.Invocations(), 0o700))
	f.write(filepath.Join(f.h.Invocations(), forged+".owner.json"), []byte("{}"), 0o600)
	e := f.refused("home-busy", "home", "import")
	if strings.ContainsAny(e, "\u202e\x1b") || !strings.Contains(e, `runner file "`) {
		t.Fatalf("the names are not shown escaped: %s", e)
	}
}
