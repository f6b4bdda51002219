package homeimport

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/shown"
)

// Backups: every file the import replaces or removes is first copied, exactly
// as it was (bytes, mode, modification time; a symlink as a symlink with the
// same target), to data/imported/<run>/<its path relative to the home>
// (a state root outside the home under state/), fsynced, and only then
// replaced or removed. <run> is the UTC time the import started,
// 20060102T150405Z. The journal data/imported/.current names the run while an
// import is under way, so a re-run after a crash keeps its copies in the same
// run; it is removed last. A copy made again by a re-run replaces the
// earlier copy of the same file, which the crash left unchanged.

// journalName is the journal of the import under way in data/imported.
const journalName = ".current"

// tempPrefix names the import's own temporary files. They are made beside
// the file they replace, or in the parent of a transfer unit, never in a
// directory fm lists, and removed by a re-run after a crash.
const tempPrefix = ".fm-import-"

// ownTemp reports whether name in dir is one of the import's temporary
// files: tempPrefix and 16 lowercase hex digits, a regular file. Anything
// else that merely starts so is the operator's, and is left alone.
func ownTemp(dir, name string) bool {
	h, ok := strings.CutPrefix(name, tempPrefix)
	if !ok || len(h) != 16 || strings.ToLower(h) != h {
		return false
	}
	if _, err := hex.DecodeString(h); err != nil {
		return false
	}
	fi, err := os.Lstat(filepath.Join(dir, name))
	return err == nil && fi.Mode().IsRegular()
}

// imported is data/imported of h.
func imported(h *home.Home) string { return filepath.Join(h.Dir, "data", "imported") }

// relative is path as it is kept under a run directory.
func relative(h *home.Home, path string) string {
	if r, err := filepath.Rel(h.Dir, path); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	if r, err := filepath.Rel(h.State, path); err == nil && !strings.HasPrefix(r, "..") {
		return filepath.Join("state", r)
	}
	return path
}

// display is path as the import's report shows it: relative, and a name
// the import did not write shown safely (shown.Path).
func display(h *home.Home, path string) string { return shown.Path(relative(h, path)) }

// openRun returns the run directory of the import: the one the journal
// names, or a new one when there is none. The journal is published before
// the run is created, so a kill between the two leaves no run that no
// journal names. Temporary files of writes a kill interrupted (fsutil's, of
// the journal in data/imported and of kept copies in the run) are removed
// first: a re-run then leaves what an uninterrupted import leaves.
func openRun(h *home.Home) (string, error) {
	dir := imported(h)
	if err := home.EnsurePrivate(filepath.Dir(dir), false); err != nil {
		return "", err
	}
	if err := home.EnsurePrivate(dir, true); err != nil {
		return "", err
	}
	if err := removeTemps(dir, false); err != nil {
		return "", err
	}
	name, err := readJournal(h)
	if err != nil {
		return "", err
	}
	if name == "" {
		name = time.Now().UTC().Format("20060102T150405Z")
		for i := 2; exists(filepath.Join(dir, name)); i++ {
			name = time.Now().UTC().Format("20060102T150405Z") + "-" + strconv.Itoa(i)
		}
		if err := writeJournal(dir, name); err != nil {
			return "", err
		}
	}
	run := filepath.Join(dir, name)
	if err := home.EnsurePrivate(run, true); err != nil {
		return "", err
	}
	return run, removeTemps(run, true)
}

// removeTemps durably removes fsutil's temporary files in dir and, with
// deep, in every directory below it (links are not followed).
func removeTemps(dir string, deep bool) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return errcode.Wrap(errcode.Internal, err, "read %s", p)
		case d.IsDir():
			if p != dir && !deep {
				return filepath.SkipDir
			}
		case d.Type().IsRegular() && fsutil.IsTempName(d.Name()):
			return removePath(p)
		}
		return nil
	})
}

// readJournal returns the run an interrupted import was using, or "".
func readJournal(h *home.Home) (string, error) {
	path := filepath.Join(imported(h), journalName)
	data, err := fsutil.ReadPrivateFile(path, 256)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	name, ok := strings.CutSuffix(string(data), "\n")
	if !ok || name == "" || strings.ContainsAny(name, "/\n") || name[0] == '.' {
		return "", errcode.New(errcode.SchemaInvalid, "import journal %s does not name a run directory; move it aside", path)
	}
	return name, nil
}

// writeJournal durably creates the journal in dir (data/imported), naming
// the run.
func writeJournal(dir, run string) error {
	d, err := home.OpenPrivate(dir, true)
	if err != nil {
		return err
	}
	defer d.Close()
	return fsutil.CreateAt(d, journalName, []byte(run+"\n"))
}

// closeRun removes the journal: the import is complete.
func closeRun(h *home.Home) error {
	d, err := home.OpenPrivate(imported(h), true)
	if err != nil {
		return err
	}
	defer d.Close()
	return fsutil.RemoveAt(d, journalName)
}

// keep copies path (a file, a symlink or a directory tree) to its place
// under run, durably.
func keep(h *home.Home, run, path string) error {
	dst := filepath.Join(run, relative(h, path))
	if err := fsutil.MkdirAllSync(filepath.Dir(dst), 0o700); err != nil {
		return errcode.Wrap(errcode.Internal, err, "create %s", filepath.Dir(dst))
	}
	if err := copyTree(path, dst); err != nil {
		return err
	}
	return fsutil.SyncDir(filepath.Dir(dst))
}

func copyTree(src, dst string) error {
	fail := func(err error) error { return errcode.Wrap(errcode.Internal, err, "keep a copy of %s at %s", src, dst) }
	fi, err := os.Lstat(src)
	if err != nil {
		return fail(err)
	}
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return fail(err)
		}
		if err := os.RemoveAll(dst); err != nil {
			return fail(err)
		}
		if err := os.Symlink(target, dst); err != nil {
			return fail(err)
		}
	case fi.IsDir():
		if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fail(err)
		}
		names, err := readNames(src)
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := copyTree(filepath.Join(src, n), filepath.Join(dst, n)); err != nil {
				return err
			}
		}
		if err := os.Chmod(dst, fi.Mode().Perm()); err != nil {
			return fail(err)
		}
		if err := fsutil.SyncDir(dst); err != nil {
			return err
		}
	case fi.Mode().IsRegular():
		f, err := fsutil.OpenNoFollow(src)
		if err != nil {
			return err
		}
		data, err := io.ReadAll(f)
		f.Close()
		if err != nil {
			return fail(err)
		}
		if err := copyFile(dst, data, fi); err != nil {
			return fail(err)
		}
	default:
		return keepable(src, fi.Mode().Type())
	}
	return nil
}

// keepable refuses what keep cannot copy: anything but a regular file, a
// symlink or a directory (of type t).
func keepable(path string, t fs.FileMode) error {
	if t.IsRegular() || t == fs.ModeSymlink || t == fs.ModeDir {
		return nil
	}
	return errcode.New(errcode.PathUnsafe, "%s is not a file, a symlink or a directory, so it cannot be kept; move it aside, then run fm home import again", path)
}

// copyFile durably writes data at dst (replacing a copy an earlier run
// left) with the mode and times of fi, under a temp name in dst's
// directory that removeTemps sweeps if this process dies. That directory
// is the run's copy of a home directory, with its mode: any permission bits.
func copyFile(dst string, data []byte, fi fs.FileInfo) error {
	d, err := fsutil.OpenDir(filepath.Dir(dst), fsutil.DirRule{Perm: fsutil.AnyPerm})
	if err != nil {
		return err
	}
	defer d.Close()
	p, err := fsutil.NewAt(d, fsutil.NewOptions{Temp: fsutil.TempName(), Mode: fi.Mode().Perm()})
	if err != nil {
		return err
	}
	if _, err := p.Write(data); err != nil {
		p.Abort()
		return err
	}
	if err := p.SetModTime(fi.ModTime()); err != nil {
		p.Abort()
		return err
	}
	return p.Replace(filepath.Base(dst))
}

// replaceFile durably replaces path with data (mode 0600) by renaming a
// temporary file made in tmpDir (on the same file system, a directory fm
// does not list) over it.
func replaceFile(tmpDir, path string, data []byte) error {
	fail := func(err error) error { return errcode.Wrap(errcode.Internal, err, "replace %s", path) }
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp, err := fsutil.OpenDir(tmpDir, fsutil.DirRule{})
	if err != nil {
		return err
	}
	defer tmp.Close()
	to, err := fsutil.OpenDir(filepath.Dir(path), fsutil.DirRule{})
	if err != nil {
		return err
	}
	defer to.Close()
	p, err := fsutil.NewAt(tmp, fsutil.NewOptions{Temp: tempPrefix + hex.EncodeToString(rnd[:]), Final: to})
	if err != nil {
		return fail(err)
	}
	if _, err := p.Write(data); err != nil {
		p.Abort()
		return fail(err)
	}
	if err := p.Replace(filepath.Base(path)); err != nil {
		return fail(err)
	}
	return nil
}

// removePath durably removes a file, a symlink or a directory tree.
func removePath(path string) error {
	if err := os.RemoveAll(path); err != nil {
		return errcode.Wrap(errcode.Internal, err, "remove %s", path)
	}
	return fsutil.SyncDir(filepath.Dir(path))
}
