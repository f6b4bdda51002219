package procevent_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/procstat"
	"firstmate.dev/fm/internal/testpkg"
)

// serve starts `fm procevent serve` with a short gap and rescan.
func (f *fixture) serve(extra ...string) (*exec.Cmd, *testpkg.SyncBuffer) {
	f.t.Helper()
	cmd := f.fmCmd(append([]string{"procevent", "serve", "--min-gap", "200ms", "--rescan", "200ms"}, extra...)...)
	out := new(testpkg.SyncBuffer)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, out
}

// results counts the captured results per source.
func (f *fixture) results() map[string]int {
	n := map[string]int{}
	for _, name := range f.inbox() {
		if s, ok := strings.CutSuffix(name, ".result"); ok {
			n[s[:strings.LastIndexByte(s, '.')]]++
		}
	}
	return n
}

// pids lists the process groups of every invoke the fake has run.
func (f *fixture) pids() []int {
	var out []int
	for _, s := range strings.Fields(f.read(filepath.Join(f.extState, "pids"))) {
		p, _ := strconv.Atoi(s)
		out = append(out, p)
	}
	return out
}

// maxOverlap is the highest number of polls the fake saw running at once,
// from its "start|end <source> <unix time>" lines; it also checks that no
// source ever had two polls at once [RUN-4].
func (f *fixture) maxOverlap() int {
	f.t.Helper()
	type ev struct {
		at    float64
		delta int
	}
	var evs []ev
	running := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(f.read(filepath.Join(f.extState, "times"))), "\n") {
		fs := strings.Fields(l)
		at, _ := strconv.ParseFloat(fs[2], 64)
		d := 1
		if fs[0] == "end" {
			d = -1
		}
		evs = append(evs, ev{at, d})
		if running[fs[1]] += d; running[fs[1]] > 1 {
			f.t.Fatalf("source %s had two polls at once:\n%s\nlog:\n%s", fs[1], f.read(filepath.Join(f.extState, "times")), f.read(filepath.Join(f.extState, "log")))
		}
	}
	sort.Slice(evs, func(i, j int) bool {
		return evs[i].at < evs[j].at || (evs[i].at == evs[j].at && evs[i].delta < evs[j].delta)
	})
	cur, best := 0, 0
	for _, e := range evs {
		cur += e.delta
		best = max(best, cur)
	}
	return best
}

// [RUN-2] [RUN-4] [CAP-1] [GRP-3]: serve polls 50 sources concurrently, one
// poll per source at a time, picks up registrations and retirements live,
// refuses a second serve, and stops cleanly on TERM. A kill -9 of serve
// loses no captured result, and the next serve proves the killed polls'
// groups gone before polling again.
//
// It runs alone (not in parallel), so the load of 50 concurrent polls does not
// slow the other tests' timed polls.
func TestServeFiftySources(t *testing.T) {
	f := newFixture(t)
	f.bind()
	tokens := map[string]string{}
	for i := range 50 {
		id := fmt.Sprintf("s%02d", i)
		r, err := procevent.RegisterExtension(context.Background(), f.h, "sig", id, "ref")
		if err != nil {
			t.Fatal(err)
		}
		tokens[id] = r.Token
	}
	// Each poll waits until all 50 have started (at most 60 s), so a serve
	// that let any poll wait for another's end would not capture them all
	// in time, and all 50 are seen running at once however slowly this
	// machine starts them.
	f.mode("poll", "rendezvous")
	f.write(filepath.Join(f.extState, "rendezvous"), "50", 0o600)
	begin := time.Now()
	serve, log := f.serve()
	waitFor(t, 50*time.Second, "a capture from every source", func() bool { return len(f.results()) == 50 })
	first := time.Since(begin)
	if n := f.maxOverlap(); n != 50 {
		t.Fatalf("at most %d of 50 polls ran at once", n)
	}
	t.Logf("50 sources: all polling at once, captured after %s", first.Round(time.Millisecond))

	f.fails("source-active", "procevent", "serve")

	// Live pick-up of a new registration and of a retirement.
	f.ok("procevent", "retire", "s00", "--if-owner", tokens["s00"])
	f.registerExt("s50")
	waitFor(t, 20*time.Second, "the new source's capture", func() bool { return f.results()["s50"] > 0 })
	retiredAt := len(f.log("poll s00"))
	time.Sleep(time.Second)
	if n := len(f.log("poll s00")); n != retiredAt {
		t.Fatalf("a retired source was polled again (%d -> %d polls)", retiredAt, n)
	}

	// kill -9 while every source is in a poll that will not end on its own.
	f.mode("poll", "gate")
	waitFor(t, 20*time.Second, "gated polls in flight", func() bool {
		ents, _ := filepath.Glob(filepath.Join(f.extState, "started.*"))
		return len(ents) >= 40
	})
	before := f.results()
	serve.Process.Signal(syscall.SIGKILL)
	serve.Wait()
	orphans := f.pids()
	recs, err := launch.List(f.h.Invocations())
	if err != nil || len(recs) < 40 {
		t.Fatalf("after kill -9: %v, %d owner records", err, len(recs))
	}
	for _, name := range f.inbox() {
		if s, ok := strings.CutSuffix(name, ".result"); ok && !contains(f.inbox(), s+".meta.json") {
			t.Fatalf("%s has no meta", name)
		}
	}

	f.mode("poll", "result")
	f.release()
	serve, log = f.serve("--reannounce-after", "0")
	waitFor(t, 20*time.Second, "the killed serve's groups to be proved gone", func() bool {
		for _, p := range orphans {
			if !groupGone(p) {
				return false
			}
		}
		return true
	})
	waitFor(t, 20*time.Second, "new captures after the restart", func() bool { return f.results()["s01"] > before["s01"] })
	after := f.results()
	for id, n := range before {
		if after[id] < n {
			t.Fatalf("source %s lost captures: %d -> %d", id, n, after[id])
		}
	}
	keys := map[string]bool{}
	for _, w := range f.wakes() {
		keys[w.Key] = true
	}
	for id, n := range before {
		for seq := 1; seq <= n; seq++ {
			if !keys[fmt.Sprintf("procevent:%s:%d", id, seq)] {
				t.Fatalf("captured result %s.%d was never announced", id, seq)
			}
		}
	}

	serve.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- serve.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve exited with %v\n%s", err, log.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop within 15 s of SIGTERM")
	}
	for _, p := range f.pids() {
		if !groupGone(p) {
			t.Fatalf("group %d outlived serve", p)
		}
	}
	if recs, err := launch.List(f.h.Invocations()); err != nil || len(recs) != 0 {
		t.Fatalf("after TERM: %v, records %+v", err, recs)
	}
}

// zombieChildren counts the zombie children of process pid.
func zombieChildren(pid int) int {
	n := 0
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, c := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(c)
			if err != nil {
				continue
			}
			if st, err := procstat.Read(pid); err == nil && st.State == 'Z' {
				n++
			}
		}
	}
	return n
}

// [RUN-2] [GRP-5]: serve, a child subreaper, reaps the processes that left
// their poll's group and re-parented to it, so its zombies do not accumulate.
func TestServeReapsEscapedProcesses(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	countFile := filepath.Join(f.work, "polls")
	// Each poll leaves a process in a session of its own, which exits soon
	// after the poll: an orphan of serve. The poll ends only once that
	// process has left its group (it writes the flag after setsid).
	flag := filepath.Join(f.work, "escaped")
	f.ok("procevent", "register", "file-watch", "z1", "--", "/bin/sh", "-c",
		`echo . >>"$0"; rm -f "$1"; setsid sh -c 'echo x >"$0"; exec sleep 0.1' "$1" </dev/null >/dev/null 2>&1 & while [ ! -s "$1" ]; do sleep 0.01; done; exit 75`, countFile, flag)
	serve, log := f.serve()
	waitFor(t, 30*time.Second, "twenty polls", func() bool {
		data, _ := os.ReadFile(countFile)
		return strings.Count(string(data), ".") >= 20
	})
	time.Sleep(time.Second)
	if n := zombieChildren(serve.Process.Pid); n > 3 {
		t.Fatalf("serve has %d zombie children\n%s", n, log)
	}
	serve.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, serve, 15*time.Second); code != 0 {
		t.Fatalf("serve exited %d\n%s", code, log)
	}
}

// [CAP-1] [CAP-2] serve's passes take their source's inbox names from its
// index (inboxindex.go), and still see what another process puts in the
// inbox while serve runs: a handled marker past the counter moves the next
// sequence past it, a stale pending marker is cleared, and a name past the
// last sequence stops the source with sequence-exhausted.
func TestServeSeesInboxChanges(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.mode("poll", "result")
	seqs := func() []int {
		var out []int
		for _, n := range f.inbox() {
			if s, ok := strings.CutSuffix(strings.TrimPrefix(n, "s1."), ".result"); ok {
				if seq, err := strconv.Atoi(s); err == nil {
					out = append(out, seq)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	last := func() int {
		if s := seqs(); len(s) > 0 {
			return s[len(s)-1]
		}
		return 0
	}
	serve, log := f.serve()
	waitFor(t, 20*time.Second, "two captures", func() bool { return len(seqs()) >= 2 })

	// A pass is at most one at a time, and the one in flight may have
	// decided its sequence (last+1) before the markers went in: it rightly
	// captures below the handled marker. No other may.
	before := last()
	skip := before + 50
	// The marker first: a pass that sees the handled marker sees it too.
	stale := filepath.Join(f.h.Inbox(), fmt.Sprintf("s1.%d.pending", skip-10))
	f.write(stale, "", 0o600)
	f.write(filepath.Join(f.h.Inbox(), fmt.Sprintf("s1.%d.handled", skip)), "", 0o600)
	waitFor(t, 20*time.Second, "a capture past the handled marker", func() bool { return last() > skip })
	for _, seq := range seqs() {
		if seq > before+1 && seq <= skip {
			t.Fatalf("sequence %d was captured after a handled marker of %d was in the inbox: %v", seq, skip, seqs())
		}
	}
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Fatalf("the stale pending marker is still there: %v", err)
	}

	f.write(filepath.Join(f.h.Inbox(), "s1.9223372036854775808.result"), "x", 0o600)
	waitFor(t, 20*time.Second, "the source refused", func() bool {
		return strings.Contains(log.String(), "failed: s1 (sequence-exhausted)")
	})
	polls := len(f.log("poll"))
	time.Sleep(time.Second)
	if n := len(f.log("poll")); n != polls {
		t.Fatalf("%d poll(s) after the source's sequence was exhausted", n-polls)
	}
	serve.Process.Signal(syscall.SIGTERM)
	serve.Wait()
}

// [CAP-1] [CAP-2] An operator removes the inbox while serve is stopped,
// after enough changes that inotify's queue overflowed (the IN_IGNORED of
// the removed directory is lost with them), and makes it again; ext4 gives
// the new directory the old one's inode number. serve still sees what is put
// in the new inbox: a name past the last sequence stops the source with
// sequence-exhausted.
func TestServeSeesInboxReplacedAfterOverflow(t *testing.T) {
	limit := procevent.InotifyQueueLimit(t)
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.mode("poll", "result")
	serve, log := f.serve()
	waitFor(t, 20*time.Second, "two captures", func() bool { return f.results()["s1"] >= 2 })
	inbox := f.h.Inbox()
	// held reports whether serve has the directory fi open (a pass pins the
	// inbox it works on; serve's maintenance pins the first it finds).
	held := func(fi os.FileInfo) bool {
		fds := fmt.Sprintf("/proc/%d/fd", serve.Process.Pid)
		ents, _ := os.ReadDir(fds)
		for _, e := range ents {
			if o, err := os.Stat(filepath.Join(fds, e.Name())); err == nil && os.SameFile(o, fi) {
				return true
			}
		}
		return false
	}
	reused := false
	for try := 0; try < 200 && !reused; try++ {
		before, err := os.Stat(inbox)
		if err != nil {
			t.Fatal(err)
		}
		serve.Process.Signal(syscall.SIGSTOP)
		if try > 0 && held(before) {
			serve.Process.Signal(syscall.SIGCONT)
			time.Sleep(time.Duration(try%7) * 10 * time.Millisecond)
			continue
		}
		a, b := filepath.Join(inbox, "junk-a"), filepath.Join(inbox, "junk-b")
		f.write(a, "", 0o600)
		for range limit/2 + 1 { // two events per rename: the queue overflows
			if err := os.Rename(a, b); err != nil {
				t.Fatal(err)
			}
			a, b = b, a
		}
		if err := os.RemoveAll(inbox); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(inbox, 0o700); err != nil {
			t.Fatal(err)
		}
		after, err := os.Stat(inbox)
		if err != nil {
			t.Fatal(err)
		}
		reused = os.SameFile(before, after)
		serve.Process.Signal(syscall.SIGCONT)
		n := len(f.log("poll"))
		waitFor(t, 20*time.Second, "two polls", func() bool { return len(f.log("poll")) >= n+2 })
	}
	if !reused {
		t.Skip("the new inbox never got the old one's inode number here")
	}
	f.write(filepath.Join(inbox, "s1.9223372036854775808.result"), "x", 0o600)
	waitFor(t, 20*time.Second, "the source refused", func() bool {
		return strings.Contains(log.String(), "failed: s1 (sequence-exhausted)")
	})
	serve.Process.Signal(syscall.SIGTERM)
	serve.Wait()
}

// [INV-5] [RUN-2]: serve starts at most its launch gate's number of calls
// at once, however many sources start together: with GOMAXPROCS=1 (a gate
// of four) and twelve sources, whose handshakes each take 0.3 s, no more
// than four handshakes ever run at once, and every source is still polled.
func TestServeBoundsStartUps(t *testing.T) {
	f := newFixture(t)
	f.bind()
	const sources = 12
	for i := range sources {
		if _, err := procevent.RegisterExtension(context.Background(), f.h, "sig", fmt.Sprintf("s%02d", i), "ref"); err != nil {
			t.Fatal(err)
		}
	}
	f.mode("poll", "no-result")
	f.mode("handshake", "timed")
	cmd := f.fmCmd("procevent", "serve", "--min-gap", "200ms", "--rescan", "200ms")
	cmd.Env = slices.Concat(cmd.Env, []string{"GOMAXPROCS=1"})
	out := new(testpkg.SyncBuffer)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitFor(t, 60*time.Second, "every source polled", func() bool {
		polled := map[string]bool{}
		for _, l := range f.log("poll") {
			polled[strings.Fields(l)[1]] = true
		}
		return len(polled) == sources
	})
	cmd.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, cmd, 15*time.Second); code != 0 {
		t.Fatalf("serve exited %d on TERM:\n%s", code, out)
	}
	if n := f.maxOverlap(); n > 4 {
		t.Fatalf("[INV-5] %d handshakes ran at once under a gate of 4:\n%s", n, f.read(filepath.Join(f.extState, "times")))
	}
}
