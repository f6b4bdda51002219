package homeimport

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/wake"
)

// plantResult writes a built-in result base+".result" with its adapter
// sidecar and returns the result's path.
func (f *fixture) plantResult(base string) string {
	p := filepath.Join(f.h.Inbox(), base+".result")
	f.write(p, []byte("planted\n"), 0o600)
	f.write(filepath.Join(f.h.Inbox(), base+".adapter"), []byte("web\n"), 0o600)
	return p
}

// [HOME-4] [WAKE-1] The earlier implementation's wake queue only grows, so
// it may be far larger than memory allows to read at once: the import reads
// it line by line in bounded memory. Here a 1 GiB queue (sparse: one line of
// a gigabyte of NULs, then a complete wake) is imported by an fm whose data
// segment is limited to 256 MiB; its highest queue-seq is still found.
func TestImportHugeWakeQueue(t *testing.T) {
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("prlimit (util-linux) is missing")
	}
	f := newFixture(t)
	q := f.h.WakeQueue()
	fh, err := os.OpenFile(q, os.O_WRONLY, 0)
	f.must(err)
	f.must(fh.Truncate(1 << 30))
	_, err = fh.WriteAt([]byte("\n1700000009\t42\tcheck\tprocevent:web:2\tcheck: procevent web web 2\n"), 1<<30)
	f.must(err)
	f.must(fh.Close())
	c := exec.Command("prlimit", "--data=268435456", "--", fmBin, "home", "import", "--dry-run")
	c.Env = f.env
	out, err := c.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "queue-seq high-water mark 42 (was 7)") {
		t.Fatalf("dry run on a 1 GiB queue with 256 MiB of data: %v\n%s", err, lastLine(string(out)))
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 && len(s)-i < 2000 {
		return s[i+1:]
	}
	return s[max(0, len(s)-2000):]
}

// [HOME-4] [WAKE-1] The high-water mark is a private file after the import
// even when its value does not change (wake.Append reads it on every append
// and refuses it otherwise): a 0644 mark is made 0600, a mark of another
// owner is refused (root only).
func TestImportMakesMarkPrivate(t *testing.T) {
	f := newFixture(t)
	mark := filepath.Join(f.h.State, wake.MarkName)
	f.must(os.Chmod(mark, 0o644))
	f.fm(0, "home", "import")
	if m := mode(t, mark); m != 0o600 {
		t.Fatalf("the mark is %04o after the import", m)
	}
	if os.Geteuid() != 0 {
		return
	}
	f = newFixture(t)
	mark = filepath.Join(f.h.State, wake.MarkName)
	f.must(os.Lchown(mark, 65534, 65534))
	f.importRefused("owner-mismatch", mark)
}

// [HOME-4] [CAP-1] A result file whose name fm does not read as
// <id>.<seq>.result (sequence 0, a leading zero, a bad source id) is neither converted nor dropped: it is left as it is, and the import
// says so on an "ignored" line, so the operator knows it is not in the
// inbox. (A sequence past the last one is refused: TestImportRefusesKeyPastBound.)
func TestImportReportsIgnoredResults(t *testing.T) {
	f := newFixture(t)
	names := []string{"web.0.result", "web.01.result", "bad id.1.result"}
	for _, n := range names {
		f.write(filepath.Join(f.h.Inbox(), n), []byte(n), 0o600)
	}
	out := f.fm(0, "home", "import")
	for _, n := range names {
		if !strings.Contains(out, "ignored state/procevent-inbox/"+n+": ") {
			t.Errorf("no ignored line for %s:\n%s", n, out)
		}
		if data, err := os.ReadFile(filepath.Join(f.h.Inbox(), n)); err != nil || string(data) != n {
			t.Errorf("%s was touched: %q %v", n, data, err)
		}
	}
	if !strings.HasSuffix(out, "imported: sources=3 results=4 unhandled=2 transfers=1\n") {
		t.Fatalf("the counts changed:\n%s", out)
	}
}

// [CONF-2] An imported home runs its packages unconfined (off), as the
// earlier implementation did, until the operator chooses; a setting the
// operator made before the import is kept.
func TestImportKeepsPackagesUnconfined(t *testing.T) {
	f := newFixture(t)
	f.fm(0, "home", "import")
	if m, set, err := confine.ReadMode(f.h.Config()); m != confine.Off || !set || err != nil {
		t.Fatalf("after the import: %q %v %v, want off", m, set, err)
	}
	f = newFixture(t)
	f.must(confine.WriteMode(f.h.Config(), confine.Strict))
	f.fm(0, "home", "import")
	if m, _, err := confine.ReadMode(f.h.Config()); m != confine.Strict || err != nil {
		t.Fatalf("after the import: %q %v, want strict kept", m, err)
	}
}
