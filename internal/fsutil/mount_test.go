package fsutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// [HOME-3] OnParentMount refuses a bind-mounted directory, by path and by
// descriptor, through OpenDir and CheckDir under a SameMount rule, and
// passes the same directory once it is unmounted (as any user).
func TestOnParentMount(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir, other := filepath.Join(base, "dir"), filepath.Join(base, "other")
	for _, d := range []string{dir, other} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	rule := DirRule{Perm: Exact0700, SameMount: true}
	if err := OnParentMount(dir, -1, "directory"); err != nil {
		t.Fatalf("a plain directory: %v", err)
	}
	if f, err := OpenDir(dir, rule); err != nil {
		t.Fatalf("OpenDir of a plain directory: %v", err)
	} else {
		f.Close()
	}
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root")
	}
	if out, err := exec.Command("mount", "--bind", other, dir).CombinedOutput(); err != nil {
		t.Skipf("mount --bind: %v %s", err, out)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	if err := CheckDir(dir, rule); !errcode.Is(err, errcode.PathUnsafe) {
		t.Fatalf("CheckDir of a mount point: %v", err)
	}
	if f, err := OpenDir(dir, rule); !errcode.Is(err, errcode.PathUnsafe) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("OpenDir of a mount point: %v", err)
	}
	if err := CheckDir(dir, DirRule{Perm: Exact0700}); err != nil {
		t.Fatalf("a rule without SameMount refused the mount point: %v", err)
	}
}
