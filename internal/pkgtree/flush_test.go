package pkgtree

import (
	"bytes"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// lossyFS mounts a small ext4 file system (no journal) whose loop device
// is backed by a file on a nearly full tmpfs: a write-back of more than about
// a megabyte of new data fails (ENOSPC from the backing file, an I/O error of
// the file system) while the page cache still reads the bytes back. It
// returns the mount point; root and losetup, mkfs.ext4 are needed.
func lossyFS(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount, losetup)")
	}
	for _, c := range []string{"losetup", "mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("needs %s", c)
		}
	}
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Skipf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	dir := t.TempDir()
	back, mnt := filepath.Join(dir, "back"), filepath.Join(dir, "mnt")
	must(t, os.Mkdir(back, 0o700))
	must(t, os.Mkdir(mnt, 0o700))
	run("mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", back)
	t.Cleanup(func() { exec.Command("umount", back).Run() })
	img := filepath.Join(back, "img")
	f, err := os.Create(img)
	must(t, err)
	must(t, f.Truncate(64<<20))
	f.Close()
	run("mkfs.ext4", "-q", "-O", "^has_journal", "-E", "lazy_itable_init=0", img)
	loop := run("losetup", "-f", "--show", img)
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	run("mount", loop, mnt)
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	var st unix.Statfs_t
	must(t, unix.Statfs(back, &st))
	free := int64(st.Bavail) * st.Bsize
	filler, err := os.Create(filepath.Join(back, "filler"))
	must(t, err)
	_, err = filler.Write(bytes.Repeat([]byte{1}, int(free-(1<<20))))
	filler.Close()
	must(t, err)
	return mnt
}

// TestInstallReportsAnEarlierWritebackError: [BIND-5] the one flush of a
// store copy reports every write-back error of the copy's bytes, also one
// that another process's syncfs (an operator's "sync -f", a concurrent bind)
// saw first: a file system reports an error to each open file once, from
// when that file was opened, so the descriptor that flushes must be open
// before the first byte of the copy is written. The bind then fails and
// leaves nothing in the store.
func TestInstallReportsAnEarlierWritebackError(t *testing.T) {
	mnt := lossyFS(t)
	big := make([]byte, 2<<20)
	rand.Read(big)
	src := newPkg(t, node{path: "a.bin", data: string(big)}, node{path: "b.bin", data: string(big[:1<<20])}, node{path: "c.bin", data: string(big[1<<20:])})
	tr := mustScan(t, src, Source)
	dst := filepath.Join(mnt, "store", strings.TrimPrefix(tr.Digest, "sha256:"))
	seen := false
	opts := Options{Progress: func(stage string, files, total int, _, _ int64) {
		if stage == StageCopying && files == total && !seen {
			seen = true
			// Someone else flushes the file system first and sees the
			// error.
			f, err := os.Open(mnt)
			must(t, err)
			defer f.Close()
			if unix.Syncfs(int(f.Fd())) == nil {
				t.Error("the lossy file system reported no write-back error")
			}
		}
	}}
	_, err := InstallWith(src, tr, dst, opts)
	if !seen {
		t.Fatal("the copy never reported its last file")
	}
	if err == nil {
		t.Fatal("bind succeeded although the copy's bytes never reached the disk")
	}
	onlyEntry(t, filepath.Dir(dst), "")
}
