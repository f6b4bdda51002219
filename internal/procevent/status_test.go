package procevent_test

import (
	"context"
	"os"
	"path/filepath"
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
