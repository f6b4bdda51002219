package procevent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/wake"
)

// [CAP-2] [RUN-2] serve's maintenance re-announces from the inbox that is
// there now: after the inbox was replaced (moved away, made again), the
// next maintenance works on the new one rather than refusing every
// re-announce for the rest of serve's life.
func TestMaintenanceFollowsAReplacedInbox(t *testing.T) {
	h, d, s, log := maintenanceFixture(t)
	s.maintain(context.Background(), d)
	if err := os.Rename(h.Inbox(), filepath.Join(h.Root, "old-inbox")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(h.Inbox(), 0o700); err != nil {
		t.Fatal(err)
	}
	s.maintain(context.Background(), d)
	if strings.Contains(strings.Join(*log, "\n"), "re-announce") {
		t.Fatalf("maintenance after the inbox was replaced: %q", *log)
	}
}

// maintenanceFixture is a home with pinned dirs and a supervisor whose log
// is collected, re-announcing at once (interval 0).
func maintenanceFixture(t *testing.T) (*home.Home, *dirs, *supervisor, *[]string) {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	hd := filepath.Join(dir, "home")
	if err := os.Mkdir(hd, 0o700); err != nil {
		t.Fatal(err)
	}
	h := &home.Home{Root: dir, Dir: hd, State: filepath.Join(hd, "state")}
	d, err := openDirs(h, false, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.close)
	if err := d.openInbox(true); err != nil {
		t.Fatal(err)
	}
	log := new([]string)
	add := func(l string) { *log = append(*log, l) }
	s := &supervisor{h: h, o: ServeOptions{Log: add, Warn: add, Reannounce: 0}, running: map[string]bool{}}
	return h, d, s, log
}

// captureInto captures result seq of builtin source id into the inbox that
// is in place now, through a pin of its own.
func captureInto(t *testing.T, h *home.Home, id string, seq int64) {
	t.Helper()
	d, err := openDirs(h, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	if err := d.openInbox(false); err != nil {
		t.Fatal(err)
	}
	r := &Registration{Schema: RegistrationSchema, Kind: KindBuiltin, Adapter: "file-watch", SourceID: id}
	if _, _, err := d.capture(r, seq, []byte("x\n"), false); err != nil {
		t.Fatal(err)
	}
}

func wakeKeys(t *testing.T, h *home.Home) []string {
	t.Helper()
	ws, err := wake.List(h.State, 0)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, w := range ws {
		keys = append(keys, w.Key)
	}
	return keys
}

// [CAP-2] [CAP-6] Hostile review of the re-pinned inbox: a really replaced
// inbox is followed (its unhandled result is re-announced), while an inbox
// swapped for a link to another directory, or for a directory that fails the
// private rule, is refused: no wake is ever appended for a result read
// through it.
func TestMaintenanceFollowsOnlyACheckedInbox(t *testing.T) {
	h, d, s, log := maintenanceFixture(t)
	s.maintain(context.Background(), d)
	dir := filepath.Dir(h.Dir)
	// refused fails unless a maintenance refuses the inbox now in place
	// (what it is) and appends no wake for the result inside it.
	refused := func(t *testing.T, what string) {
		t.Helper()
		*log = nil
		s.maintain(context.Background(), d)
		if keys := wakeKeys(t, h); slices.Contains(keys, "procevent:evil:1") {
			t.Fatalf("re-announce read through %s: wakes %q", what, keys)
		}
		if !strings.Contains(strings.Join(*log, "\n"), "re-announce") {
			t.Fatalf("%s was not refused: log %q", what, *log)
		}
	}

	// A real replacement holding an unhandled result: followed.
	if err := os.Rename(h.Inbox(), filepath.Join(dir, "old-inbox")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(h.Inbox(), 0o700); err != nil {
		t.Fatal(err)
	}
	captureInto(t, h, "real", 1)
	s.maintain(context.Background(), d)
	if keys := wakeKeys(t, h); !slices.Contains(keys, "procevent:real:1") {
		t.Fatalf("the replaced inbox's result was not re-announced: wakes %q, log %q", keys, *log)
	}

	// A link to another directory holding a result: refused.
	evil := filepath.Join(dir, "evil")
	if err := os.Rename(h.Inbox(), evil); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(h.Inbox(), 0o700); err != nil {
		t.Fatal(err)
	}
	captureInto(t, h, "evil", 1)
	if err := os.Rename(h.Inbox(), filepath.Join(evil, "..", "evil2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "evil2"), h.Inbox()); err != nil {
		t.Fatal(err)
	}
	refused(t, "an inbox swapped for a link")

	// A group-writable directory in its place: refused.
	if err := os.Remove(h.Inbox()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "evil2"), h.Inbox()); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(h.Inbox(), 0o777); err != nil {
		t.Fatal(err)
	}
	refused(t, "a 0777 inbox")

	// Made private again: followed, and the pin held nothing stale.
	if err := os.Chmod(h.Inbox(), 0o700); err != nil {
		t.Fatal(err)
	}
	*log = nil
	s.maintain(context.Background(), d)
	if keys := wakeKeys(t, h); !slices.Contains(keys, "procevent:evil:1") {
		t.Fatalf("the inbox made private again was not followed: wakes %q, log %q", keys, *log)
	}
}
