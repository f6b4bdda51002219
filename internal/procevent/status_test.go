package procevent_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/procevent"
)

// hold takes the lock path, as a runner holds its claim and serve its lock,
// until the test ends.
func hold(t *testing.T, path string) {
	t.Helper()
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	l, err := fsutil.Lock(context.Background(), dir, filepath.Base(path), fsutil.LockOptions{Try: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Release)
}

// [RUN-2] [RUN-4] [CAP-8] ReadStatus, fm doctor's view of the core: it
// creates nothing, sees a running serve and a live claim without taking
// them from their holders, and counts unhandled results.
func TestReadStatus(t *testing.T) {
	f := newFixture(t)
	st, err := procevent.ReadStatus(f.h)
	if err != nil || st.Serving || len(st.Sources) != 0 || st.Results != 0 {
		t.Fatalf("empty home: %+v, %v", st, err)
	}
	if _, err := os.Lstat(f.h.State); !os.IsNotExist(err) {
		t.Fatalf("ReadStatus created the state root: %v", err)
	}

	f.ok("procevent", "register", "file-watch", "w1", "--", "/bin/echo", "a result")
	f.ok("procevent", "start", "w1")
	st, err = procevent.ReadStatus(f.h)
	if err != nil || st.Serving || len(st.Sources) != 1 || st.Results != 1 || st.Unhandled != 1 {
		t.Fatalf("after a capture: %+v, %v", st, err)
	}
	if s := st.Sources[0]; s != (procevent.SourceStatus{SourceID: "w1", Adapter: "file-watch", Kind: procevent.KindBuiltin, Owner: "built-in"}) {
		t.Fatalf("source %+v", s)
	}
	serveLock := filepath.Join(f.h.Registrations(), "serve.lock")
	if _, err := os.Lstat(serveLock); !os.IsNotExist(err) {
		t.Fatalf("ReadStatus created %s: %v", serveLock, err)
	}

	hold(t, serveLock)
	hold(t, filepath.Join(f.h.Registrations(), "w1.claim"))
	for range 2 { // the probe leaves both locks with their holders
		st, err = procevent.ReadStatus(f.h)
		if err != nil || !st.Serving || !st.Sources[0].Polling {
			t.Fatalf("with serve and a runner: %+v, %v", st, err)
		}
	}
	if out := f.ok("procevent", "start", "w1"); out != "already owned: w1\n" {
		t.Fatalf("the claim was released: start printed %q", out)
	}

	f.ok("procevent", "handled", "w1", "1")
	if st, err = procevent.ReadStatus(f.h); err != nil || st.Unhandled != 0 || st.Results != 1 {
		t.Fatalf("after handled: %+v, %v", st, err)
	}
}

// [STAT-1] The counts of a status file stay in 0..MaxSeq, the integers its
// JSON keeps exactly: a count at the bound stops there instead of wrapping
// (fm then refused the file it had written itself, and with it the
// collapse of [OP-5]), and a file with a count outside is not trusted.
func TestStatusCountsStayExact(t *testing.T) {
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.mode("poll", "exit7")
	f.ok("procevent", "reconcile")
	path := filepath.Join(f.h.State, "procevent-status", "s1.json")
	set := func(failures, count string) {
		t.Helper()
		doc := f.read(path)
		doc = regexp.MustCompile(`"consecutive_failures":-?[0-9]+`).ReplaceAllString(doc, `"consecutive_failures":`+failures)
		doc = regexp.MustCompile(`"count":-?[0-9]+`).ReplaceAllString(doc, `"count":`+count)
		f.write(path, doc, 0o600)
	}
	max := strconv.FormatInt(procevent.MaxSeq, 10)
	set(max, max)
	f.ok("procevent", "reconcile")
	doc := f.read(path)
	if !strings.Contains(doc, `"consecutive_failures":`+max) || !strings.Contains(doc, `"count":`+max) {
		t.Fatalf("counts at the bound did not stay there: %s", doc)
	}
	if out := f.ok("procevent", "status", "s1"); strings.Contains(out, "not trusted") {
		t.Fatalf("fm no longer trusts the file it wrote:\n%s", out)
	}
	for _, c := range [][2]string{{"-1", "1"}, {"1", "-1"}, {"1", "0"}, {max + "0", "1"}} {
		set(c[0], c[1])
		if out := f.ok("procevent", "status", "s1"); !strings.Contains(out, "not trusted") {
			t.Fatalf("failures %s, count %s trusted:\n%s", c[0], c[1], out)
		}
		set("1", "1")
	}
}
