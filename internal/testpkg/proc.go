package testpkg

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"firstmate.dev/fm/internal/procstat"
)

// Now returns the current time in the unit of process start times: clock
// ticks since boot (USER_HZ, which Linux fixes at 100 a second for /proc).
func Now() uint64 {
	data, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	secs, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return uint64(secs*100) + 1
}

// GroupAlive reports whether process group pgid still has a member that is
// not a zombie and started no later than since (see Now). A group whose
// remaining members are all zombies counts as gone, as in CONTRACT [GRP-4].
// A group number is reused once its leader is reaped, and every member of a
// new group with that number starts after that; so with since taken while
// the old group still existed (say, when its host was killed), only its own
// survivors count, and a survivor that forks keeps counting through itself.
// Tests use it to check what the host claims; the host itself never scans
// the process table.
func GroupAlive(pgid int, since uint64) bool {
	if pgid <= 0 || syscall.Kill(-pgid, 0) == syscall.ESRCH {
		return false
	}
	for _, p := range procs() {
		if p.pgid == pgid && !p.zombie && p.start <= since {
			return true
		}
	}
	return false
}

// Processes returns the pids of the live (not zombie) processes whose
// environment holds the exact entry kv, such as
// "FIRSTMATE_EXTENSION_STATE=/tmp/x/home/state/extensions/org.example.fake":
// a test's way to find leftovers of its own packages, whatever group they
// are in. Processes of other users are not readable and are skipped.
func Processes(kv string) []int {
	want := []byte(kv)
	var out []int
	for _, p := range procs() {
		if p.zombie {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.pid), "environ"))
		if err != nil {
			continue
		}
		for _, e := range bytes.Split(env, []byte{0}) {
			if bytes.Equal(e, want) {
				out = append(out, p.pid)
				break
			}
		}
	}
	return out
}

type proc struct {
	pid, pgid int
	zombie    bool
	start     uint64 // clock ticks since boot
}

// procs reads pid, process group, state and start time of every process in
// /proc.
func procs() []proc {
	ents, _ := os.ReadDir("/proc")
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procstat.Read(pid)
		if err != nil {
			continue
		}
		out = append(out, proc{pid: pid, pgid: st.PGID, zombie: st.Zombie(), start: st.Start})
	}
	return out
}
