package powercut

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// mountT mounts a powercut file system for a test, or skips the test where
// FUSE cannot be mounted (no /dev/fuse, no fusermount3, or an unprivileged
// user without a setuid fusermount3).
func mountT(t *testing.T, model Model) *FS {
	t.Helper()
	base := t.TempDir()
	mnt, work := filepath.Join(base, "mnt"), filepath.Join(base, "work")
	for _, d := range []string{mnt, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f, err := Mount(mnt, work, "", model)
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("powercut needs FUSE: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// fsys is what a case does on the mount, failing the test on any error.
type fsys struct {
	t   *testing.T
	dir string
}

func (s fsys) p(name string) string { return filepath.Join(s.dir, name) }

func (s fsys) must(err error) {
	s.t.Helper()
	if err != nil {
		s.t.Fatal(err)
	}
}

// write creates or truncates name with data; fsynced when sync.
func (s fsys) write(name, data string, sync bool) {
	s.t.Helper()
	f, err := os.OpenFile(s.p(name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	s.must(err)
	_, err = f.WriteString(data)
	s.must(err)
	if sync {
		s.must(f.Sync())
	}
	s.must(f.Close())
}

// syncDir fsyncs directory name ("" for the root).
func (s fsys) syncDir(name string) {
	s.t.Helper()
	f, err := os.Open(s.p(name))
	s.must(err)
	s.must(f.Sync())
	f.Close()
}

// durable writes name with data, fsyncs it and its directory.
func (s fsys) durable(name, data string) {
	s.t.Helper()
	s.write(name, data, true)
	s.syncDir(filepath.Dir(name))
}

// tmpfile writes data to an unnamed file in the root, fsynced when sync,
// and links it at name.
func (s fsys) tmpfile(name, data string, sync bool) {
	s.t.Helper()
	fd, err := unix.Open(s.dir, unix.O_WRONLY|unix.O_TMPFILE|unix.O_CLOEXEC, 0o600)
	s.must(err)
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(data))
	s.must(err)
	if sync {
		s.must(unix.Fsync(fd))
	}
	s.must(unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, s.p(name), unix.AT_SYMLINK_FOLLOW))
}

// want is a name's expected state after the cut: its content, or absent.
type want struct {
	name    string
	content string
	absent  bool
}

func TestPowercut(t *testing.T) {
	cases := []struct {
		name  string
		model Model
		do    func(s fsys)
		want  []want
	}{
		{"an unsynced write is lost", Strict, func(s fsys) {
			s.durable("a", "old")
			s.write("a", "new", false)
		}, []want{{name: "a", content: "old"}}},
		{"a synced write survives", Strict, func(s fsys) {
			s.durable("a", "old")
			s.write("a", "new", true)
		}, []want{{name: "a", content: "new"}}},
		{"a new file fsynced without its directory loses its name", Strict, func(s fsys) {
			s.write("a", "data", true)
		}, []want{{name: "a", absent: true}}},
		{"a name synced before its file's bytes is an empty file", Strict, func(s fsys) {
			s.write("a", "data", false)
			s.syncDir("")
		}, []want{{name: "a", content: ""}}},
		{"rename and directory fsync survive", Strict, func(s fsys) {
			s.durable("a", "A")
			s.must(os.Rename(s.p("a"), s.p("b")))
			s.syncDir("")
		}, []want{{name: "a", absent: true}, {name: "b", content: "A"}}},
		{"rename without directory fsync is lost", Strict, func(s fsys) {
			s.durable("a", "A")
			s.must(os.Rename(s.p("a"), s.p("b")))
		}, []want{{name: "a", content: "A"}, {name: "b", absent: true}}},
		{"rename over a name and directory fsync survive", Strict, func(s fsys) {
			s.durable("a", "A")
			s.durable("b", "B")
			s.must(os.Rename(s.p("a"), s.p("b")))
			s.syncDir("")
		}, []want{{name: "a", absent: true}, {name: "b", content: "A"}}},
		{"a rename between directories is durable with its destination", Strict, func(s fsys) {
			s.must(os.Mkdir(s.p("d"), 0o700))
			s.syncDir("")
			s.durable("a", "A")
			s.must(os.Rename(s.p("a"), s.p("d/a")))
			s.syncDir("d")
		}, []want{{name: "a", absent: true}, {name: "d/a", content: "A"}}},
		{"a rename between directories synced at its source alone loses the entry", Strict, func(s fsys) {
			s.must(os.Mkdir(s.p("d"), 0o700))
			s.syncDir("")
			s.durable("a", "A")
			s.must(os.Rename(s.p("a"), s.p("d/a")))
			s.syncDir("")
		}, []want{{name: "a", absent: true}, {name: "d/a", absent: true}}},
		{"tmpfile, fsync, linkat and directory fsync survive", Strict, func(s fsys) {
			s.tmpfile("a", "T", true)
			s.syncDir("")
		}, []want{{name: "a", content: "T"}}},
		{"tmpfile linked without its directory synced is lost", Strict, func(s fsys) {
			s.tmpfile("a", "T", true)
		}, []want{{name: "a", absent: true}}},
		{"tmpfile linked and named without its bytes synced is empty", Strict, func(s fsys) {
			s.tmpfile("a", "T", false)
			s.syncDir("")
		}, []want{{name: "a", content: ""}}},
		{"EXCHANGE before the directory fsync leaves the old state", Strict, func(s fsys) {
			s.durable("a", "A")
			s.durable("b", "B")
			s.must(unix.Renameat2(unix.AT_FDCWD, s.p("a"), unix.AT_FDCWD, s.p("b"), unix.RENAME_EXCHANGE))
		}, []want{{name: "a", content: "A"}, {name: "b", content: "B"}}},
		{"EXCHANGE and directory fsync survive", Strict, func(s fsys) {
			s.durable("a", "A")
			s.durable("b", "B")
			s.must(unix.Renameat2(unix.AT_FDCWD, s.p("a"), unix.AT_FDCWD, s.p("b"), unix.RENAME_EXCHANGE))
			s.syncDir("")
		}, []want{{name: "a", content: "B"}, {name: "b", content: "A"}}},
		{"NOREPLACE refuses an existing name and changes nothing", Strict, func(s fsys) {
			s.durable("a", "A")
			s.durable("b", "B")
			if err := unix.Renameat2(unix.AT_FDCWD, s.p("a"), unix.AT_FDCWD, s.p("b"), unix.RENAME_NOREPLACE); err != unix.EEXIST {
				s.t.Fatalf("RENAME_NOREPLACE onto a name: %v, want EEXIST", err)
			}
			s.must(unix.Renameat2(unix.AT_FDCWD, s.p("a"), unix.AT_FDCWD, s.p("c"), unix.RENAME_NOREPLACE))
			s.syncDir("")
		}, []want{{name: "a", absent: true}, {name: "b", content: "B"}, {name: "c", content: "A"}}},
		{"an unsynced truncate is lost", Strict, func(s fsys) {
			s.durable("a", "hello")
			s.must(os.Truncate(s.p("a"), 2))
		}, []want{{name: "a", content: "hello"}}},
		{"a synced truncate and a synced growth survive", Strict, func(s fsys) {
			s.durable("a", "hello")
			s.durable("b", "hi")
			for name, size := range map[string]int64{"a": 2, "b": 4} {
				f, err := os.OpenFile(s.p(name), os.O_WRONLY, 0)
				s.must(err)
				s.must(f.Truncate(size))
				s.must(f.Sync())
				f.Close()
			}
		}, []want{{name: "a", content: "he"}, {name: "b", content: "hi\x00\x00"}}},
		{"a hard link and directory fsync survive, one inode", Strict, func(s fsys) {
			s.durable("a", "A")
			s.must(os.Link(s.p("a"), s.p("b")))
			s.syncDir("")
		}, []want{{name: "a", content: "A"}, {name: "b", content: "A"}}},
		{"a hard link without directory fsync is lost", Strict, func(s fsys) {
			s.durable("a", "A")
			s.must(os.Link(s.p("a"), s.p("b")))
		}, []want{{name: "a", content: "A"}, {name: "b", absent: true}}},
		{"unlink of an open file, synced, is durable", Strict, func(s fsys) {
			s.durable("a", "A")
			f, err := os.OpenFile(s.p("a"), os.O_WRONLY, 0)
			s.must(err)
			defer f.Close()
			s.must(os.Remove(s.p("a")))
			_, err = f.WriteAt([]byte("Z"), 0)
			s.must(err)
			s.must(f.Sync())
			s.syncDir("")
		}, []want{{name: "a", absent: true}}},
		{"unlink of an open file, unsynced, leaves it with its synced bytes", Strict, func(s fsys) {
			s.durable("a", "A")
			f, err := os.OpenFile(s.p("a"), os.O_WRONLY, 0)
			s.must(err)
			defer f.Close()
			s.must(os.Remove(s.p("a")))
			_, err = f.WriteAt([]byte("Z"), 0)
			s.must(err)
			s.must(f.Sync())
		}, []want{{name: "a", content: "Z"}}},
		{"a new directory whose parent is not synced is lost with its files", Strict, func(s fsys) {
			s.must(os.Mkdir(s.p("d"), 0o700))
			s.durable("d/a", "A")
		}, []want{{name: "d", absent: true}}},
		{"ordered: any sync commits every name and byte before it", Ordered, func(s fsys) {
			s.durable("a", "old")
			s.write("b", "B", false)
			s.must(os.Rename(s.p("a"), s.p("c")))
			s.write("x", "X", true)
		}, []want{{name: "a", absent: true}, {name: "b", content: "B"}, {name: "c", content: "old"}, {name: "x", content: "X"}}},
		{"ordered: nothing after the last sync survives", Ordered, func(s fsys) {
			s.durable("a", "old")
			s.write("a", "new", false)
			s.write("b", "B", false)
		}, []want{{name: "a", content: "old"}, {name: "b", absent: true}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := mountT(t, c.model)
			c.do(fsys{t: t, dir: f.Dir()})
			if err := f.Cut(); err != nil {
				t.Fatal(err)
			}
			check(t, f.Dir(), c.want)
		})
	}
}

func check(t *testing.T, dir string, wants []want) {
	t.Helper()
	for _, w := range wants {
		data, err := os.ReadFile(filepath.Join(dir, w.name))
		switch {
		case w.absent && !errors.Is(err, os.ErrNotExist):
			t.Errorf("%s after the cut: %q, %v; want it absent", w.name, data, err)
		case w.absent:
		case err != nil:
			t.Errorf("%s after the cut: %v; want %q", w.name, err, w.content)
		case string(data) != w.content:
			t.Errorf("%s after the cut: %q, want %q", w.name, data, w.content)
		}
	}
}

// TestHardLinkIsOneInode: a hard link made durable comes back as a second
// name of the same inode, not a copy.
func TestHardLinkIsOneInode(t *testing.T) {
	f := mountT(t, Strict)
	s := fsys{t: t, dir: f.Dir()}
	s.durable("a", "A")
	s.must(os.Link(s.p("a"), s.p("b")))
	s.syncDir("")
	s.must(f.Cut())
	var a, b unix.Stat_t
	s.must(unix.Lstat(s.p("a"), &a))
	s.must(unix.Lstat(s.p("b"), &b))
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Fatalf("a (inode %d, %d links) and b (inode %d) after the cut: want one inode with 2 links", a.Ino, a.Nlink, b.Ino)
	}
}

// TestArmCutsBeforeTheOperation: an armed cut drops the k-th operation and
// everything after it, and keeps what was durable before it.
func TestArmCutsBeforeTheOperation(t *testing.T) {
	f := mountT(t, Strict)
	f.Trace = true
	s := fsys{t: t, dir: f.Dir()}
	s.durable("a", "A")
	n0, _ := f.Ops()
	s.durable("b", "B") // create, write, fsync, fsync-dir
	n, ops := f.Ops()
	if n-n0 != 4 {
		t.Fatalf("a durable write counted %d operations, want 4: %q", n-n0, ops[n0:])
	}
	for k := 1; k <= 5; k++ {
		t.Run(strconv.Itoa(k), func(t *testing.T) {
			f := mountT(t, Strict)
			s := fsys{t: t, dir: f.Dir()}
			s.durable("a", "A")
			f.Arm(k)
			f2, err := os.OpenFile(s.p("b"), os.O_WRONLY|os.O_CREATE, 0o600)
			if err == nil {
				_, err = f2.WriteString("B")
				if err == nil {
					err = f2.Sync()
				}
				f2.Close()
			}
			if err == nil {
				err = syncDirErr(f.Dir())
			}
			if cut := f.CutHappened(); cut != (err != nil) || cut != (k <= 4) {
				t.Fatalf("cut before operation %d: cut %v, error %v", k, cut, err)
			}
			s.must(f.Cut())
			bWant := want{name: "b", absent: true}
			if k > 4 {
				bWant = want{name: "b", content: "B"}
			}
			check(t, f.Dir(), []want{{name: "a", content: "A"}, bWant})
		})
	}
}

func syncDirErr(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
