package pkgtree

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
)

// node is one entry of a test tree: a path ending in "/" is a directory (mode
// 0755 unless mode is set), anything else a file with data and mode (0644
// unless set). Modes are set explicitly so the umask does not matter.
type node struct {
	path string
	data string
	mode os.FileMode
}

// newPkg creates an empty package root, mode 0755, in a fresh temp dir.
func newPkg(t testing.TB, nodes ...node) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "pkg")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	chmod(t, root, 0o755)
	writeTree(t, root, nodes...)
	return root
}

func writeTree(t testing.TB, root string, nodes ...node) {
	t.Helper()
	for _, n := range nodes {
		p := filepath.Join(root, filepath.FromSlash(n.path))
		if strings.HasSuffix(n.path, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			chmod(t, p, cmp(n.mode, 0o755))
			continue
		}
		if err := os.WriteFile(p, []byte(n.data), 0o600); err != nil {
			t.Fatal(err)
		}
		chmod(t, p, cmp(n.mode, 0o644))
	}
}

func cmp(m, def os.FileMode) os.FileMode {
	if m == 0 {
		return def
	}
	return m
}

func chmod(t testing.TB, p string, m os.FileMode) {
	t.Helper()
	if err := os.Chmod(p, m); err != nil {
		t.Fatal(err)
	}
}

// errOf is the error of a call that also returns a tree.
func errOf(_ *Tree, err error) error { return err }

func wantCode(t testing.TB, err error, code errcode.Code) {
	t.Helper()
	if code == "" {
		if err != nil {
			t.Fatalf("unexpected error [%s]: %v", errcode.Of(err), err)
		}
		return
	}
	if err == nil {
		t.Fatalf("got no error, want %s", code)
	}
	if got := errcode.Of(err); got != code {
		t.Fatalf("got error [%s] %v, want %s", got, err, code)
	}
	if msg := err.Error(); msg == "" || strings.ToLower(msg[:1]) != msg[:1] {
		t.Errorf("message %q is not lower-case", msg)
	}
}

func mustScan(t testing.TB, root string, p Policy) *Tree {
	t.Helper()
	tr, err := Scan(root, p)
	if err != nil {
		t.Fatalf("Scan(%s): [%s] %v", root, errcode.Of(err), err)
	}
	return tr
}

func requireRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown)")
	}
}

// TestScanRefusals covers every [PKG-3] refusal and the root checks.
func TestScanRefusals(t *testing.T) {
	cases := []struct {
		name     string
		root     bool                                   // needs root
		setup    func(t *testing.T, root string) string // returns the path to scan
		want     errcode.Code
		inSubdir string // the message must name this path
	}{
		{name: "baseline accepted", setup: func(t *testing.T, root string) string { return root }},
		{name: "[PKG-3] symlink to a file", want: errcode.LinkUnsafe, inSubdir: "l", setup: func(t *testing.T, root string) string {
			must(t, os.Symlink("ok.txt", filepath.Join(root, "l")))
			return root
		}},
		{name: "[PKG-3] dangling symlink deep", want: errcode.LinkUnsafe, inSubdir: "d/e/l", setup: func(t *testing.T, root string) string {
			writeTree(t, root, node{path: "d/e/"})
			must(t, os.Symlink("/nonexistent", filepath.Join(root, "d/e/l")))
			return root
		}},
		{name: "[PKG-3] symlink to a directory", want: errcode.LinkUnsafe, inSubdir: "up", setup: func(t *testing.T, root string) string {
			must(t, os.Symlink("..", filepath.Join(root, "up")))
			return root
		}},
		{name: "[PKG-3] root is a symlink", want: errcode.LinkUnsafe, setup: func(t *testing.T, root string) string {
			l := filepath.Join(filepath.Dir(root), "link")
			must(t, os.Symlink(root, l))
			return l
		}},
		{name: "[PKG-3] root is a symlink spelled with a trailing slash", want: errcode.LinkUnsafe, setup: func(t *testing.T, root string) string {
			l := filepath.Join(filepath.Dir(root), "link")
			must(t, os.Symlink(root, l))
			return l + "/"
		}},
		{name: "[PKG-3] hard link", want: errcode.LinkUnsafe, inSubdir: "ok.txt", setup: func(t *testing.T, root string) string {
			must(t, os.Link(filepath.Join(root, "ok.txt"), filepath.Join(filepath.Dir(root), "outside")))
			return root
		}},
		{name: "[PKG-3] fifo", want: errcode.PackageInvalid, inSubdir: "d/fifo", setup: func(t *testing.T, root string) string {
			writeTree(t, root, node{path: "d/"})
			must(t, syscall.Mkfifo(filepath.Join(root, "d/fifo"), 0o600))
			return root
		}},
		{name: "[PKG-3] socket", want: errcode.PackageInvalid, inSubdir: "s", setup: func(t *testing.T, root string) string {
			l, err := net.Listen("unix", filepath.Join(root, "s"))
			must(t, err)
			t.Cleanup(func() { l.Close() })
			return root
		}},
		{name: "[PKG-3] foreign-owned file", root: true, want: errcode.OwnerMismatch, inSubdir: "ok.txt", setup: func(t *testing.T, root string) string {
			must(t, os.Lchown(filepath.Join(root, "ok.txt"), 65534, 65534))
			return root
		}},
		{name: "[PKG-3] foreign-owned directory", root: true, want: errcode.OwnerMismatch, inSubdir: "d", setup: func(t *testing.T, root string) string {
			writeTree(t, root, node{path: "d/"})
			must(t, os.Lchown(filepath.Join(root, "d"), 65534, 0))
			return root
		}},
		{name: "[PKG-3] foreign-owned root", root: true, want: errcode.OwnerMismatch, setup: func(t *testing.T, root string) string {
			must(t, os.Lchown(root, 65534, 65534))
			return root
		}},
		{name: "[PKG-3] group-writable file", want: errcode.ModeUnsafe, inSubdir: "ok.txt", setup: func(t *testing.T, root string) string {
			chmod(t, filepath.Join(root, "ok.txt"), 0o664)
			return root
		}},
		{name: "[PKG-3] world-writable directory", want: errcode.ModeUnsafe, inSubdir: "d", setup: func(t *testing.T, root string) string {
			writeTree(t, root, node{path: "d/", mode: 0o757})
			return root
		}},
		{name: "[PKG-3] world-writable root", want: errcode.ModeUnsafe, setup: func(t *testing.T, root string) string {
			chmod(t, root, 0o777)
			return root
		}},
		{name: "[PKG-3] group-writable root", want: errcode.ModeUnsafe, setup: func(t *testing.T, root string) string {
			chmod(t, root, 0o775)
			return root
		}},
		{name: "[PKG-3] control character", want: errcode.PathUnsafe, setup: nameCase("a\x01b")},
		{name: "[PKG-3] newline", want: errcode.PathUnsafe, setup: nameCase("a\nb")},
		{name: "[PKG-3] delete", want: errcode.PathUnsafe, setup: nameCase("a\x7f")},
		{name: "[PKG-3] c1 control", want: errcode.PathUnsafe, setup: nameCase("a\u0085b")},
		{name: "[PKG-3] invalid utf-8", want: errcode.PathUnsafe, setup: nameCase("a\xffb")},
		{name: "[PKG-3] invalid utf-8 directory", want: errcode.PathUnsafe, setup: func(t *testing.T, root string) string {
			writeTree(t, root, node{path: "d/\xc3(/"}, node{path: "d/\xc3(/f", data: "x"})
			return root
		}},
		{name: "non-ascii name accepted", setup: nameCase("héllo-世界")},
		{name: "[PKG-2] .git directory inside the tree", want: errcode.PathUnsafe, setup: func(t *testing.T, root string) string {
			writeTree(t, root, node{path: "sub/.git/"}, node{path: "sub/.git/config", data: "[core]\n"})
			return root
		}},
		{name: "[PKG-2] .git file inside the tree", want: errcode.PathUnsafe, setup: func(t *testing.T, root string) string {
			writeTree(t, root, node{path: "sub/"}, node{path: "sub/.git", data: "gitdir: /elsewhere\n"})
			return root
		}},
		{name: "[PKG-2] .git at the root (Scan alone)", want: errcode.PathUnsafe, setup: func(t *testing.T, root string) string {
			writeTree(t, root, node{path: ".git/"})
			return root
		}},
		{name: "names like .git accepted", setup: func(t *testing.T, root string) string {
			writeTree(t, root, node{path: ".gitignore", data: "x"}, node{path: "a.git/"}, node{path: ".github/"})
			return root
		}},
		{name: "missing root", want: errcode.PackageMissing, setup: func(t *testing.T, root string) string {
			return filepath.Join(root, "nope")
		}},
		{name: "missing root below a file", want: errcode.PackageMissing, setup: func(t *testing.T, root string) string {
			return filepath.Join(root, "ok.txt", "nope")
		}},
		{name: "root is a file", want: errcode.PackageInvalid, setup: func(t *testing.T, root string) string {
			return filepath.Join(root, "ok.txt")
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.root {
				requireRoot(t)
			}
			root := newPkg(t, node{path: "ok.txt", data: "ok\n"})
			_, err := Scan(c.setup(t, root), Source)
			wantCode(t, err, c.want)
			if c.inSubdir != "" && !strings.Contains(err.Error(), fmt.Sprintf("%q", c.inSubdir)) {
				t.Errorf("message %q does not name %q", err, c.inSubdir)
			}
		})
	}
}

func nameCase(name string) func(t *testing.T, root string) string {
	return func(t *testing.T, root string) string {
		writeTree(t, root, node{path: name, data: "x"})
		return root
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestScanEntryBound: [PKG-4] exactly 4,096 entries (directories count, the
// root does not) are accepted, 4,097 are refused.
func TestScanEntryBound(t *testing.T) {
	root := newPkg(t, node{path: "d/"}, node{path: "d/last", data: "x"})
	for i := range MaxEntries - 2 {
		writeTree(t, root, node{path: fmt.Sprintf("f%04d", i)})
	}
	tr := mustScan(t, root, Source)
	if len(tr.Entries) != MaxEntries {
		t.Fatalf("got %d entries, want %d", len(tr.Entries), MaxEntries)
	}
	writeTree(t, root, node{path: "d/sub/"})
	_, err := Scan(root, Source)
	wantCode(t, err, errcode.PackageOversized)
}

// TestScanByteBound: [PKG-4] exactly 64 MiB of file content is accepted, one
// byte more is refused, and the refusal comes from stat data, before any
// byte is read: a 1 TiB sparse file is refused at once.
func TestScanByteBound(t *testing.T) {
	cases := []struct {
		name  string
		sizes []int64
		want  errcode.Code
	}{
		{"one file at the bound", []int64{MaxBytes}, ""},
		{"two files at the bound", []int64{MaxBytes - 1, 1}, ""},
		{"one file over", []int64{MaxBytes + 1}, errcode.PackageOversized},
		{"two files over", []int64{MaxBytes, 1}, errcode.PackageOversized},
		{"1 TiB sparse file, refused without reading", []int64{1 << 40}, errcode.PackageOversized},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := newPkg(t)
			for i, n := range c.sizes {
				p := filepath.Join(root, fmt.Sprintf("f%d", i))
				writeTree(t, root, node{path: filepath.Base(p)})
				must(t, os.Truncate(p, n)) // sparse: fast to create
			}
			start := time.Now()
			tr, err := Scan(root, Source)
			wantCode(t, err, c.want)
			if c.want != "" && time.Since(start) > 5*time.Second {
				t.Errorf("refusal took %v; the bound must be checked before reading", time.Since(start))
			}
			if c.want == "" && tr.Bytes != MaxBytes {
				t.Errorf("Bytes = %d, want %d", tr.Bytes, MaxBytes)
			}
		})
	}
}

// Golden trees for [PKG-5]. Each stream is written out by hand from the
// contract's rules; the file hashes and digests were computed independently
// with sha256sum and Python.
var (
	// fixtureSiblings has an empty directory, an executable, an empty file,
	// and the names "a" and "a-c", whose depth-first order (a, a/b, a-c)
	// differs from a plain sort of full paths (a, a-c, a/b).
	fixtureSiblings = []node{
		{path: "z.txt", data: ""},
		{path: "a/"},
		{path: "a/b", data: "hello\n"},
		{path: "a-c", data: "#!/bin/sh\nexit 0\n", mode: 0o755},
		{path: "empty/"},
	}
	streamSiblings = "firstmate-package-tree-v1\x00" +
		"D\x00a\x00x\x00" +
		"F\x00a/b\x00-\x006\x00sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03\x00" +
		"F\x00a-c\x00x\x0017\x00sha256:306c6ca7407560340797866e077e053627ad409277d1b9da58106fce4cf717cb\x00" +
		"D\x00empty\x00x\x00" +
		"F\x00z.txt\x00-\x000\x00sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\x00"
	digestSiblings = "sha256:e3a300b691d00e9ca429649a3f86c3fb783f54841de6cae24751baf65e8cbbac"

	// fixtureNested is a package-shaped tree with nested directories, binary
	// content, and a directory "x" sorting before its sibling file "x.txt".
	fixtureNested = []node{
		{path: "firstmate-extension.json", data: "{}\n"},
		{path: "bin/"},
		{path: "bin/run", data: "#!/bin/sh\necho hi\n", mode: 0o700},
		{path: "lib/x/"},
		{path: "lib/x.txt", data: "x", mode: 0o600},
		{path: "lib/x/data.bin", data: "\x00\x01\xff", mode: 0o400},
	}
	streamNested = "firstmate-package-tree-v1\x00" +
		"D\x00bin\x00x\x00" +
		"F\x00bin/run\x00x\x0018\x00sha256:299001868fb8c02fd431c336c6d058f5558c5dff5b5af5e6fe04b870a6a9cbba\x00" +
		"F\x00firstmate-extension.json\x00-\x003\x00sha256:ca3d163bab055381827226140568f3bef7eaac187cebd76878e0b63e9e442356\x00" +
		"D\x00lib\x00x\x00" +
		"D\x00lib/x\x00x\x00" +
		"F\x00lib/x/data.bin\x00-\x003\x00sha256:26a66b061e8f48f39927c312f25293959729eee95978e2892d49d3512a5cc092\x00" +
		"F\x00lib/x.txt\x00-\x001\x00sha256:2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881\x00"
	digestNested = "sha256:fadb475f41fcd9b8d82113d33cbf9beda077507ea4cb88396354323ccb762145"
)

// TestDigestGolden: [PKG-5] the digest of fixed trees equals a hand-built
// stream's SHA-256 and a literal, and Entries are in the stream's order.
func TestDigestGolden(t *testing.T) {
	cases := []struct {
		name   string
		nodes  []node
		stream string
		digest string
		order  []string
		bytes  int64
	}{
		{"empty package", nil, "firstmate-package-tree-v1\x00",
			"sha256:39074b71dba501adb5ade12bb0c0482f6cce5fed8adacc746b2fc0f7d00d953b", nil, 0},
		{"siblings", fixtureSiblings, streamSiblings, digestSiblings,
			[]string{"a", "a/b", "a-c", "empty", "z.txt"}, 23},
		{"nested", fixtureNested, streamNested, digestNested,
			[]string{"bin", "bin/run", "firstmate-extension.json", "lib", "lib/x", "lib/x/data.bin", "lib/x.txt"}, 25},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sum := sha256.Sum256([]byte(c.stream))
			if got := "sha256:" + hex.EncodeToString(sum[:]); got != c.digest {
				t.Fatalf("hand-built stream hashes to %s, literal is %s", got, c.digest)
			}
			tr := mustScan(t, newPkg(t, c.nodes...), Source)
			if tr.Digest != c.digest {
				t.Errorf("Digest = %s, want %s", tr.Digest, c.digest)
			}
			var order []string
			for _, e := range tr.Entries {
				order = append(order, e.Path)
			}
			if strings.Join(order, " ") != strings.Join(c.order, " ") {
				t.Errorf("Entries order %q, want %q", order, c.order)
			}
			if tr.Bytes != c.bytes {
				t.Errorf("Bytes = %d, want %d", tr.Bytes, c.bytes)
			}
		})
	}
}

// TestDigestChanges: [PKG-5] any change of a path, a byte, an execute bit or
// an empty directory changes the digest; times, owners and non-execute mode
// bits do not.
func TestDigestChanges(t *testing.T) {
	cases := []struct {
		name   string
		root   bool
		same   bool
		change func(t *testing.T, root string)
	}{
		{name: "one byte", change: func(t *testing.T, root string) {
			writeTree(t, root, node{path: "a/b", data: "hellp\n"})
		}},
		{name: "byte appended", change: func(t *testing.T, root string) {
			writeTree(t, root, node{path: "z.txt", data: "\x00"})
		}},
		{name: "execute bit added (owner only)", change: func(t *testing.T, root string) {
			chmod(t, filepath.Join(root, "a/b"), 0o744)
		}},
		{name: "execute bit removed", change: func(t *testing.T, root string) {
			chmod(t, filepath.Join(root, "a-c"), 0o644)
		}},
		{name: "file renamed", change: func(t *testing.T, root string) {
			must(t, os.Rename(filepath.Join(root, "z.txt"), filepath.Join(root, "y.txt")))
		}},
		{name: "empty directory renamed", change: func(t *testing.T, root string) {
			must(t, os.Rename(filepath.Join(root, "empty"), filepath.Join(root, "empty2")))
		}},
		{name: "empty directory added", change: func(t *testing.T, root string) {
			writeTree(t, root, node{path: "new/"})
		}},
		{name: "nested empty directory added", change: func(t *testing.T, root string) {
			writeTree(t, root, node{path: "empty/sub/"})
		}},
		{name: "empty file added", change: func(t *testing.T, root string) {
			writeTree(t, root, node{path: "empty/f"})
		}},
		{name: "times", same: true, change: func(t *testing.T, root string) {
			old := time.Unix(1000000000, 0)
			filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
				must(t, err)
				must(t, os.Chtimes(p, old, old))
				return nil
			})
		}},
		{name: "non-execute mode bits", same: true, change: func(t *testing.T, root string) {
			chmod(t, filepath.Join(root, "a/b"), 0o400)
			chmod(t, filepath.Join(root, "a-c"), 0o500)
			chmod(t, filepath.Join(root, "a"), 0o700)
			chmod(t, root, 0o700)
		}},
		{name: "group owner", root: true, same: true, change: func(t *testing.T, root string) {
			must(t, os.Lchown(filepath.Join(root, "a/b"), os.Geteuid(), 65534))
			must(t, os.Lchown(filepath.Join(root, "a"), os.Geteuid(), 65534))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.root {
				requireRoot(t)
			}
			root := newPkg(t, fixtureSiblings...)
			if got := mustScan(t, root, Source).Digest; got != digestSiblings {
				t.Fatalf("base digest %s, want %s", got, digestSiblings)
			}
			c.change(t, root)
			got := mustScan(t, root, Source).Digest
			if c.same && got != digestSiblings {
				t.Errorf("digest changed to %s; it must not", got)
			}
			if !c.same && got == digestSiblings {
				t.Errorf("digest did not change")
			}
		})
	}
}

// TestFileSHA256: [PKG-6] the per-file digest used for the manifest and the
// entrypoint.
func TestFileSHA256(t *testing.T) {
	tr := mustScan(t, newPkg(t, fixtureNested...), Source)
	got, ok := FileSHA256(tr, "bin/run")
	if want := "sha256:299001868fb8c02fd431c336c6d058f5558c5dff5b5af5e6fe04b870a6a9cbba"; !ok || got != want {
		t.Errorf("FileSHA256(bin/run) = %q, %v; want %q", got, ok, want)
	}
	for _, rel := range []string{"bin", "lib/x", "missing", "", "/bin/run", "bin/run/"} {
		if got, ok := FileSHA256(tr, rel); ok {
			t.Errorf("FileSHA256(%q) = %q, true; want false", rel, got)
		}
	}
}

// TestScanDetectsChangeAfterWalk: the tree is changed between the validating
// walk and the reads. The reads must neither follow a link nor block on a
// FIFO, and must report integrity-mismatch.
func TestScanDetectsChangeAfterWalk(t *testing.T) {
	cases := []struct {
		name   string
		change func(t *testing.T, root string)
	}{
		{"file replaced by a symlink", func(t *testing.T, root string) {
			must(t, os.Remove(filepath.Join(root, "d/f")))
			must(t, os.Symlink("/etc/passwd", filepath.Join(root, "d/f")))
		}},
		{"file replaced by another file of the same size", func(t *testing.T, root string) {
			// The old file stays alive so its inode number cannot be reused.
			must(t, os.Rename(filepath.Join(root, "d/f"), filepath.Join(filepath.Dir(root), "old")))
			writeTree(t, root, node{path: "d/f", data: "datb"})
		}},
		{"file replaced by a fifo", func(t *testing.T, root string) {
			must(t, os.Remove(filepath.Join(root, "d/f")))
			must(t, syscall.Mkfifo(filepath.Join(root, "d/f"), 0o600))
		}},
		{"file grew", func(t *testing.T, root string) {
			writeTree(t, root, node{path: "d/f", data: "data+more"})
		}},
		{"file removed", func(t *testing.T, root string) {
			must(t, os.Remove(filepath.Join(root, "d/f")))
		}},
		{"directory replaced by a symlink", func(t *testing.T, root string) {
			must(t, os.Rename(filepath.Join(root, "d"), filepath.Join(filepath.Dir(root), "d")))
			must(t, os.Symlink(filepath.Join(filepath.Dir(root), "d"), filepath.Join(root, "d")))
		}},
		{"directory replaced by a copy", func(t *testing.T, root string) {
			must(t, os.Rename(filepath.Join(root, "d"), filepath.Join(filepath.Dir(root), "d")))
			writeTree(t, root, node{path: "d/"}, node{path: "d/f", data: "data"})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := newPkg(t, node{path: "d/"}, node{path: "d/f", data: "data"})
			w, err := openTree(root, Source)
			must(t, err)
			defer w.close()
			must(t, w.walk())
			c.change(t, root)
			err = w.eachFile(func(wk *worker, i int) error {
				fd, err := wk.open(i)
				if err != nil {
					return err
				}
				defer syscall.Close(fd)
				_, err = wk.read(i, fd, nil)
				return err
			})
			wantCode(t, err, errcode.IntegrityMismatch)
		})
	}
}

// [INV-1]: Keep hands back the very file that was hashed, which stays that
// inode when another file is renamed over its name; Stamp is equal for two
// scans of an unchanged tree and differs after a same-bytes copy is renamed
// in, after a chmod and back, and after an in-place rewrite of the same
// bytes, none of which changes Digest.
func TestKeepAndStamp(t *testing.T) {
	root := newPkg(t, node{path: "bin/"}, node{path: "bin/ep", data: "#!/bin/sh\necho verified\n", mode: 0o755}, node{path: "m.json", data: "{}"})
	scan := func() *Tree {
		t.Helper()
		tree, err := ScanWith(root, Source, Options{Keep: "bin/ep"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tree.Kept.Close() })
		return tree
	}
	first := scan()
	if again := scan(); again.Stamp != first.Stamp || again.Digest != first.Digest {
		t.Fatal("two scans of an unchanged tree differ")
	}
	ep := filepath.Join(root, "bin", "ep")
	var kept, named syscall.Stat_t
	if err := syscall.Fstat(int(first.Kept.Fd()), &kept); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(ep, &named); err != nil || kept.Ino != named.Ino || kept.Dev != named.Dev {
		t.Fatalf("kept file is not the scanned inode: %v", err)
	}
	if _, err := ScanWith(root, Source, Options{Keep: "bin/none"}); errcode.Of(err) != errcode.EntrypointMissing {
		t.Fatalf("Keep of a missing file: %v", err)
	}

	changes := map[string]func(){
		"same-bytes copy renamed in": func() {
			tmp := filepath.Join(filepath.Dir(root), "copy")
			if err := os.WriteFile(tmp, []byte("#!/bin/sh\necho verified\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			chmod(t, tmp, 0o755)
			must(t, os.Rename(tmp, ep))
		},
		"chmod and back": func() { chmod(t, ep, 0o700); chmod(t, ep, 0o755) },
		"same bytes rewritten in place": func() {
			must(t, os.WriteFile(ep, []byte("#!/bin/sh\necho verified\n"), 0o755))
		},
	}
	for name, change := range changes {
		before := scan()
		time.Sleep(20 * time.Millisecond) // past the change-time clock's tick
		change()
		after := scan()
		if after.Digest != before.Digest {
			t.Errorf("%s: digest changed", name)
		}
		if after.Stamp == before.Stamp {
			t.Errorf("%s: stamp unchanged", name)
		}
	}
	// The kept file of the first scan is still the original inode: it reads
	// the verified bytes although its name now holds another file.
	b := make([]byte, 64)
	n, _ := first.Kept.ReadAt(b, 0)
	if string(b[:n]) != "#!/bin/sh\necho verified\n" {
		t.Fatalf("kept file reads %q", b[:n])
	}
	if err := syscall.Stat(ep, &named); err != nil || named.Ino == kept.Ino {
		t.Fatalf("the name still holds the first inode: %v", err)
	}
}
