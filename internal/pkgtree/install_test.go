package pkgtree

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"firstmate.dev/fm/internal/errcode"
)

// storeHome returns a fresh home directory whose sealed store is made
// writable again before t.TempDir removes it (a non-root user cannot delete
// the contents of a 0555 directory).
func storeHome(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	t.Cleanup(func() {
		filepath.WalkDir(home, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o700)
			}
			return nil
		})
	})
	return home
}

// storePath is <home>/data/extensions/packages/<id>/<version>/<tree-hex>.
func storePath(home string, tr *Tree) string {
	return filepath.Join(home, "data", "extensions", "packages", "org.example.feed", "1.2.3", strings.TrimPrefix(tr.Digest, "sha256:"))
}

var fixtureInstall = append([]node{{path: "share/empty/"}, {path: "share/doc.txt", data: "doc\n", mode: 0o640}}, fixtureNested...)

// installed scans a fresh source package and installs it into a fresh home.
func installed(t *testing.T) (src string, tr *Tree, dst string) {
	t.Helper()
	src = newPkg(t, fixtureInstall...)
	tr = mustScan(t, src, Source)
	dst = storePath(storeHome(t), tr)
	wantCode(t, Install(src, tr, dst), "")
	return src, tr, dst
}

func lstat(t *testing.T, p string) (fs.FileMode, *syscall.Stat_t) {
	t.Helper()
	fi, err := os.Lstat(p)
	must(t, err)
	return fi.Mode(), fi.Sys().(*syscall.Stat_t)
}

// onlyEntry asserts that dir holds exactly name: no temp directory is left.
func onlyEntry(t *testing.T, dir, name string) {
	t.Helper()
	des, err := os.ReadDir(dir)
	must(t, err)
	var names, want []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	if name != "" {
		want = []string{name}
	}
	if !slices.Equal(names, want) {
		t.Errorf("%s holds %q, want %q", dir, names, want)
	}
}

// TestInstallModes: [BIND-5] [HOME-4] the store copy has exactly mode 0555
// for the root, every directory and every executable, 0444 for every other
// file, is owned by the user, has the source's digest, and its new parents
// are 0700. Modes are read with Lstat: root could write anyway.
func TestInstallModes(t *testing.T) {
	_, tr, dst := installed(t)
	exec := map[string]bool{}
	for _, e := range tr.Entries {
		exec[e.Path] = e.Exec
	}
	n := 0
	must(t, filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		must(t, err)
		rel, _ := filepath.Rel(dst, p)
		mode, st := lstat(t, p)
		want := fs.FileMode(0o444)
		switch {
		case mode.IsDir():
			want = fs.ModeDir | 0o555
		case exec[filepath.ToSlash(rel)]:
			want = 0o555
		}
		if mode != want {
			t.Errorf("%s: mode %v, want %v", rel, mode, want)
		}
		if int(st.Uid) != os.Geteuid() || st.Nlink != 1 && !mode.IsDir() {
			t.Errorf("%s: uid %d nlink %d", rel, st.Uid, st.Nlink)
		}
		n++
		return nil
	}))
	if n != len(tr.Entries)+1 {
		t.Errorf("store holds %d entries, want %d", n-1, len(tr.Entries))
	}
	for p := filepath.Dir(dst); filepath.Base(p) != "data"; p = filepath.Dir(p) {
		if mode, _ := lstat(t, p); mode != fs.ModeDir|0o700 {
			t.Errorf("%s: mode %v, want drwx------", p, mode)
		}
	}
	onlyEntry(t, filepath.Dir(dst), filepath.Base(dst))
	got := mustScan(t, dst, Installed)
	if got.Digest != tr.Digest || got.Bytes != tr.Bytes || len(got.Entries) != len(tr.Entries) {
		t.Fatalf("installed tree %+v differs from source %+v", got, tr)
	}
	for i := range got.Entries {
		if got.Entries[i] != tr.Entries[i] {
			t.Errorf("entry %d: installed %+v, source %+v", i, got.Entries[i], tr.Entries[i])
		}
	}
}

// TestInstallEmptyPackage: [BIND-5] a package with no entries installs as a
// sealed empty root.
func TestInstallEmptyPackage(t *testing.T) {
	src := newPkg(t)
	tr := mustScan(t, src, Source)
	dst := storePath(storeHome(t), tr)
	wantCode(t, Install(src, tr, dst), "")
	wantCode(t, Install(src, tr, dst), "")
	if mode, _ := lstat(t, dst); mode != fs.ModeDir|0o555 {
		t.Errorf("root mode %v", mode)
	}
}

// TestInstallReuse: [BIND-5] an existing store directory with the same digest
// is validated and reused, never rewritten.
func TestInstallReuse(t *testing.T) {
	src, tr, dst := installed(t)
	_, root := lstat(t, dst)
	_, file := lstat(t, filepath.Join(dst, "bin/run"))
	wantCode(t, Install(src, tr, dst), "")
	_, root2 := lstat(t, dst)
	_, file2 := lstat(t, filepath.Join(dst, "bin/run"))
	if root.Ino != root2.Ino || file.Ino != file2.Ino || file.Mtim != file2.Mtim || file.Ctim != file2.Ctim {
		t.Errorf("store was rewritten")
	}
	onlyEntry(t, filepath.Dir(dst), filepath.Base(dst))
}

// TestInstallExistingDifferent: [BIND-5] a store directory with different
// content is integrity-mismatch and stays as it was.
func TestInstallExistingDifferent(t *testing.T) {
	_, trA, dst := installed(t)
	srcB := newPkg(t, fixtureSiblings...)
	trB := mustScan(t, srcB, Source)
	wantCode(t, Install(srcB, trB, dst), errcode.IntegrityMismatch)
	if got := mustScan(t, dst, Installed).Digest; got != trA.Digest {
		t.Errorf("store changed to %s", got)
	}
}

// TestInstallSourceChanged: [BIND-5] a source that no longer matches its
// first scan is integrity-mismatch, and nothing is left in the store.
func TestInstallSourceChanged(t *testing.T) {
	cases := []struct {
		name   string
		change func(t *testing.T, src string)
	}{
		{"one byte, same size", func(t *testing.T, src string) {
			writeTree(t, src, node{path: "lib/x.txt", data: "y"})
		}},
		{"file added", func(t *testing.T, src string) {
			writeTree(t, src, node{path: "new", data: "n"})
		}},
		{"empty directory removed", func(t *testing.T, src string) {
			must(t, os.Remove(filepath.Join(src, "share/empty")))
		}},
		{"execute bit removed", func(t *testing.T, src string) {
			chmod(t, filepath.Join(src, "bin/run"), 0o600)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := newPkg(t, fixtureInstall...)
			tr := mustScan(t, src, Source)
			dst := storePath(storeHome(t), tr)
			c.change(t, src)
			wantCode(t, Install(src, tr, dst), errcode.IntegrityMismatch)
			onlyEntry(t, filepath.Dir(dst), "")
		})
	}
}

// TestInstallConcurrent: [BIND-5] concurrent installs of one digest all
// succeed on one store directory and leave no temp directory.
func TestInstallConcurrent(t *testing.T) {
	src := newPkg(t, fixtureInstall...)
	tr := mustScan(t, src, Source)
	dst := storePath(storeHome(t), tr)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = Install(src, tr, dst) })
	}
	wg.Wait()
	for _, err := range errs {
		wantCode(t, err, "")
	}
	onlyEntry(t, filepath.Dir(dst), filepath.Base(dst))
	if got := mustScan(t, dst, Installed).Digest; got != tr.Digest {
		t.Errorf("digest %s", got)
	}
}

// TestInstalledDrift: [INV-1] revalidation of the store copy refuses every
// drift: content (a different digest, integrity-mismatch on reuse), modes,
// links, a missing root and a non-canonical root path.
func TestInstalledDrift(t *testing.T) {
	unsealed := func(t *testing.T, dir string, f func()) {
		chmod(t, dir, 0o755)
		f()
		chmod(t, dir, 0o555)
	}
	cases := []struct {
		name   string
		change func(t *testing.T, dst string) string // returns the path to scan
		want   errcode.Code
	}{
		{name: "file mode 0644", want: errcode.ModeUnsafe, change: func(t *testing.T, dst string) string {
			chmod(t, filepath.Join(dst, "lib/x.txt"), 0o644)
			return dst
		}},
		{name: "file mode 0400", want: errcode.ModeUnsafe, change: func(t *testing.T, dst string) string {
			chmod(t, filepath.Join(dst, "lib/x.txt"), 0o400)
			return dst
		}},
		{name: "executable mode 0755", want: errcode.ModeUnsafe, change: func(t *testing.T, dst string) string {
			chmod(t, filepath.Join(dst, "bin/run"), 0o755)
			return dst
		}},
		{name: "file gained an execute bit", want: errcode.ModeUnsafe, change: func(t *testing.T, dst string) string {
			chmod(t, filepath.Join(dst, "lib/x.txt"), 0o544)
			return dst
		}},
		{name: "directory mode 0755", want: errcode.ModeUnsafe, change: func(t *testing.T, dst string) string {
			chmod(t, filepath.Join(dst, "share/empty"), 0o755)
			return dst
		}},
		{name: "root mode 0755", want: errcode.ModeUnsafe, change: func(t *testing.T, dst string) string {
			chmod(t, dst, 0o755)
			return dst
		}},
		{name: "symlink added", want: errcode.LinkUnsafe, change: func(t *testing.T, dst string) string {
			unsealed(t, filepath.Join(dst, "bin"), func() {
				must(t, os.Symlink("run", filepath.Join(dst, "bin/alias")))
			})
			return dst
		}},
		{name: "hard link made from outside", want: errcode.LinkUnsafe, change: func(t *testing.T, dst string) string {
			must(t, os.Link(filepath.Join(dst, "bin/run"), filepath.Join(filepath.Dir(dst), "..", "run")))
			return dst
		}},
		{name: "file added", want: errcode.IntegrityMismatch, change: func(t *testing.T, dst string) string {
			unsealed(t, filepath.Join(dst, "share/empty"), func() {
				writeTree(t, dst, node{path: "share/empty/new", data: "x", mode: 0o444})
			})
			return dst
		}},
		{name: "root removed", want: errcode.PackageMissing, change: func(t *testing.T, dst string) string {
			removeAll(dst)
			return dst
		}},
		{name: "root reached through a symlinked path", want: errcode.LinkUnsafe, change: func(t *testing.T, dst string) string {
			alias := filepath.Join(filepath.Dir(dst), "..", "alias")
			must(t, os.Symlink(filepath.Dir(dst), alias))
			return filepath.Join(alias, filepath.Base(dst))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, tr, dst := installed(t)
			p := c.change(t, dst)
			got, err := Scan(p, Installed)
			if c.want == errcode.IntegrityMismatch {
				wantCode(t, err, "")
				if got.Digest == tr.Digest {
					t.Fatalf("digest unchanged")
				}
			} else {
				wantCode(t, err, c.want)
			}
			// A rebind of the same package must not reuse the drifted copy;
			// a missing copy is simply installed again.
			if p == dst {
				want := c.want
				if want == errcode.PackageMissing {
					want = ""
				}
				wantCode(t, Install(src, tr, dst), want)
			}
		})
	}
}

// TestInstalledTamper: [INV-1] a changed byte in an installed file, with its
// mode restored to 0444, changes the installed digest, and reuse of that
// store directory is integrity-mismatch.
func TestInstalledTamper(t *testing.T) {
	src, tr, dst := installed(t)
	f := filepath.Join(dst, "firstmate-extension.json")
	chmod(t, f, 0o644)
	must(t, os.WriteFile(f, []byte("{]\n"), 0o644))
	chmod(t, f, 0o444)
	got := mustScan(t, dst, Installed)
	if got.Digest == tr.Digest {
		t.Fatal("tampered store has the original digest")
	}
	if sum, _ := FileSHA256(got, "firstmate-extension.json"); sum == "sha256:ca3d163bab055381827226140568f3bef7eaac187cebd76878e0b63e9e442356" {
		t.Error("manifest digest unchanged")
	}
	wantCode(t, Install(src, tr, dst), errcode.IntegrityMismatch)
}

// TestInstallRefusesBadStorePath: the store path must be absolute, clean and
// reached without a symlink.
func TestInstallRefusesBadStorePath(t *testing.T) {
	src := newPkg(t, fixtureSiblings...)
	tr := mustScan(t, src, Source)
	home := storeHome(t)
	wantCode(t, Install(src, tr, "relative/store"), errcode.PathUnsafe)
	wantCode(t, Install(src, tr, home+"/a/../b"), errcode.PathUnsafe)
	must(t, os.Symlink(t.TempDir(), filepath.Join(home, "link")))
	wantCode(t, Install(src, tr, filepath.Join(home, "link", "x")), errcode.LinkUnsafe)
}

// TestInstallCopyDigestMismatch: [BIND-5] when the copy's digest is not the
// first scan's, what was built is removed and the result is
// integrity-mismatch. (A want whose digest does not describe its entries
// stands in for a copy that came out different.)
func TestInstallCopyDigestMismatch(t *testing.T) {
	src := newPkg(t, fixtureInstall...)
	tr := mustScan(t, src, Source)
	bad := *tr
	bad.Digest = digestSiblings
	dst := storePath(storeHome(t), &bad)
	wantCode(t, Install(src, &bad, dst), errcode.IntegrityMismatch)
	onlyEntry(t, filepath.Dir(dst), "")
}

// TestScanInstalledNeedsAbsoluteRoot: [INV-1] a store copy is only ever
// revalidated at its canonical absolute path.
func TestScanInstalledNeedsAbsoluteRoot(t *testing.T) {
	_, _, dst := installed(t)
	t.Chdir(filepath.Dir(dst))
	_, err := Scan(filepath.Base(dst), Installed)
	wantCode(t, err, errcode.PathUnsafe)
}

// TestInstallSourceChangedDuringCopy: [BIND-5] the source's digest must
// still equal the first scan once the copy is made: a change made while the
// copy is built, to a file already copied as much as to one not yet copied,
// is integrity-mismatch, and nothing is left in the store. Each change is
// made from the progress hook once bin/run, the first file, is copied.
func TestInstallSourceChangedDuringCopy(t *testing.T) {
	cases := []struct {
		name   string
		change func(t *testing.T, src string)
	}{
		{"a copied file's bytes, same size", func(t *testing.T, src string) {
			writeTree(t, src, node{path: "bin/run", data: "#!/bin/sh\necho ho\n", mode: 0o700})
		}},
		{"a copied file's execute bit removed", func(t *testing.T, src string) {
			chmod(t, filepath.Join(src, "bin/run"), 0o600)
		}},
		{"a copied file removed", func(t *testing.T, src string) {
			must(t, os.Remove(filepath.Join(src, "bin/run")))
		}},
		{"a file added", func(t *testing.T, src string) {
			writeTree(t, src, node{path: "bin/new", data: "n"})
		}},
		{"a copied directory renamed", func(t *testing.T, src string) {
			must(t, os.Rename(filepath.Join(src, "bin"), filepath.Join(src, "bin2")))
		}},
		{"a file not yet copied, same size", func(t *testing.T, src string) {
			writeTree(t, src, node{path: "share/doc.txt", data: "DOC\n"})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := newPkg(t, fixtureInstall...)
			tr := mustScan(t, src, Source)
			dst := storePath(storeHome(t), tr)
			changed := false
			opts := Options{Progress: func(stage string, files, _ int, _, _ int64) {
				if stage == StageCopying && files == 1 && !changed {
					changed = true
					c.change(t, src)
				}
			}}
			wantCode(t, errOf(InstallWith(src, tr, dst, opts)), errcode.IntegrityMismatch)
			if !changed {
				t.Fatal("the copy never reported its first file")
			}
			onlyEntry(t, filepath.Dir(dst), "")
		})
	}
}

// TestInstallSourceTouchedDuringCopy: [BIND-5] a source whose files were
// rewritten with the same bytes or whose directory was renamed and back
// while the copy was built still has the first scan's digest: the install
// succeeds (the changed stamp makes it hash the source again).
func TestInstallSourceTouchedDuringCopy(t *testing.T) {
	src := newPkg(t, fixtureInstall...)
	tr := mustScan(t, src, Source)
	dst := storePath(storeHome(t), tr)
	touched := false
	opts := Options{Progress: func(stage string, files, _ int, _, _ int64) {
		if stage == StageCopying && files == 1 && !touched {
			touched = true
			writeTree(t, src, node{path: "bin/run", data: "#!/bin/sh\necho ha\n", mode: 0o700})
			writeTree(t, src, node{path: "bin/run", data: "#!/bin/sh\necho hi\n", mode: 0o700})
			must(t, os.Rename(filepath.Join(src, "lib"), filepath.Join(src, "lib2")))
			must(t, os.Rename(filepath.Join(src, "lib2"), filepath.Join(src, "lib")))
		}
	}}
	wantCode(t, errOf(InstallWith(src, tr, dst, opts)), "")
	if !touched {
		t.Fatal("the copy never reported its first file")
	}
	onlyEntry(t, filepath.Dir(dst), filepath.Base(dst))
}

// tempCopy is the one temp directory that an Install is building in the
// store parent of dst.
func tempCopy(t *testing.T, dst string) string {
	t.Helper()
	tmps, err := filepath.Glob(filepath.Join(filepath.Dir(dst), ".tmp-*"))
	must(t, err)
	if len(tmps) != 1 {
		t.Fatalf("temp copies %q, want one", tmps)
	}
	return tmps[0]
}

// rewrite writes data over the sealed file p in place (chmod u+w, write,
// chmod back), as a same-user process that means it would.
func rewrite(t *testing.T, p, data string) {
	t.Helper()
	fi, err := os.Lstat(p)
	must(t, err)
	chmod(t, p, 0o600)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	must(t, err)
	_, err = f.WriteString(data)
	must(t, err)
	must(t, f.Close())
	chmod(t, p, fi.Mode().Perm())
}

// TestInstallProvesCopyByStamps: [BIND-5] [INV-1] the rescan of a new copy is
// proved from what the copy wrote instead of hashing it again (its
// "verifying" stage has no step between start and end), but only while every file is the inode the copy wrote,
// unchanged since: a copied file changed in the temp copy before the
// rescan, in place with its size and mode restored or replaced by a new
// file, a hard link to one, a symlink added, is caught (integrity-mismatch,
// nothing left in the store), and one rewritten with the same bytes or
// chmod'ed and sealed again is hashed again and accepted. Each change is
// made from the progress hook once the last file is copied, before the copy
// is sealed, flushed and renamed into place.
func TestInstallProvesCopyByStamps(t *testing.T) {
	cases := []struct {
		name   string
		change func(t *testing.T, tmp string)
		want   errcode.Code
	}{
		{"nothing", func(*testing.T, string) {}, ""},
		{"bytes changed in place, same size and mode", func(t *testing.T, tmp string) {
			rewrite(t, filepath.Join(tmp, "lib/x.txt"), "y")
		}, errcode.IntegrityMismatch},
		{"an executable's bytes changed in place", func(t *testing.T, tmp string) {
			rewrite(t, filepath.Join(tmp, "bin/run"), "#!/bin/sh\necho ho\n")
		}, errcode.IntegrityMismatch},
		{"replaced by a new file, same size and mode", func(t *testing.T, tmp string) {
			p := filepath.Join(tmp, "firstmate-extension.json")
			must(t, os.Remove(p))
			must(t, os.WriteFile(p, []byte("{ }"), 0o444))
		}, errcode.IntegrityMismatch},
		{"rewritten with the same bytes", func(t *testing.T, tmp string) {
			rewrite(t, filepath.Join(tmp, "lib/x.txt"), "x")
		}, ""},
		{"made writable and sealed again, bytes kept", func(t *testing.T, tmp string) {
			chmod(t, filepath.Join(tmp, "bin/run"), 0o755)
			chmod(t, filepath.Join(tmp, "bin/run"), 0o555)
		}, ""},
		{"a hard link made to a copied file from outside", func(t *testing.T, tmp string) {
			must(t, os.Link(filepath.Join(tmp, "lib/x.txt"), filepath.Join(filepath.Dir(tmp), "..", "hl")))
		}, errcode.IntegrityMismatch},
		{"a symlink added", func(t *testing.T, tmp string) {
			must(t, os.Symlink("x.txt", filepath.Join(tmp, "lib/alias")))
		}, errcode.IntegrityMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := newPkg(t, fixtureInstall...)
			tr := mustScan(t, src, Source)
			dst := storePath(storeHome(t), tr)
			changed := false
			r := &recorder{}
			opts := Options{Progress: func(stage string, files, total int, bytes, totalBytes int64) {
				r.progress(stage, files, total, bytes, totalBytes)
				if stage == StageCopying && files == total && !changed {
					changed = true
					c.change(t, tempCopy(t, dst))
				}
			}}
			got, err := InstallWith(src, tr, dst, opts)
			if !changed {
				t.Fatal("the copy never reported its last file")
			}
			wantCode(t, err, c.want)
			if c.want != "" {
				onlyEntry(t, filepath.Dir(dst), "")
				return
			}
			if got.Digest != tr.Digest || got.Stamp != mustScan(t, dst, Installed).Stamp {
				t.Fatalf("Install returned digest %s stamp %s, not the copy's", got.Digest, got.Stamp)
			}
			r.stages(t, tr, StageCopying, StageVerifying)
			hashed := r.steps(StageVerifying) > 2
			if hashed != (c.name != "nothing") { // every change makes the proof fail
				t.Fatalf("the copy was hashed again: %v", hashed)
			}
		})
	}
}

// TestInstallSealsUnderUmask: [BIND-5] [HOME-4] files are created with their
// final modes; a umask that takes bits from them (0077) is undone by a chmod
// before the copy's stamps are taken, so the copy is still proved without
// hashing it again.
func TestInstallSealsUnderUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	src := newPkg(t, fixtureInstall...)
	tr := mustScan(t, src, Source)
	dst := storePath(storeHome(t), tr)
	r := &recorder{}
	_, err := InstallWith(src, tr, dst, Options{Progress: r.progress})
	wantCode(t, err, "")
	r.stages(t, tr, StageCopying, StageVerifying)
	if n := r.steps(StageVerifying); n != 2 {
		t.Errorf("the copy was hashed again (%d steps)", n)
	}
	if mode, _ := lstat(t, filepath.Join(dst, "bin/run")); mode.Perm() != 0o555 {
		t.Errorf("bin/run has mode %v", mode)
	}
	if mode, _ := lstat(t, filepath.Join(dst, "lib/x.txt")); mode.Perm() != 0o444 {
		t.Errorf("lib/x.txt has mode %v", mode)
	}
}

// TestReverify: [INV-1] Reverify accepts an installed tree unchanged since
// it was verified without hashing it, keeping the entrypoint open as
// ScanWith does; any change since makes it hash the tree again: changed
// bytes give another digest (which the caller refuses), the same bytes
// rewritten give the same digest with a new stamp, a mode change is
// refused by the Installed rules.
func TestReverify(t *testing.T) {
	setup := func(t *testing.T) (string, *Tree) {
		src := newPkg(t, fixtureInstall...)
		tr := mustScan(t, src, Source)
		dst := storePath(storeHome(t), tr)
		inst, err := InstallWith(src, tr, dst, Options{})
		must(t, err)
		return dst, inst
	}
	t.Run("unchanged", func(t *testing.T) {
		dst, inst := setup(t)
		r := &recorder{}
		got, err := Reverify(dst, inst, Options{Keep: "bin/run", Progress: r.progress})
		must(t, err)
		defer got.Kept.Close()
		defer got.Root.Close()
		if len(r.reports) != 0 {
			t.Fatalf("an unchanged tree was hashed again: %+v", r.reports)
		}
		if got.Digest != inst.Digest || got.Stamp != inst.Stamp {
			t.Fatal("Reverify changed the digest or the stamp")
		}
		var kept, named, root, dir syscall.Stat_t
		must(t, syscall.Fstat(int(got.Kept.Fd()), &kept))
		must(t, syscall.Stat(filepath.Join(dst, "bin/run"), &named))
		must(t, syscall.Fstat(int(got.Root.Fd()), &root))
		must(t, syscall.Stat(dst, &dir))
		if kept.Ino != named.Ino || root.Ino != dir.Ino {
			t.Fatal("the kept descriptors are not the tree's entrypoint and root")
		}
	})
	t.Run("bytes changed", func(t *testing.T) {
		dst, inst := setup(t)
		rewrite(t, filepath.Join(dst, "lib/x.txt"), "y")
		got, err := Reverify(dst, inst, Options{})
		must(t, err)
		if got.Digest == inst.Digest {
			t.Fatal("a changed tree kept its digest")
		}
	})
	t.Run("same bytes rewritten", func(t *testing.T) {
		dst, inst := setup(t)
		rewrite(t, filepath.Join(dst, "lib/x.txt"), "x")
		r := &recorder{}
		got, err := Reverify(dst, inst, Options{Progress: r.progress})
		must(t, err)
		if got.Digest != inst.Digest || got.Stamp == inst.Stamp {
			t.Fatal("a rewritten tree was not hashed again")
		}
		r.stages(t, inst, StageVerifying)
	})
	t.Run("mode changed", func(t *testing.T) {
		dst, inst := setup(t)
		chmod(t, filepath.Join(dst, "lib/x.txt"), 0o644)
		_, err := Reverify(dst, inst, Options{})
		wantCode(t, err, errcode.ModeUnsafe)
	})
}
