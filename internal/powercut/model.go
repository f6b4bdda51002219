package powercut

import (
	"io"
	"maps"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// The durable model: how a sync updates it, and how a cut rebuilds a tree
// from it. Called with f.mu held.

// sync credits a sync of the backing file or directory open as fd (its
// path is p, for a directory) under the model.
func (f *FS) sync(fd int, p string) error {
	if f.model == Ordered {
		var st unix.Stat_t
		if err := unix.Lstat(f.backing, &st); err != nil {
			return err
		}
		return f.syncTree(f.backing, &st)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return f.syncDir(p, &st)
	}
	return f.syncFile(fd, &st)
}

// syncFile records the bytes and mode of the file open as fd.
func (f *FS) syncFile(fd int, st *unix.Stat_t) error {
	data := make([]byte, st.Size)
	n, err := unix.Pread(fd, data, 0)
	if err != nil {
		// Opened write-only: read it through a fresh descriptor.
		rf, oerr := os.Open("/proc/self/fd/" + strconv.Itoa(fd))
		if oerr != nil {
			return oerr
		}
		data, err = io.ReadAll(rf)
		rf.Close()
		if err != nil {
			return err
		}
		n = len(data)
	}
	f.dur[f.idOf(st.Ino)] = &inode{mode: st.Mode, data: data[:n]}
	return nil
}

// syncDir records the entries of directory p; an inode a new entry names
// that the model does not hold is added empty (its bytes were never
// synced).
func (f *FS) syncDir(p string, st *unix.Stat_t) error {
	ents, err := os.ReadDir(p)
	if err != nil {
		return err
	}
	in := &inode{mode: st.Mode, entries: map[string]uint64{}}
	for _, e := range ents {
		var cst unix.Stat_t
		if err := unix.Lstat(filepath.Join(p, e.Name()), &cst); err != nil {
			return err
		}
		id := f.idOf(cst.Ino)
		in.entries[e.Name()] = id
		if _, ok := f.dur[id]; !ok {
			f.dur[id] = empty(filepath.Join(p, e.Name()), &cst)
		}
	}
	dirID := f.idOf(st.Ino)
	f.dur[dirID] = in
	f.commitMoves(dirID, in)
	return nil
}

// renamed notes a rename of backing entry old of directory from to new
// of directory to (paths), for commitMoves.
func (f *FS) renamed(from, old, to, new string) {
	if from == to {
		return
	}
	var fst, tst, st unix.Stat_t
	if unix.Lstat(from, &fst) != nil || unix.Lstat(to, &tst) != nil || unix.Lstat(filepath.Join(to, new), &st) != nil {
		return
	}
	f.moves = append(f.moves, move{from: f.idOf(fst.Ino), to: f.idOf(tst.Ino), id: f.idOf(st.Ino), old: old})
}

// commitMoves makes the renames into directory dir, just synced with
// entries in, durable in their source directories too: the old name no
// longer names the moved inode there.
func (f *FS) commitMoves(dir uint64, in *inode) {
	kept := f.moves[:0]
	for _, m := range f.moves {
		if m.to != dir {
			kept = append(kept, m)
			continue
		}
		src := f.dur[m.from]
		if src == nil || src.entries[m.old] != m.id {
			continue
		}
		entries := maps.Clone(src.entries)
		delete(entries, m.old)
		f.dur[m.from] = &inode{mode: src.mode, entries: entries}
	}
	f.moves = kept
}

// empty is the model's inode for an entry whose inode never synced.
func empty(p string, st *unix.Stat_t) *inode {
	in := &inode{mode: st.Mode}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		in.entries = map[string]uint64{}
	case unix.S_IFLNK:
		in.target, _ = os.Readlink(p)
	}
	return in
}

// syncTree records the whole tree under directory p as it is.
func (f *FS) syncTree(p string, st *unix.Stat_t) error {
	if err := f.syncDir(p, st); err != nil {
		return err
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		return err
	}
	for _, e := range ents {
		c := filepath.Join(p, e.Name())
		var cst unix.Stat_t
		if err := unix.Lstat(c, &cst); err != nil {
			return err
		}
		switch cst.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			err = f.syncTree(c, &cst)
		case unix.S_IFREG:
			data, rerr := os.ReadFile(c)
			if rerr != nil && os.Geteuid() != 0 {
				data, rerr = nil, nil // unreadable to this user: kept empty
			}
			err = rerr
			f.dur[f.idOf(cst.Ino)] = &inode{mode: cst.Mode, data: data}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// rebuild makes directory dst the tree of the model from root: every
// inode a durable entry names, hard links as links; a directory named twice
// (renamed, both parents synced at different times) is made once.
func rebuild(model map[uint64]*inode, root uint64, dst string) error {
	made := map[uint64]string{}
	var dirs []string // to chmod after they are filled
	var modes []uint32
	var walk func(id uint64, p string) error
	walk = func(id uint64, p string) error {
		in := model[id]
		if in == nil {
			return nil
		}
		if first, ok := made[id]; ok {
			if in.mode&unix.S_IFMT == unix.S_IFDIR {
				return nil
			}
			return os.Link(first, p)
		}
		made[id] = p
		perm := in.mode & 0o7777
		switch in.mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := os.Mkdir(p, 0o700); err != nil && p != dst {
				return err
			}
			dirs, modes = append(dirs, p), append(modes, perm)
			for name, c := range in.entries {
				if err := walk(c, filepath.Join(p, name)); err != nil {
					return err
				}
			}
		case unix.S_IFLNK:
			return os.Symlink(in.target, p)
		case unix.S_IFREG:
			if err := os.WriteFile(p, in.data, 0o600); err != nil {
				return err
			}
			return os.Chmod(p, os.FileMode(perm&0o777)|modeBits(perm))
		}
		return nil
	}
	if err := walk(root, dst); err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Chmod(dirs[i], os.FileMode(modes[i]&0o777)|modeBits(modes[i])); err != nil {
			return err
		}
	}
	return nil
}

// modeBits turns the setuid, setgid and sticky bits of perm into os's.
func modeBits(perm uint32) os.FileMode {
	var m os.FileMode
	if perm&unix.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if perm&unix.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if perm&unix.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}
