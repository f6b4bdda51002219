package homeimport

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"golang.org/x/sys/unix"
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
		{"sequence-max-int64", "sequence-exhausted", func(f *fixture) string {
			return f.plantResult("web.9223372036854775807")
		}},
		{"sequence-2^53+1", "sequence-exhausted", func(f *fixture) string {
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

// [LIFE-1] The import refuses with home-busy, and changes nothing, while a
// process of the earlier implementation (or an fm runner) may still run in
// the home: a live runner pid, an active claim whose runner is alive, a
// lifecycle or source lock whose holder is alive, an invocation record of
// the earlier implementation, an fm claim held.
func TestImportRefusesWhileBusy(t *testing.T) {
	f := newFixture(t)
	reg := f.h.Registrations()
	pid := strconv.Itoa(live(t))
	claim := func(home, active string) []byte {
		return []byte(home + "\n" + pid + "\nx\nx\nx\nx\n" + active + "\n" + f.h.State + "\nx\nx\nx\nx\n")
	}
	lockTo := func(link string) func() {
		return func() {
			owner := link + ".owner"
			f.must(os.Mkdir(owner, 0o700))
			f.write(filepath.Join(owner, "pid"), []byte(pid+"\n"), 0o600)
			f.must(os.Symlink(owner, link))
		}
	}
	held := -1
	undo := func() {}
	cases := []struct {
		name, want string
		plant      func()
	}{
		{"runner", "mail.runner", func() { f.write(filepath.Join(reg, "mail.runner"), []byte(pid+"\n"), 0o600) }},
		{"claim", "mail.claim", func() { f.write(filepath.Join(f.claims, "mail.claim"), claim(f.h.Dir, "active"), 0o600) }},
		{"claim-by-state-root", "mail.claim", func() { f.write(filepath.Join(f.claims, "mail.claim"), claim("/elsewhere", "active"), 0o600) }},
		{"lifecycle-lock", lifecycleLockName, func() {
			p := filepath.Join(reg, ".lifecycle-owner.1", "pid")
			was, err := os.ReadFile(p)
			f.must(err)
			f.write(p, []byte(pid+"\n"), 0o600)
			undo = func() { f.write(p, was, 0o600) }
		}},
		{"source-lock", "mail.lock", lockTo(filepath.Join(f.claims, "mail.lock"))},
		{"invocation", strings.Repeat("ab", 32) + ".ready.json", func() {
			f.must(os.MkdirAll(f.h.Invocations(), 0o700))
			f.write(filepath.Join(f.h.Invocations(), strings.Repeat("ab", 32)+".ready.json"), []byte("{}"), 0o600)
		}},
		{"fm-claim", "mail.claim", func() {
			fd, err := unix.Open(filepath.Join(reg, "mail.claim"), unix.O_RDWR|unix.O_CREAT, 0o600)
			f.must(err)
			f.must(unix.Flock(fd, unix.LOCK_EX))
			t.Cleanup(func() { unix.Close(fd) })
			held = fd
		}},
	}
	// Not busy: a terminal claim, an active claim of another home, a dead
	// runner (the fixture's).
	f.write(filepath.Join(f.claims, "web.claim"), claim(f.h.Dir, "terminal"), 0o600)
	f.write(filepath.Join(f.claims, "other.claim"), []byte("/other/home\n"+pid+"\nx\nx\nx\nx\nactive\n/other/home/state\n"), 0o600)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := f.snapshot()
			c.plant()
			planted := f.snapshot()
			e := f.refused("home-busy", "home", "import")
			if !strings.Contains(e, c.want) || !strings.Contains(e, pid) && c.name != "invocation" && c.name != "fm-claim" {
				t.Fatalf("the refusal does not name %s and pid %s: %s", c.want, pid, e)
			}
			if d := diff(planted, f.snapshot()); d != "" {
				t.Fatalf("a refused import changed the home:\n%s", d)
			}
			// Undo the plant.
			for rel := range planted {
				if _, ok := before[rel]; !ok {
					os.RemoveAll(filepath.Join(f.base, rel))
				}
			}
			if held >= 0 {
				unix.Close(held)
			}
			undo()
			if d := diff(before, f.snapshot()); d != "" {
				t.Fatalf("the plant was not undone:\n%s", d)
			}
		})
	}
	// Dead runners, terminal claims and other homes' claims do not hold
	// the import back.
	f.fm(0, "home", "import")
}

// [HOME-4] What cannot be made safe is refused with its path, and nothing
// changes: a link where a file must be, a staged package that does not give
// its receipt's digests, a record that does not parse, a file with two
// names, a linked directory, another owner (root only).
func TestImportRefusesUnsafe(t *testing.T) {
	t.Run("link", func(t *testing.T) {
		f := newFixture(t)
		p := filepath.Join(f.h.Inbox(), "web.2.adapter")
		f.must(os.Remove(p))
		f.must(os.Symlink(filepath.Join(f.h.Inbox(), "web.1.adapter"), p))
		f.importRefused("link-unsafe", p)
	})
	t.Run("transfer", func(t *testing.T) {
		f := newFixture(t)
		p := filepath.Join(f.unit(), "package", "firstmate-extension.json")
		data, err := os.ReadFile(p)
		f.must(err)
		f.write(p, append(data, ' '), 0o644)
		f.importRefused("integrity-mismatch", f.unit())
	})
	for _, c := range []struct {
		name, code string
		plant      func(f *fixture) string
	}{
		{"bad-record", "schema-invalid", func(f *fixture) string {
			p := filepath.Join(f.h.Registrations(), "web.source")
			f.write(p, []byte("adapter=../x\nargc=1\nargv:\n/bin/true\n"), 0o600)
			return p
		}},
		{"hard-link", "link-unsafe", func(f *fixture) string {
			p := filepath.Join(f.h.Inbox(), "web.1.result")
			f.must(os.Link(p, filepath.Join(f.base, "second-name")))
			return p
		}},
		{"linked-inbox", "link-unsafe", func(f *fixture) string {
			moved := filepath.Join(f.h.State, "inbox-elsewhere")
			f.must(os.Rename(f.h.Inbox(), moved))
			f.must(os.Symlink(moved, f.h.Inbox()))
			return f.h.Inbox()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			p := c.plant(f)
			f.importRefused(c.code, p)
		})
	}
	t.Run("owner", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("only root can give a file away")
		}
		f := newFixture(t)
		p := filepath.Join(f.h.Inbox(), "mail.3.result")
		f.must(os.Lchown(p, 65534, 65534))
		f.importRefused("owner-mismatch", p)
	})
}

// [HOME-4] [LIFE-1] Hostile homes: a stale lock of the earlier
// implementation whose link names another directory never gets that
// directory removed; a runner file without a pid refuses (nothing can be
// told); two imports at once both succeed and convert the home once.
func TestImportHostile(t *testing.T) {
	t.Run("lock-link-to-inbox", func(t *testing.T) {
		f := newFixture(t)
		lock := filepath.Join(f.h.Registrations(), lifecycleLockName)
		f.must(os.Remove(lock))
		f.must(os.Symlink("../procevent-inbox", lock))
		f.write(filepath.Join(f.h.Inbox(), "pid"), []byte(strconv.Itoa(deadPID(t))+"\n"), 0o600)
		f.fm(0, "home", "import")
		if len(mustInbox(f)) != 4 || exists(lock) {
			t.Fatal("the inbox was touched, or the stale lock is left")
		}
	})
	t.Run("runner-without-pid", func(t *testing.T) {
		f := newFixture(t)
		p := filepath.Join(f.h.Registrations(), "web.runner")
		f.write(p, []byte("not a pid\n"), 0o600)
		f.importRefused("home-busy", p)
	})
	t.Run("two-at-once", func(t *testing.T) {
		f := newFixture(t)
		var cmds []*exec.Cmd
		for range 2 {
			c := exec.Command(fmBin, "home", "import")
			c.Env = f.env
			f.must(c.Start())
			cmds = append(cmds, c)
		}
		for _, c := range cmds {
			if err := c.Wait(); err != nil {
				// The loser may find the winner's serve lock taken: busy,
				// nothing changed by it.
				if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
					t.Fatal(err)
				}
			}
		}
		f.fm(0, "home", "import")
		runs, _ := filepath.Glob(filepath.Join(f.h.Dir, "data", "imported", "2*"))
		if len(runs) != 1 || len(mustInbox(f)) != 4 {
			t.Fatalf("runs %v", runs)
		}
	})
}
