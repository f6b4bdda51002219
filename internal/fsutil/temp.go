package fsutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/procstat"
)

// Temp names and their sweep.
//
// Every file or directory fm builds before renaming it into place is named
// TempName(): ".tmp-<pid>-<start>-<random>", where pid and start (the
// writer's start time in clock ticks since boot, field 22 of
// /proc/<pid>/stat) name the writing process. A writer that is killed leaves
// its temp behind; the name alone proves whether its writer still runs, so a
// temp whose writer is gone can be removed by anyone, without a lock and
// without reading it (it may be partial). A temp whose writer is alive, or
// whose name does not carry a writer (written before this scheme), is kept,
// unless the caller holds the lock that every writer of that directory holds
// (the lifecycle lock for the store, the registry's config/ directory and
// staging): then no writer can be running and every temp is dead.
//
// A home shared between processes of different pid namespaces is not
// supported here, as for invocation records.

// TempPrefix starts every temp name.
const TempPrefix = ".tmp-"

// selfTag is "<pid>-<start>" of this process, read once.
var selfTag = sync.OnceValue(func() string {
	pid := os.Getpid()
	start, ok := startTime(pid)
	if !ok {
		return strconv.Itoa(pid) + "-0" // never proved dead: kept, as a legacy name
	}
	return strconv.Itoa(pid) + "-" + strconv.FormatUint(start, 10)
})

// TempName returns a fresh temp name for this process.
func TempName() string {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	return TempPrefix + selfTag() + "-" + hex.EncodeToString(rnd[:])
}

// startTime returns the start time of process pid, and false when no such
// process exists or it is a zombie (it has exited).
func startTime(pid int) (uint64, bool) {
	st, err := procstat.Read(pid)
	if err != nil || st.Zombie() {
		return 0, false
	}
	return st.Start, true
}

// parseTempName returns the writer's pid and start time of a name TempName
// made; ok is false for any other name.
func parseTempName(name string) (pid int, start uint64, ok bool) {
	rest, found := strings.CutPrefix(name, TempPrefix)
	parts := strings.Split(rest, "-")
	if !found || len(parts) != 3 || parts[2] == "" || len(parts[2]) > 32 || strings.Trim(parts[2], "0123456789abcdef") != "" {
		return 0, 0, false
	}
	pid, err1 := strconv.Atoi(parts[0])
	start, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 || strconv.Itoa(pid) != parts[0] || strconv.FormatUint(start, 10) != parts[1] {
		return 0, 0, false
	}
	return pid, start, true
}

// IsTempName reports whether name is one TempName makes (a file that was
// never published: its writer was killed, or still runs, between its write
// and its rename).
func IsTempName(name string) bool {
	_, _, ok := parseTempName(name)
	return ok
}

// TempDead reports whether the temp name's writer has provably exited: the
// name carries a writer, and no process runs with that pid and start time.
func TempDead(name string) bool {
	pid, start, ok := parseTempName(name)
	if !ok || start == 0 {
		return false
	}
	now, alive := startTime(pid)
	return !alive || now != start
}

// DeadTemps lists the temps directly in dir that SweepTemps would remove:
// every temp when locked (the caller holds the lock every writer of dir
// holds), else those whose writer has provably exited. An absent dir has
// none.
func DeadTemps(dir string, locked bool) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read %s", dir)
	}
	var out []string
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, TempPrefix) && (locked || TempDead(n)) {
			out = append(out, filepath.Join(dir, n))
		}
	}
	return out, nil
}

// SweepTemps removes what DeadTemps lists and returns how many it removed.
// A temp directory (a partial store copy) may hold 0555 directories: they
// are made writable first, or a non-root owner could not empty them.
func SweepTemps(dir string, locked bool) (int, error) {
	dead, err := DeadTemps(dir, locked)
	if err != nil {
		return 0, err
	}
	for _, p := range dead {
		filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(q, 0o700)
			}
			return nil
		})
		if err := os.RemoveAll(p); err != nil {
			return 0, errcode.Wrap(errcode.Internal, err, "remove the abandoned %s", p)
		}
	}
	return len(dead), nil
}
