package fsutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ino returns the inode number of path.
func ino(t *testing.T, path string) uint64 {
	t.Helper()
	info, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Sys().(*syscall.Stat_t).Ino
}

// [CAP-1] [HOME-4] With spares kept in a directory, a durable replace keeps
// the replaced file and the next write reuses it; a removal (RetireAt)
// keeps the removed file under a temporary name of this process, and the
// next create reuses it: after a first round, no write allocates a new
// inode. What is read back is always what was last written (a reused file
// is cut to size). A plain ReplaceAt or RemoveAt keeps nothing. When the
// keeper is done the spares are unlinked; without a keeper nothing is left
// behind.
func TestSparesReused(t *testing.T) {
	t.Parallel()
	dir := privateDir(t)
	d := pinDir(t, dir, DirRule{Perm: Exact0700})
	done := KeepSpares(dir, nil)
	for _, v := range []string{"a longer first version\n", "2\n"} {
		if err := ReplaceKeepingAt(d, "counter", []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	inodes := map[uint64]bool{}
	for _, n := range names(t, dir) {
		inodes[ino(t, filepath.Join(dir, n))] = true
		if n != "counter" && !IsTempName(n) || TempDead(n) {
			t.Fatalf("%s: not a temporary file of this process", n)
		}
	}
	if len(inodes) != 2 {
		t.Fatalf("after two replaces: %v, want the counter and one spare", names(t, dir))
	}
	for i := range 5 {
		v := []byte{byte('3' + i), '\n'}
		if err := ReplaceKeepingAt(d, "counter", v); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "counter")); !slices.Equal(b, v) {
			t.Fatalf("counter = %q, want %q", b, v)
		}
		if err := CreateAt(d, "marker", nil); err != nil {
			t.Fatal(err)
		}
		if err := RemoveKeepingAt(d, "marker"); err != nil {
			t.Fatal(err)
		}
		for _, n := range names(t, dir) {
			if i > 0 && !inodes[ino(t, filepath.Join(dir, n))] {
				t.Fatalf("round %d: %s is a new file: spares were not reused", i, n)
			}
			inodes[ino(t, filepath.Join(dir, n))] = true
		}
	}
	if removed, err := RetireAt(d, "marker"); removed || err != nil {
		t.Fatalf("RetireAt of an absent name = %v, %v", removed, err)
	}
	before := names(t, dir)
	if err := ReplaceAt(d, "counter", []byte("8\n")); err != nil {
		t.Fatal(err)
	}
	if err := CreateAt(d, "plain", nil); err != nil {
		t.Fatal(err)
	}
	if err := RemoveAt(d, "plain"); err != nil {
		t.Fatal(err)
	}
	if after := names(t, dir); len(after) != len(before)-1 {
		t.Fatalf("a plain replace and removal (using one spare) kept files: %q, then %q", before, after)
	}
	done()
	if got := names(t, dir); !slices.Equal(got, []string{"counter"}) {
		t.Fatalf("after the keeper is done: %q", got)
	}
	if err := ReplaceAt(d, "counter", []byte("9\n")); err != nil {
		t.Fatal(err)
	}
	if err := CreateAt(d, "marker", nil); err != nil {
		t.Fatal(err)
	}
	if removed, err := RetireAt(d, "marker"); !removed || err != nil {
		t.Fatal(removed, err)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"counter"}) {
		t.Fatalf("without a keeper: %q", got)
	}
}

// [HOME-4] A spare is reused only while it is a plain 0600 file of this
// user with one link: a symbolic link, a hard link or a file of another
// mode put at a spare's name is unlinked, never written through, and the
// write goes to a new file. A file too big to keep is not kept.
func TestUnfitSparesDropped(t *testing.T) {
	t.Parallel()
	for _, plant := range []string{"symlink", "hardlink", "mode", "big"} {
		t.Run(plant, func(t *testing.T) {
			t.Parallel()
			dir := privateDir(t)
			d := pinDir(t, dir, DirRule{Perm: Exact0700})
			defer KeepSpares(dir, nil)()
			data := []byte("small")
			if plant == "big" {
				data = make([]byte, spareSize+1)
			}
			if err := CreateAt(d, "x", data); err != nil {
				t.Fatal(err)
			}
			if _, err := RetireAt(d, "x"); err != nil {
				t.Fatal(err)
			}
			spare := names(t, dir)
			if plant == "big" {
				if len(spare) != 0 {
					t.Fatalf("a file of %d bytes was kept: %q", len(data), spare)
				}
				return
			}
			if len(spare) != 1 {
				t.Fatalf("spares: %q", spare)
			}
			path := filepath.Join(dir, spare[0])
			victim := filepath.Join(t.TempDir(), "victim")
			if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
				t.Fatal(err)
			}
			os.Remove(path)
			var err error
			switch plant {
			case "symlink":
				err = os.Symlink(victim, path)
			case "hardlink":
				err = os.Link(victim, path)
			case "mode":
				if err = os.WriteFile(path, []byte("x"), 0o600); err == nil {
					err = os.Chmod(path, 0o644)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := CreateAt(d, "y", []byte("new")); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(victim); string(b) != "keep" {
				t.Fatalf("written through the planted %s: %q", plant, b)
			}
			if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the planted %s is still there: %v", plant, err)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "y")); string(b) != "new" {
				t.Fatalf("y = %q", b)
			}
		})
	}
}

// [HOME-4] A reader of a name by ReadPrivateAt never gets the bytes of
// another file: while a writer keeps replacing two counters in a directory
// with spares, so that the file a reader opened as one may be rewritten as
// the other once it left its name, every read of each counter returns that
// counter's own bytes.
func TestReadAtUnderSpareReuse(t *testing.T) {
	t.Parallel()
	dir := privateDir(t)
	d := pinDir(t, dir, DirRule{Perm: Exact0700})
	defer KeepSpares(dir, nil)()
	for _, n := range []string{"a", "b"} {
		if err := ReplaceKeepingAt(d, n, []byte(n)); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	writes := make(chan int)
	go func() {
		i := 0
		for ; ; i++ {
			select {
			case <-stop:
				writes <- i
				return
			default:
			}
			n := []string{"a", "b"}[i%2]
			if err := ReplaceKeepingAt(d, n, []byte(strings.Repeat(n, 1+i%7))); err != nil {
				panic(err)
			}
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	reads := 0
	for ; time.Now().Before(deadline); reads++ {
		n := []string{"a", "b"}[reads%2]
		b, err := ReadPrivateAt(d, n, 64)
		if err != nil || len(b) == 0 || strings.Trim(string(b), n) != "" {
			close(stop)
			<-writes
			t.Fatalf("read %d of %s = %q, %v", reads, n, b, err)
		}
	}
	close(stop)
	t.Logf("%d reads beside %d replaces", reads, <-writes)
}

// [HOME-4] A reader of a name never takes the bytes of another name's file
// for it, even when the name gets its file back: with spares kept in a
// directory, a file removed from "reg" stays linked under a temporary name,
// the next write, of "seq", reuses it, and a later "reg" may reuse it
// again, so a look at the name after reading would find the same file.
// ReadPrivateAt that opened "reg" before the removal must answer "reg" as
// it was or "not there", never "seq"'s bytes.
func TestSpareNeverReadAsAnotherName(t *testing.T) {
	dir := privateDir(t)
	d := pinDir(t, dir, DirRule{Perm: Exact0700})
	defer KeepSpares(dir, nil)()
	reg := []byte(`{"registration":"the whole of it, longer than a counter"}` + "\n")
	stop := make(chan struct{})
	wrote := make(chan int)
	go func() {
		n := 0
		defer func() { wrote <- n }()
		for ; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := CreateAt(d, "reg", reg); err != nil {
				t.Error(err)
				return
			}
			if err := RemoveKeepingAt(d, "reg"); err != nil {
				t.Error(err)
				return
			}
			if err := ReplaceKeepingAt(d, "seq", []byte("12\n")); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	bad := 0
	deadline := time.Now().Add(3 * time.Second)
	reads := 0
	for ; time.Now().Before(deadline) && bad == 0; reads++ {
		data, err := ReadPrivateAt(d, "reg", 1<<10)
		if err != nil && !os.IsNotExist(err) {
			t.Errorf("read reg: %v", err)
			bad++
		}
		if err == nil && !slices.Equal(data, reg) {
			t.Errorf("read reg: %q, another file's bytes", data)
			bad++
		}
	}
	close(stop)
	n := <-wrote
	t.Logf("%d reads against %d rounds", reads, n)
}

// [HOME-4] A removal that would keep a spare removes only what a plain
// removal would: a directory at the name is refused as before (not moved
// aside under a temporary name), and a symbolic link is unlinked, not kept.
func TestRetireKeepsOnlyFiles(t *testing.T) {
	t.Parallel()
	dir := privateDir(t)
	d := pinDir(t, dir, DirRule{Perm: Exact0700})
	defer KeepSpares(dir, nil)()
	if err := os.Mkdir(filepath.Join(dir, "planted"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := RemoveKeepingAt(d, "planted"); err == nil {
		t.Fatal("a directory at the name was removed")
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := RemoveKeepingAt(d, "link"); err != nil {
		t.Fatal(err)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"planted"}) {
		t.Fatalf("left %q, want only the planted directory", got)
	}
}

// A serve whose sources answer at once retires one pending marker per
// source (and owner records per poll) within milliseconds, before the next
// writes take them back. The pool keeps a burst of 1,000 whole, so none of
// those files is unlinked (an unlinked inode is one every create for the
// next ~30 s searches past on ext4 without a journal), and never more than
// spareMax: the rest of a larger burst is unlinked.
func TestSparePoolKeepsABurst(t *testing.T) {
	t.Parallel()
	dir := privateDir(t)
	d := pinDir(t, dir, DirRule{Perm: Exact0700})
	done := KeepSpares(dir, nil)
	defer done()
	retire := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			name := fmt.Sprintf("s%04d.pending", i)
			if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if removed, err := RetireAt(d, name); err != nil || !removed {
				t.Fatalf("retire %s: %v %v", name, removed, err)
			}
		}
	}
	retire(0, 1000)
	if n := len(names(t, dir)); n != 1000 {
		t.Fatalf("after a burst of 1,000: %d spares kept, want all of them", n)
	}
	retire(1000, spareMax+3)
	kept := names(t, dir)
	if len(kept) != spareMax {
		t.Fatalf("%d spares kept, want spareMax (%d)", len(kept), spareMax)
	}
	for _, n := range kept {
		if !IsTempName(n) {
			t.Fatalf("%s: not a spare", n)
		}
	}
}

// [WAKE-1] A spare is reused only if its name holds a plain file that is
// not the root of a mount, looked at before it is opened: a FIFO planted at
// a spare's name is not opened, which would hang up its reader, and a file
// bind-mounted there (as root) is not written through. Both are
// ErrNotSpare.
func TestReuseOpensOnlyAPlainFile(t *testing.T) {
	t.Parallel()
	dir := privateDir(t)
	d := pinDir(t, dir, DirRule{Perm: Exact0700})
	spare := filepath.Join(dir, "spare")
	if err := unix.Mkfifo(spare, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(spare, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if p, err := NewAt(d, NewOptions{Temp: "spare", Reuse: true}); !errors.Is(err, ErrNotSpare) {
		t.Fatalf("reuse of a FIFO: %v %v", p, err)
	}
	// A FIFO's reader is hung up once a writer opened and closed it.
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if _, err := unix.Poll(fds, 0); err != nil || fds[0].Revents&unix.POLLHUP != 0 {
		t.Fatalf("the FIFO was opened for writing (%v)", err)
	}
	if os.Geteuid() != 0 {
		return
	}
	os.Remove(spare)
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(spare, nil, 0o600)
	if err := unix.Mount(target, spare, "", unix.MS_BIND, ""); err != nil {
		t.Skip("no bind mount here:", err)
	}
	defer unix.Unmount(spare, unix.MNT_DETACH)
	p, err := NewAt(d, NewOptions{Temp: "spare", Reuse: true})
	if err == nil {
		p.Write([]byte("2\n"))
		p.Abort()
	}
	if got, _ := os.ReadFile(target); !errors.Is(err, ErrNotSpare) || string(got) != "precious\n" {
		t.Fatalf("reuse of a file mounted at the name: %v, the file now holds %q", err, got)
	}
}
