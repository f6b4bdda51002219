package procstat_test

import (
	"fmt"
	"os"
	"testing"

	"firstmate.dev/fm/internal/procstat"
)

// line is a stat line as the kernel writes it, with the given command name
// and values; the fields fm does not read hold other numbers.
func line(pid int, comm string, s procstat.Stat) string {
	return fmt.Sprintf("%d (%s) %c %d %d %d 34817 -1 4194560 100 0 0 0 %d %d %d %d 20 0 %d 0 %d 2269184 123 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n",
		pid, comm, s.State, s.PPID, s.PGID, s.SID, s.UTime, s.STime, s.CUTime, s.CSTime, s.Threads, s.Start)
}

// [GRP-4] The fields fm decides by (state, group, session, threads, start
// time) are read right whatever the command name holds: spaces, ')' and
// "(", a newline, a name that looks like the fields that follow it. PGID,
// the quick read of the /proc scan, agrees with Parse.
func FuzzParse(f *testing.F) {
	self, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(self), byte('S'), 1, 4242, 4242, uint64(3), int64(-1), 1, uint64(98765))
	for _, comm := range []string{"fm", "a) b) (c", " ", ")", ") Z 1 2 3", "(((", "x\ny", "", "a)\x00b"} {
		f.Add(comm, byte('Z'), 7, 9, 0, uint64(0), int64(5), 3, uint64(1))
	}
	f.Fuzz(func(t *testing.T, comm string, state byte, ppid, pgid, sid int, ticks uint64, child int64, threads int, start uint64) {
		state = 'A' + state%26 // the kernel's states are letters
		want := procstat.Stat{State: state, PPID: ppid, PGID: pgid, SID: sid, UTime: ticks, STime: ticks / 2,
			CUTime: child, CSTime: -child, Threads: threads, Start: start}
		l := []byte(line(ppid, comm, want))
		got, err := procstat.Parse(l)
		if err != nil || got != want {
			t.Fatalf("Parse(%q) = %+v, %v; want %+v", l, got, err, want)
		}
		if g, ok := procstat.PGID(l); !ok || g != pgid {
			t.Fatalf("PGID(%q) = %d, %v; want %d", l, g, ok, pgid)
		}
		// Any bytes at all: no panic, and PGID never contradicts Parse.
		raw := []byte(comm)
		st, err := procstat.Parse(raw)
		if g, ok := procstat.PGID(raw); ok && err == nil && g != st.PGID {
			t.Fatalf("%q: PGID %d, Parse %d", raw, g, st.PGID)
		}
	})
}

// Read reads this very process right, and a pid no process has is
// ErrNoProcess.
func TestRead(t *testing.T) {
	st, err := procstat.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.State != 'R' && st.State != 'S' || st.PPID != os.Getppid() || st.Start == 0 || st.Threads < 1 || st.Dead() {
		t.Fatalf("own stat: %+v", st)
	}
	max, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Skip(err)
	}
	var n int
	fmt.Sscan(string(max), &n)
	if _, err := procstat.Read(n + 1); err != procstat.ErrNoProcess {
		t.Fatalf("pid %d: %v", n+1, err)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1", "1 x) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"} {
		if _, err := procstat.Parse([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
		if _, ok := procstat.PGID([]byte(bad)); ok {
			t.Errorf("PGID accepted %q", bad)
		}
	}
}

// A zombie is dead only when no thread of it is left.
func TestDead(t *testing.T) {
	for _, c := range []struct {
		s    procstat.Stat
		dead bool
	}{
		{procstat.Stat{State: 'Z', Threads: 1}, true},
		{procstat.Stat{State: 'X', Threads: 0}, true},
		{procstat.Stat{State: 'Z', Threads: 2}, false},
		{procstat.Stat{State: 'S', Threads: 1}, false},
	} {
		if c.s.Dead() != c.dead {
			t.Errorf("%+v: Dead() = %v", c.s, !c.dead)
		}
	}
}
