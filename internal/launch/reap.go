package launch

import (
	"firstmate.dev/fm/internal/procstat"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// supervised holds the groups (by pgid) that a Run of this process
// supervises, from the start of their barrier until their pidfd is closed:
// their zombie members are reaped by stop's sweep, by exact pid, and left
// alone by ReapOrphans.
var supervised sync.Map // int -> struct{}

// ReapOrphans reaps the zombie children of this process that are not the
// leader of an invocation it is running, and returns how many it reaped.
//
// Run makes its caller a child subreaper, so a process that left its
// invocation's group (setsid, a daemon) re-parents to the host when its own
// parent dies, and becomes the host's zombie when it exits. Run reaps only
// the members of its own groups; in a long-lived host (fm procevent serve)
// the others would accumulate. A leader is never touched: Run keeps it an
// unreaped zombie until its group is proved gone, because that zombie pins
// the group's number (see stop). Nor is a zombie member of a group that a
// Run still supervises: that Run's sweep reaps it by exact pid, and must be
// the only one to. forkMu is held for reading, so a leader that is being
// started is always in leaders (and its group in supervised) by the time it
// is seen here. Reaping any other child is exact: only this process can reap
// its own children, and a zombie's pid is pinned until it is reaped.
//
// Call it only in a process whose every child is started by this package
// (fm procevent serve): it would reap, too, the children that os/exec or
// os.StartProcess started, and so break their Wait. It reads
// /proc/self/task/*/children; where that cannot be read it reaps nothing.
func ReapOrphans() int {
	forkMu.RLock()
	defer forkMu.RUnlock()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	n := 0
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/children")
		if err != nil {
			continue
		}
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			noteStray(tid, b)
		}
		for f := range strings.FieldsSeq(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil || pid <= 0 {
				continue
			}
			if _, leader := leaders.Load(pid); leader {
				continue
			}
			st, err := procstat.Read(pid)
			if err != nil || !st.Dead() {
				continue // gone, or still running
			}
			if _, ours := supervised.Load(st.PGID); ours {
				continue // a member of a group a Run is proving gone: its sweep reaps it
			}
			// WNOHANG: a child that is still running is left alone.
			for {
				p, err := unix.Wait4(pid, nil, unix.WNOHANG|unix.WALL, nil)
				if err == unix.EINTR {
					continue
				}
				if p == pid {
					n++
				}
				break
			}
		}
	}
	return n
}
