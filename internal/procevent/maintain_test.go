package procevent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/home"
)

// [CAP-2] [RUN-2] serve's maintenance re-announces from the inbox that is
// there now: after the inbox was replaced (moved away, made again), the
// next maintenance works on the new one rather than refusing every
// re-announce for the rest of serve's life.
func TestMaintenanceFollowsAReplacedInbox(t *testing.T) {
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
	defer d.close()
	if err := d.openInbox(true); err != nil {
		t.Fatal(err)
	}
	var log []string
	o := ServeOptions{Log: func(l string) { log = append(log, l) }, Warn: func(l string) { log = append(log, l) }}
	s := &supervisor{h: h, o: o, running: map[string]bool{}}
	s.maintain(context.Background(), d)
	if err := os.Rename(h.Inbox(), filepath.Join(dir, "old-inbox")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(h.Inbox(), 0o700); err != nil {
		t.Fatal(err)
	}
	s.maintain(context.Background(), d)
	if strings.Contains(strings.Join(log, "\n"), "re-announce") {
		t.Fatalf("maintenance after the inbox was replaced: %q", log)
	}
}
