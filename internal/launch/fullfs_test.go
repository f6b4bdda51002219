package launch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// [GRP-1] A record that cannot be written on a full file system fails with
// the words it had before the records moved onto fsutil's layer: "write
// invocation record <path>: no space left on device", the errno alone. Needs
// root with CAP_SYS_ADMIN to mount a one-page tmpfs; skipped otherwise.
func TestRecordWriteOnFullDisk(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4k,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v): run as root with CAP_SYS_ADMIN", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	// The one page is taken; a new file can be created but not written.
	if err := os.WriteFile(filepath.Join(dir, "fill"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	records := filepath.Join(dir, "records")
	d, err := openRecordDir(records, true)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	name := strings.Repeat("a", keyedHex) + recordSuffix
	err = d.publish(name, Identity{PID: 1, StartTime: 1}, []byte(`{"x":1}`))
	want := "write invocation record " + filepath.Join(records, name) + ": no space left on device"
	if err == nil || !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("publish on a full disk: %v, want it to end %q", err, want)
	}
	if ents, _ := os.ReadDir(records); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}
