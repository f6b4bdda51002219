// Package procstat reads /proc/<pid>/stat, the kernel's one-line summary of
// a process: the only parser of that line in fm, for code, tests and the
// benchmarks alike.
//
// The rules of the line (proc(5)): field 1 is the pid, field 2 the command
// name in parentheses, and the command name may itself hold anything but a
// NUL, spaces and ')' included (a process names itself with prctl or by its
// executable's name). So the fields after it are counted from the LAST ')'
// of the line, never by splitting the whole line. The fields after it are
// separated by spaces (the kernel writes one) and the line ends in a
// newline; Parse and PGID split them the same way, so they agree.
package procstat

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"syscall"
)

// Stat is what fm reads of a process's stat line.
type Stat struct {
	State   byte // field 3: R, S, D, Z (zombie), X (dead), ...
	PPID    int  // field 4
	PGID    int  // field 5: the process group
	SID     int  // field 6: the session; 0 when its leader is outside this PID namespace
	Threads int  // field 20
	// UTime and STime are the process's own CPU time (fields 14, 15);
	// CUTime and CSTime that of its reaped children (fields 16, 17). All in
	// clock ticks.
	UTime, STime   uint64
	CUTime, CSTime int64
	Start          uint64 // field 22: start time, clock ticks since boot
}

// Zombie reports the state of a process that has exited: Z (not yet reaped)
// or X.
func (s Stat) Zombie() bool { return s.State == 'Z' || s.State == 'X' }

// Dead reports whether the process has exited with no thread left. A
// thread-group leader whose main thread called pthread_exit shows state Z
// while its other threads still run, so a zombie with more than one thread
// is not dead.
func (s Stat) Dead() bool { return s.Zombie() && s.Threads <= 1 }

// ErrNoProcess means /proc has no entry for the pid: the process is gone
// (reaped) or never existed.
var ErrNoProcess = errors.New("no such process")

// errMalformed is Parse's answer for a line it does not understand.
var errMalformed = errors.New("malformed /proc stat line")

// Read reads and parses /proc/<pid>/stat. A process that vanishes while it
// is read is ErrNoProcess.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return Stat{}, ErrNoProcess
		}
		return Stat{}, err
	}
	return Parse(b)
}

// Parse parses a stat line. It needs at least field 22 (the start time) and
// every field it reads to be a decimal number (the state a single byte).
func Parse(b []byte) (Stat, error) {
	var f [20][]byte // f[0] is field 3 (state); field n is f[n-3]
	rest, ok := afterComm(b)
	for i := range f {
		if f[i], rest = next(rest); !ok || f[i] == nil {
			return Stat{}, errMalformed
		}
	}
	if len(f[0]) != 1 {
		return Stat{}, errMalformed
	}
	var s Stat
	var err [9]error
	s.State = f[0][0]
	s.PPID, err[0] = strconv.Atoi(string(f[1]))
	s.PGID, err[1] = strconv.Atoi(string(f[2]))
	s.SID, err[2] = strconv.Atoi(string(f[3]))
	s.UTime, err[3] = strconv.ParseUint(string(f[11]), 10, 64)
	s.STime, err[4] = strconv.ParseUint(string(f[12]), 10, 64)
	s.CUTime, err[5] = strconv.ParseInt(string(f[13]), 10, 64)
	s.CSTime, err[6] = strconv.ParseInt(string(f[14]), 10, 64)
	s.Threads, err[7] = strconv.Atoi(string(f[17]))
	s.Start, err[8] = strconv.ParseUint(string(f[19]), 10, 64)
	if errors.Join(err[:]...) != nil {
		return Stat{}, errMalformed
	}
	return s, nil
}

// PGID returns field 5 (the process group) of a stat line without
// allocating, for a scan of every process that parses in full only the
// lines of the group it looks for. false if the line is not understood: the
// caller then parses it in full and reports Parse's error. Where both
// answer, they agree.
func PGID(b []byte) (int, bool) {
	rest, ok := afterComm(b)
	state, rest := next(rest)
	_, rest = next(rest) // ppid
	f, _ := next(rest)
	n, err := strconv.Atoi(string(f))
	return n, ok && len(state) == 1 && err == nil
}

// afterComm returns what follows the command name: everything after the
// line's last ')'.
func afterComm(b []byte) ([]byte, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, false
	}
	return b[i+1:], true
}

// next returns the next field of b and what follows it; nil when none is
// left. Fields are separated by spaces and newlines.
func next(b []byte) (field, rest []byte) {
	sep := func(c byte) bool { return c == ' ' || c == '\n' }
	i := 0
	for i < len(b) && sep(b[i]) {
		i++
	}
	j := i
	for j < len(b) && !sep(b[j]) {
		j++
	}
	if i == j {
		return nil, nil
	}
	return b[i:j], b[j:]
}
