package fsutil

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// [OP-3] [CLI-3] ENOSPC for real: publishing into a full file system (a
// one-page tmpfs) is host-resource, and leaves no temp file behind. Needs
// root with CAP_SYS_ADMIN to mount; skipped otherwise.
func TestPublishOnFullDisk(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4k,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v): run as root with CAP_SYS_ADMIN", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	err := PublishNoReplace(dir, filepath.Join(dir, "big"), bytes.Repeat([]byte("x"), 64<<10), 0o600)
	if got := errcode.Of(err); got != errcode.HostResource {
		t.Fatalf("publish on a full disk: %s (%v), want host-resource", got, err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		t.Errorf("left behind: %s", e.Name())
	}
}
