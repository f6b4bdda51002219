package fsutil

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// [OP-3] [CLI-3] ENOSPC for real: publishing into a full file system (a
// one-page tmpfs) is host-resource, and leaves no temp file behind. Needs
// root with CAP_SYS_ADMIN to mount; skipped otherwise.
func TestPublishOnFullDisk(t *testing.T) {
	dir, d := fullDisk(t)
	err := CreateAt(d, "big", bytes.Repeat([]byte("x"), 64<<10))
	if got := errcode.Of(err); got != errcode.HostResource {
		t.Fatalf("publish on a full disk: %s (%v), want host-resource", got, err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		t.Errorf("left behind: %s", e.Name())
	}
}

// A temp name proves whether its writer runs: named for a live process it
// is kept, named for the same process once it has exited it is swept; a
// name without a writer is kept unless the caller holds the writers' lock,
// and a swept temp directory may hold 0555 directories.
func TestTempSweepForReal(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	start, ok := startTime(cmd.Process.Pid)
	if !ok {
		t.Fatal("no start time for the child")
	}
	writer := TempPrefix + strconv.Itoa(cmd.Process.Pid) + "-" + strconv.FormatUint(start, 10) + "-0123456789abcdef"
	mine := TempName()
	legacy := TempPrefix + "0123456789abcdef01234567"
	for _, n := range []string{writer, mine, legacy, "keep.json"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	store := filepath.Join(dir, TempPrefix+"1-1-0123456789abcdef") // pid 1 never has start time 1 here
	if err := os.MkdirAll(filepath.Join(store, "bin"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(store, "bin"), 0o555)
	os.Chmod(store, 0o555)

	names := func() []string {
		ents, _ := os.ReadDir(dir)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		slices.Sort(out)
		return out
	}
	if TempDead(writer) || TempDead(mine) || TempDead(legacy) || !TempDead(filepath.Base(store)) {
		t.Fatalf("TempDead: live writer %v, self %v, legacy %v, pid 1 with another start %v", TempDead(writer), TempDead(mine), TempDead(legacy), TempDead(filepath.Base(store)))
	}
	if n, err := SweepTemps(dir, false); err != nil || n != 1 {
		t.Fatalf("sweep with the writer alive: %d, %v", n, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if !TempDead(writer) {
		t.Fatal("the writer exited but its temp is not dead")
	}
	if n, err := SweepTemps(dir, false); err != nil || n != 1 {
		t.Fatalf("sweep after the writer exited: %d, %v", n, err)
	}
	if got, want := names(), []string{legacy, mine, "keep.json"}; !slices.Equal(got, want) {
		t.Fatalf("left %q, want %q", got, want)
	}
	if n, err := SweepTemps(dir, true); err != nil || n != 2 {
		t.Fatalf("sweep under the writers' lock: %d, %v", n, err)
	}
	if got := names(); !slices.Equal(got, []string{"keep.json"}) {
		t.Fatalf("left %q", got)
	}
}

// [CLI-3] The words of an ENOSPC stay what they were before the layer: a
// write that fails names the file written, as os.File.Write does ("write
// <dir>: ..." for an unnamed file, "write <dir>/<temp>: ..." for a named
// one), so procevent's and the wake queue's error output is unchanged.
func TestWriteErrorNamesTheFile(t *testing.T) {
	dir, d := fullDisk(t)
	big := bytes.Repeat([]byte("x"), 64<<10)
	err := CreateAt(d, "big", big)
	if want := `write a file in "` + dir + `": write ` + dir + `: no space left on device`; err == nil || !strings.HasSuffix(err.Error(), want) {
		t.Errorf("CreateAt on a full disk: %v, want it to end %q", err, want)
	}
	p, err := NewAt(d, NewOptions{Temp: "named.tmp", Stale: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Abort()
	_, err = p.Write(big)
	if want := "write " + filepath.Join(dir, "named.tmp") + ": no space left on device"; err == nil || err.Error() != want {
		t.Errorf("Pending.Write of a named temp on a full disk: %v, want %q", err, want)
	}
}

// fullDisk mounts a one-page tmpfs on a new directory and returns it, pinned;
// it skips the test where mounting needs privileges this process lacks.
func fullDisk(t *testing.T) (string, *os.File) {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4k,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v): run as root with CAP_SYS_ADMIN", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	d, err := OpenDir(dir, DirRule{Perm: Exact0700})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return dir, d
}
