package pkgtree

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
)

// Install copies the package at src, whose first Scan gave want, into the
// content-addressed store directory dst ([BIND-5]), normally
// <home>/data/extensions/packages/<id>/<version>/<tree-hex>. Missing parents
// of dst are created with mode 0700.
//
// An existing dst is never rewritten: it is revalidated with Scan(dst,
// Installed) and reused when its digest is want.Digest, and refused as
// integrity-mismatch when it is not.
//
// Otherwise the copy is built in a private temp directory inside dst's parent:
// the source is walked again under the same rules, every file is copied and
// hashed on the way and must match want (integrity-mismatch), files are
// created 0444, or 0555 when want says executable, directories are sealed
// 0555 deepest first, then the whole copy is flushed at once (see flush) and
// the temp directory is renamed to dst without replacing anything. It is built where it will live because a non-root user
// cannot move a 0555 directory into another parent (rename must rewrite its
// ".."); a rename within one parent needs no write permission on the
// directory itself, so the root is sealed 0555 before the rename and dst
// appears complete, with its final modes, or not at all. A concurrent Install
// that wins the rename is validated and reused.
//
// Before the rename the source is checked unchanged since the copy pass
// walked it (unchanged: a metadata walk, hashed again only if something
// changed), so the copy pass, which checked the walk's shape against want
// and hashed every byte it copied against want, stands for the rescan of the
// source [BIND-5]. Finally dst is rescanned as Installed (verifyCopy: a
// metadata walk that finds every file to be the inode the copy wrote,
// unchanged since; hashed again only if not): its digest must still be
// want.Digest, else what this call built is removed and the result is
// integrity-mismatch. On every failure the temp directory is removed.
func Install(src string, want *Tree, dst string) error {
	_, err := InstallWith(src, want, dst, Options{})
	return err
}

// InstallWith is Install with the hooks of opts, which its copy and every
// scan it makes report to (opts.Keep is not used). It returns the store
// copy as verified: want's entries and digest, and the Stamp of dst's
// inodes, for Reverify.
func InstallWith(src string, want *Tree, dst string, opts Options) (*Tree, error) {
	opts.Keep = ""
	if !filepath.IsAbs(dst) || filepath.Clean(dst) != dst {
		return nil, errcode.New(errcode.PathUnsafe, "store directory %q is not an absolute clean path", dst)
	}
	parent := filepath.Dir(dst)
	if err := fsutil.MkdirAllSync(parent, 0o700); err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "create %s", parent)
	}
	if !fsutil.Canonical(parent) {
		return nil, errcode.New(errcode.LinkUnsafe, "store directory %s is not canonical", parent)
	}
	if _, err := os.Lstat(dst); err == nil {
		return reuse(dst, want, opts)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, errcode.Wrap(errcode.Internal, err, "stat %s", dst)
	}
	tmp, written, err := build(src, want, parent, opts)
	if err != nil {
		return nil, err
	}
	err = fsutil.RenameNoReplace(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst)
	if err != nil {
		removeAll(tmp)
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
			return reuse(dst, want, opts)
		}
		return nil, errcode.Wrap(errcode.Internal, err, "rename %s to %s", tmp, dst)
	}
	if err := fsutil.SyncDir(parent); err != nil {
		removeAll(dst)
		return nil, err
	}
	t, err := verifyCopy(dst, want, written, opts)
	if err != nil {
		removeAll(dst)
		return nil, err
	}
	return t, nil
}

// reuse accepts an existing store directory only when it is a valid installed
// tree with the wanted digest.
func reuse(dst string, want *Tree, opts Options) (*Tree, error) {
	t, err := ScanWith(dst, Installed, opts)
	if err != nil {
		return nil, err
	}
	if t.Digest != want.Digest {
		return nil, errcode.New(errcode.IntegrityMismatch, "installed package %s has digest %s, want %s; it holds different content", dst, t.Digest, want.Digest)
	}
	return t, nil
}

// verifyCopy is the rescan of the new copy dst [BIND-5], proved from what
// build wrote instead of hashing every byte again. build created every file
// itself (O_EXCL) with its final mode, 0444 or 0555, hashed every byte as it
// wrote it (the bytes equal want's), and took the file's identity and stamp
// (fstat of its own descriptor) after its last write and mode change: written
// holds them by entry. A metadata walk of dst under Installed that lists
// exactly want's entries and finds every file to be that inode with that
// same mode, change time and modification time proves dst holds want's
// bytes: whatever wrote, truncated, chmod'ed, replaced or renamed a file
// after build's last change sets its change time, which no unprivileged
// process can set back (docs/architecture.md, "Bind proves its copy
// without hashing it again"). The walk also checks every rule of Installed
// (canonical root, owner, modes, no links). Directories hold nothing but
// names, which the walk compares. The proof reports the verifying stage's
// start and, at once, its end. When it fails, dst is hashed again as before
// (recheck), which decides.
func verifyCopy(dst string, want *Tree, written []ident, opts Options) (*Tree, error) {
	if w, err := shaped(dst, Installed, want); err == nil {
		defer w.close()
		if w.wrote(written) {
			if opts.Progress != nil {
				opts.Progress(StageVerifying, 0, len(w.files), 0, w.bytes)
				opts.Progress(StageVerifying, len(w.files), len(w.files), w.bytes, w.bytes)
			}
			t, err := w.proven(want, "")
			if err == nil && t.Digest != want.Digest {
				return nil, errcode.New(errcode.IntegrityMismatch, "installed package %s has digest %s, want %s", dst, t.Digest, want.Digest)
			}
			return t, err
		}
	}
	return recheck(dst, want, opts)
}

// wrote reports whether every file entry of the walk is the inode written
// recorded for it, with the same mode and times.
func (w *walker) wrote(written []ident) bool {
	for _, i := range w.files {
		g, h := &w.ids[i], &written[i]
		if g.dev != h.dev || g.ino != h.ino || g.mode != h.mode || g.ctime != h.ctime || g.mtime != h.mtime {
			return false
		}
	}
	return true
}

// Reverify proves that the installed tree at root is still t, a tree that
// Scan under Installed, Install or Reverify returned, and keeps opts.Keep
// open as ScanWith does ([INV-1]). It walks the tree without reading a
// byte: the same entries with the same Tree.Stamp (the very inodes, none
// written, truncated, chmod'ed or renamed since, each of which sets a
// change time) prove that t's digests still hold, and the result is t's
// entries and digest with the new walk's stamp and descriptors. Otherwise
// it is ScanWith(root, Installed, opts): the tree is hashed again and the
// caller compares the digest. The kept file is opened after the walk, as
// ScanWith opens it after its walk; a write between the two is what the
// caller's rescan after the package ran refuses.
func Reverify(root string, t *Tree, opts Options) (*Tree, error) {
	if w, err := shaped(root, Installed, t); err == nil {
		defer func() {
			if w.fd >= 0 {
				w.close()
			}
		}()
		if w.stamp() == t.Stamp {
			return w.proven(t, opts.Keep)
		}
	}
	return ScanWith(root, Installed, opts)
}

// shaped opens and walks root under policy p without reading a file, and
// checks that it lists exactly want's entries (sameShape).
func shaped(root string, p Policy, want *Tree) (*walker, error) {
	w, err := openTree(root, p)
	if err != nil {
		return nil, err
	}
	if err = w.walk(); err == nil {
		err = sameShape(w, want)
	}
	if err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// proven is the tree of walk w once the content of each of its files is
// proved to be that of want's entry: want's file digests, the tree digest
// they make with w's entries, w's stamp, and, when keep is set, the open
// file at keep and the open root as ScanWith keeps them.
func (w *walker) proven(want *Tree, keep string) (*Tree, error) {
	for _, i := range w.files {
		w.entries[i].SHA256 = want.Entries[i].SHA256
	}
	t := &Tree{Entries: w.entries, Bytes: w.bytes, Digest: digest(w.entries), Stamp: w.stamp()}
	if keep == "" {
		return t, nil
	}
	i := slices.IndexFunc(w.entries, func(e Entry) bool { return e.Path == keep && !e.Dir })
	if i < 0 {
		return nil, errcode.New(errcode.EntrypointMissing, "package %s: %q is not a file of the tree", w.root, keep)
	}
	wk := &worker{w: w}
	fd, err := wk.open(i)
	wk.close()
	if err != nil {
		return nil, err
	}
	t.Kept = os.NewFile(uintptr(fd), filepath.Join(w.root, filepath.FromSlash(keep)))
	t.Root = os.NewFile(uintptr(w.fd), w.root)
	w.fd = -1 // now the caller's
	return t, nil
}

// recheck rescans the new copy after the install.
func recheck(dst string, want *Tree, opts Options) (*Tree, error) {
	t, err := ScanWith(dst, Installed, opts)
	if err != nil {
		return nil, errcode.Wrap(errcode.IntegrityMismatch, err, "installed package %s does not verify", dst)
	}
	if t.Digest != want.Digest {
		return nil, errcode.New(errcode.IntegrityMismatch, "installed package %s has digest %s, want %s", dst, t.Digest, want.Digest)
	}
	return t, nil
}

// build copies src into a new sealed temp directory inside parent and
// returns its path and, by entry, the identity and stamp of every file it
// wrote (for verifyCopy). The temp directory is removed on failure.
func build(src string, want *Tree, parent string, opts Options) (_ string, written []ident, err error) {
	w, err := shaped(src, Source, want)
	if err != nil {
		return "", nil, err
	}
	defer w.close()
	tmp := filepath.Join(parent, fsutil.TempName()) // swept if this process dies (fsutil.SweepTemps)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", nil, errcode.Wrap(errcode.Internal, err, "create a temp directory in %s", parent)
	}
	defer func() {
		if err != nil {
			removeAll(tmp)
		}
	}()
	// The descriptor that flushes is opened before the first byte is
	// written: see flush.
	fsDir, err := os.Open(tmp)
	if err != nil {
		return "", nil, errcode.Wrap(errcode.Internal, err, "open %s", tmp)
	}
	defer fsDir.Close()
	for _, e := range w.entries {
		if e.Dir {
			if err := os.Mkdir(filepath.Join(tmp, filepath.FromSlash(e.Path)), 0o700); err != nil {
				return "", nil, errcode.Wrap(errcode.Internal, err, "create directory %s", e.Path)
			}
		}
	}
	written = make([]ident, len(w.entries))
	err = w.eachFile(opts.metered(w, StageCopying, func(wk *worker, i int) (err error) {
		written[i], err = copyFile(wk, i, filepath.Join(tmp, filepath.FromSlash(w.entries[i].Path)), want.Entries[i].SHA256)
		return err
	}))
	if err != nil {
		return "", nil, err
	}
	// Reverse digest order lists every directory after its contents.
	for i := len(w.entries) - 1; i >= 0; i-- {
		if w.entries[i].Dir {
			if err := seal(filepath.Join(tmp, filepath.FromSlash(w.entries[i].Path))); err != nil {
				return "", nil, err
			}
		}
	}
	if err := seal(tmp); err != nil {
		return "", nil, err
	}
	if err := flush(fsDir); err != nil {
		return "", nil, err
	}
	if err := unchanged(src, w, want, opts); err != nil {
		return "", nil, err
	}
	return tmp, written, nil
}

// unchanged checks, once the copy is complete and durable, that the source
// still is what the copy pass walked and hashed: a change to a file after its
// own copy (or a file added, removed or renamed) must not let the copy be
// published as the source's [BIND-5]. It walks src again without reading a
// byte: the same paths (sameShape) and the same Tree.Stamp (the very inodes,
// none written, truncated, chmod'ed or renamed since, each of which sets the
// change time) prove it unchanged at the cost of its metadata. Only when the
// stamp differs is the source hashed again, so a change that left its digest
// as it was is not refused.
func unchanged(src string, copied *walker, want *Tree, opts Options) error {
	w, err := shaped(src, Source, want)
	if err != nil {
		return errcode.Wrap(errcode.IntegrityMismatch, err, "package %s changed during the install", src)
	}
	defer w.close()
	if w.stamp() == copied.stamp() {
		return nil
	}
	t, err := ScanWith(src, Source, opts)
	if err != nil {
		return errcode.Wrap(errcode.IntegrityMismatch, err, "package %s changed during the install", src)
	}
	if t.Digest != want.Digest {
		return errcode.New(errcode.IntegrityMismatch, "package %s changed during the install: digest %s, want %s", src, t.Digest, want.Digest)
	}
	return nil
}

// flush makes the complete copy durable in one step, before it is published
// by the rename: syncfs(2) on dir, the copy's open temp directory, writes back
// every dirty page and inode of the store's file system, the copy's file
// contents, inodes and directory entries included, and waits for them (ext4
// commits its journal, or writes the metadata blocks when it has none). That
// is the promise an fsync of every file and directory gave, at the cost of
// one flush instead of one per entry: the I/O floor of "cp -a" plus "sync -f".
// The rename that publishes the copy is made durable afterwards by the fsync
// of the parent, so after Install returns a crash leaves the store directory
// complete, and before that it leaves at most a temp directory. On a FUSE
// file system, where syncfs reaches no daemon, fsutil.SyncFS fsyncs every
// entry of the copy instead.
//
// Since Linux 5.8 syncfs reports a write-back error of the file system, but
// only one that the open file has not yet seen: the kernel samples the file
// system's error state when a file is opened, and an error that another
// process's syncfs already reported (an operator's "sync -f", a concurrent
// bind) counts as seen for files opened after it. So dir must have been
// opened before the first byte of the copy was written, which build does: a
// background write-back of the copy that failed is then reported here,
// whoever saw it first.
func flush(dir *os.File) error {
	return fsutil.SyncFS(dir)
}

// sameShape checks that a fresh walk of the source lists exactly want's
// entries (paths, types, execute bits, sizes); contents are checked while
// copying.
func sameShape(w *walker, want *Tree) error {
	if len(w.entries) != len(want.Entries) {
		return errcode.New(errcode.IntegrityMismatch, "package %s changed since it was scanned: %d entries, want %d", w.root, len(w.entries), len(want.Entries))
	}
	for i, e := range w.entries {
		g := want.Entries[i]
		if e.Path != g.Path || e.Dir != g.Dir || e.Exec != g.Exec || e.Size != g.Size {
			return errcode.New(errcode.IntegrityMismatch, "package %s changed since it was scanned: %q", w.root, e.Path)
		}
	}
	return nil
}

// copyFile copies file entry i of the walk to the new file at path, checks its
// hash against sum, and returns the new file's identity and stamp after its
// last change (build's flush makes it durable). The file is created with its
// final mode, 0444 or 0555: from its first byte nobody but root can open it
// for writing without a chmod, which sets its change time. Only a umask
// that took bits away makes a chmod necessary, before the stamp is taken.
func copyFile(wk *worker, i int, path string, sum [32]byte) (ident, error) {
	fd, err := wk.open(i)
	if err != nil {
		return ident{}, err
	}
	defer unix.Close(fd)
	e := &wk.w.entries[i]
	perm := uint32(0o444)
	if e.Exec {
		perm = 0o555
	}
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, os.FileMode(perm))
	if err != nil {
		return ident{}, errcode.Wrap(errcode.Internal, err, "create file")
	}
	defer out.Close()
	got, err := wk.read(i, fd, out)
	if err != nil {
		return ident{}, err
	}
	if got != sum {
		return ident{}, errcode.New(errcode.IntegrityMismatch, "package %s: %q changed since it was scanned", wk.w.root, e.Path)
	}
	var st unix.Stat_t
	err = unix.Fstat(int(out.Fd()), &st)
	if err == nil && st.Mode&0o7777 != perm {
		if err = out.Chmod(os.FileMode(perm)); err == nil {
			err = unix.Fstat(int(out.Fd()), &st)
		}
	}
	if err != nil {
		return ident{}, errcode.Wrap(errcode.Internal, err, "seal %s", path)
	}
	if err := out.Close(); err != nil {
		return ident{}, errcode.Wrap(errcode.Internal, err, "close %s", path)
	}
	return identOf(-1, e.Path, &st), nil
}

// seal makes a directory of the copy 0555; flush makes it durable.
func seal(dir string) error {
	if err := os.Chmod(dir, 0o555); err != nil {
		return errcode.Wrap(errcode.Internal, err, "chmod %s", dir)
	}
	return nil
}

// removeAll removes a tree this package built, first giving its directories
// back the owner's write bit, without which a non-root owner cannot delete
// the contents of a 0555 directory.
func removeAll(dir string) {
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	os.RemoveAll(dir)
}
