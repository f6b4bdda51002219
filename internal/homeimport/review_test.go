package homeimport

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/internal/wake"
)

// [HOME-4] [CAP-1] Hostile review: what the import cannot make one of fm's
// records, or cannot prove idle, is refused with its path before anything
// changes. Each case plants one thing in a fresh fixture; the import must
// refuse with the code and path, and the home must be exactly as it was.
func TestImportRefusesBeforeAnyChange(t *testing.T) {
	for _, c := range []struct {
		name, code string
		plant      func(f *fixture) string
	}{
		// fm records a result's sequence in its meta as an exact JSON
		// integer: above 2^53 it would not read back, and every fm reader
		// of the inbox would then fail on the imported meta.
		{"sequence-max-int64", "schema-invalid", func(f *fixture) string {
			return f.plantResult("web.9223372036854775807")
		}},
		{"sequence-2^53+1", "schema-invalid", func(f *fixture) string {
			return f.plantResult("web.9007199254740993")
		}},
		// An argument that is not UTF-8 cannot be a JSON string: the
		// refusal names the record, as every other unparsable value does.
		{"argv-not-utf8", "schema-invalid", func(f *fixture) string {
			p := filepath.Join(f.h.Registrations(), "web.source")
			f.write(p, []byte("adapter=web\nargc=2\nargv:\n/bin/true\nx\xffy\n"), 0o600)
			return p
		}},
		// Where the import keeps its copies must pass fm's rules before the
		// import changes a mode: a link, another file type.
		{"imported-symlink", "link-unsafe", func(f *fixture) string {
			elsewhere := filepath.Join(f.base, "elsewhere")
			f.must(os.Mkdir(elsewhere, 0o700))
			p := filepath.Join(f.h.Dir, "data", "imported")
			f.must(os.Symlink(elsewhere, p))
			return p
		}},
		{"imported-file", "path-unsafe", func(f *fixture) string {
			p := filepath.Join(f.h.Dir, "data", "imported")
			f.write(p, nil, 0o600)
			return p
		}},
		{"journal-run-symlink", "link-unsafe", func(f *fixture) string {
			dir := filepath.Join(f.h.Dir, "data", "imported")
			f.must(os.Mkdir(dir, 0o700))
			f.write(filepath.Join(dir, journalName), []byte("20260101T000000Z\n"), 0o600)
			elsewhere := filepath.Join(f.base, "elsewhere")
			f.must(os.Mkdir(elsewhere, 0o700))
			p := filepath.Join(dir, "20260101T000000Z")
			f.must(os.Symlink(elsewhere, p))
			return p
		}},
		// A runtime file to remove is first kept by copy: a FIFO (or one
		// inside a directory) cannot be, so it is refused up front, not
		// after the modes were changed.
		{"runtime-fifo", "path-unsafe", func(f *fixture) string {
			p := filepath.Join(f.h.Registrations(), ".owner-lease")
			f.must(os.Remove(p))
			f.must(unix.Mkfifo(p, 0o600))
			return p
		}},
		{"fifo-in-marker-dir", "path-unsafe", func(f *fixture) string {
			p := filepath.Join(f.h.State, ".seen-procevent-00", "fifo")
			f.must(os.Mkdir(filepath.Dir(p), 0o700))
			f.must(unix.Mkfifo(p, 0o600))
			return p
		}},
		// A FIFO where a directory is listed is refused as such, without
		// blocking (os.ReadDir opens with O_DIRECTORY).
		{"registry-fifo", "path-unsafe", func(f *fixture) string {
			p := f.h.Registrations()
			f.must(os.Rename(p, p+".moved"))
			f.must(unix.Mkfifo(p, 0o600))
			return p
		}},
		{"claim-root-fifo", "path-unsafe", func(f *fixture) string {
			f.must(os.RemoveAll(f.claims))
			f.must(unix.Mkfifo(f.claims, 0o600))
			return f.claims
		}},
		// A claim of one of this home's sources that cannot be read, or
		// that is active with no readable pid, may be a live runner's:
		// the import cannot tell, so it refuses (as for a runner file
		// without a pid).
		{"claim-truncated", "home-busy", func(f *fixture) string {
			p := filepath.Join(f.claims, "mail.claim")
			f.write(p, []byte(f.h.Dir+"\n"+strconv.Itoa(live(f.t))+"\n"), 0o600)
			return p
		}},
		{"claim-active-no-pid", "home-busy", func(f *fixture) string {
			p := filepath.Join(f.claims, "mail.claim")
			f.write(p, []byte(f.h.Dir+"\nnot-a-pid\nx\nx\nx\nx\nactive\n"+f.h.State+"\nx\nx\nx\nx\n"), 0o600)
			return p
		}},
		{"claim-symlink", "home-busy", func(f *fixture) string {
			real := filepath.Join(f.base, "real.claim")
			f.write(real, []byte(f.h.Dir+"\n"+strconv.Itoa(live(f.t))+"\nx\nx\nx\nx\nactive\n"+f.h.State+"\nx\nx\nx\nx\n"), 0o600)
			p := filepath.Join(f.claims, "mail.claim")
			f.must(os.Symlink(real, p))
			return p
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			p := c.plant(f)
			f.importRefused(c.code, p)
			f.refused(c.code, "home", "import", "--dry-run")
		})
	}
}

// plantResult writes a built-in result base+".result" with its adapter
// sidecar and returns the result's path.
func (f *fixture) plantResult(base string) string {
	p := filepath.Join(f.h.Inbox(), base+".result")
	f.write(p, []byte("planted\n"), 0o600)
	f.write(filepath.Join(f.h.Inbox(), base+".adapter"), []byte("web\n"), 0o600)
	return p
}

// [HOME-4] A kill can land inside a write, not only after a durable change:
// between a temporary file's creation and its rename, the journal's or a
// kept copy's temporary file is left in data/imported or in the run. The
// re-run removes them, so its home is exactly the one an uninterrupted
// import gives.
func TestImportRerunRemovesTornTemporaries(t *testing.T) {
	f := newFixture(t)
	snap := filepath.Join(t.TempDir(), "snap")
	t.Cleanup(func() { testpkg.Unlock(snap) })
	f.must(copyAll(f.base, snap))
	restore := func() {
		testpkg.Unlock(f.base)
		f.must(os.RemoveAll(f.base))
		f.must(copyAll(snap, f.base))
	}
	f.fm(0, "home", "import")
	want := f.snapshot()
	temp := func(dir string, data string) {
		f.must(os.MkdirAll(dir, 0o700))
		f.write(filepath.Join(dir, ".tmp-4242-1-"+strings.Repeat("5a", 8)), []byte(data), 0o600)
	}

	// Killed while publishing the journal: no journal, its temporary file.
	restore()
	temp(filepath.Join(f.h.Dir, "data", "imported"), "20260101T000000Z\n")
	f.fm(0, "home", "import")
	if d := diff(want, f.snapshot()); d != "" {
		t.Fatalf("after a kill inside the journal's write:\n%s", d)
	}

	// Killed while keeping copies: a journal, its run, temporary files in
	// the run (beside a kept copy, and in a kept directory).
	restore()
	c := exec.Command(os.Args[0])
	c.Env = append(append([]string{}, f.env...), killEnv+"=8")
	if out, err := c.CombinedOutput(); err == nil {
		t.Fatalf("the import was not killed: %s", out)
	}
	run, err := readJournal(f.h)
	if err != nil || run == "" {
		t.Fatalf("no run after a kill at point 8: %q %v", run, err)
	}
	runDir := filepath.Join(f.h.Dir, "data", "imported", run)
	temp(runDir, "x")
	temp(filepath.Join(runDir, "state", "procevent", ".lifecycle-owner.1"), "y")
	f.fm(0, "home", "import")
	if d := diff(want, f.snapshot()); d != "" {
		t.Fatalf("after a kill inside a kept copy's write:\n%s", d)
	}
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

// [HOME-4] [LIFE-1] fm procevent serve started after the import's checks but
// before its first change (a real race: serve takes no lifecycle lock) makes
// the import refuse with home-busy with the home unchanged, not after it
// tightened modes and opened its run. Here the test takes serve's lock in
// that window.
func TestImportServeStartedBeforeFirstChange(t *testing.T) {
	f := newFixture(t)
	t.Setenv("FM_PROCEVENT_CLAIM_ROOT", f.claims)
	lock := filepath.Join(f.h.Registrations(), "serve.lock")
	f.write(lock, nil, 0o600)
	before := f.snapshot()
	var held *os.File
	beforeChange = func() {
		var err error
		if held, err = os.OpenFile(lock, os.O_RDWR, 0); err == nil {
			err = unix.Flock(int(held.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		}
		f.must(err)
	}
	t.Cleanup(func() {
		beforeChange = nil
		if held != nil {
			held.Close()
		}
	})
	if _, err := Import(context.Background(), f.h, false); !errcode.Is(err, errcode.HomeBusy) || !strings.Contains(err.Error(), lock) {
		t.Fatalf("import while serve took its lock: %v", err)
	}
	if d := diff(before, f.snapshot()); d != "" {
		t.Fatalf("a refused import changed the home:\n%s", d)
	}
	beforeChange = nil
	held.Close()
	held = nil
	if _, err := Import(context.Background(), f.h, false); err != nil {
		t.Fatalf("the import once serve stopped: %v", err)
	}
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
// <id>.<seq>.result (sequence 0, a leading zero, beyond 2^63-1, a bad source
// id) is neither converted nor dropped: it is left as it is, and the import
// says so on an "ignored" line, so the operator knows it is not in the
// inbox.
func TestImportReportsIgnoredResults(t *testing.T) {
	f := newFixture(t)
	names := []string{"web.0.result", "web.01.result", "web.9223372036854775808.result", "bad id.1.result"}
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

// [HOME-4] A re-run removes the import's own temporary files of a killed run
// (.fm-import-<16 hex>, regular files), and nothing else that merely starts
// so: a directory, or a file with another name, is left with its contents.
func TestImportRemovesOnlyItsOwnTemporaries(t *testing.T) {
	f := newFixture(t)
	own := filepath.Join(f.h.State, ".fm-import-"+strings.Repeat("ab", 8))
	f.write(own, []byte("torn"), 0o600)
	vdir := filepath.Dir(f.unit())
	ownUnit := filepath.Join(vdir, ".fm-import-"+strings.Repeat("cd", 8))
	f.write(ownUnit, []byte("torn"), 0o600)
	keep := []string{
		filepath.Join(f.h.State, ".fm-import-notes"),
		filepath.Join(f.h.State, ".fm-import-"+strings.Repeat("ef", 8)+"x"),
		filepath.Join(f.h.State, ".fm-import-"+strings.Repeat("12", 8), "precious"),
		filepath.Join(vdir, ".fm-import-"+strings.Repeat("34", 8), "precious"),
	}
	for _, p := range keep {
		f.must(os.MkdirAll(filepath.Dir(p), 0o700))
		f.write(p, []byte("mine"), 0o600)
	}
	f.fm(0, "home", "import")
	for _, p := range []string{own, ownUnit} {
		if exists(p) {
			t.Errorf("the import's own temporary file %s is left", p)
		}
	}
	for _, p := range keep {
		if data, err := os.ReadFile(p); err != nil || string(data) != "mine" {
			t.Errorf("%s was removed or changed: %q %v", p, data, err)
		}
	}
}
