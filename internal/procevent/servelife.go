package procevent

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"firstmate.dev/fm/internal/fsutil"
)

// serve's lifecycle [STAT-5]: its pid beside its lock, and the lines that
// say it started, picked up a source, lost one, and stopped.

// servePIDName is the file beside serve.lock that names the pid of the
// serve holding it. It is written only while the lock is held and removed
// before the lock is released; it is shown to an operator, never used to
// signal anything (a stale or forged pid would signal a stranger).
const servePIDName = "serve.pid"

// recordPID writes this process's pid beside the serve lock; the function
// it returns removes it. A failure to write only loses the pid in a second
// serve's refusal.
func recordPID(reg *os.File) func() {
	if fsutil.ReplaceAt(reg, servePIDName, []byte(strconv.Itoa(os.Getpid())+"\n")) != nil {
		return func() {}
	}
	return func() { fsutil.RemoveAt(reg, servePIDName) }
}

// servePID is " (pid N)" for the pid the running serve recorded, or "" when
// there is none that reads as one.
func servePID(reg *os.File) string {
	data, err := fsutil.ReadPrivateAt(reg, servePIDName, 32)
	if err != nil {
		return ""
	}
	pid, err := strconv.Atoi(strings.TrimSuffix(string(data), "\n"))
	if err != nil || pid < 1 {
		return ""
	}
	return fmt.Sprintf(" (pid %d)", pid)
}

// started says serve started, with the home, its sources and its pid.
func (s *supervisor) started(d *dirs) {
	ids, _ := sourceIDs(d.reg)
	s.known = map[string]bool{}
	for _, id := range ids {
		s.known[id] = true
	}
	s.o.Notice(fmt.Sprintf("serve: started home=%s sources=%d pid=%d", s.h.Dir, len(ids), os.Getpid()))
}

// noteChanges says which sources were registered or retired since the last
// rescan.
func (s *supervisor) noteChanges(ids []string) {
	now := map[string]bool{}
	for _, id := range ids {
		now[id] = true
		if !s.known[id] {
			s.o.Notice("serve: source added: " + id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(s.known)) {
		if !now[id] {
			s.o.Notice("serve: source removed: " + id)
		}
	}
	s.known = now
}
