package launch

import (
	"context"
	"errors"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"firstmate.dev/fm/internal/procstat"
	"golang.org/x/sys/unix"
)

// [GRP-2] [GRP-4] concurrent stops share their looks at the host's children
// (onlyLeaderChildren), but a caller is never answered by a look that
// started before it asked: a look that found only leaders is held before
// it answers, a stranger (a child that leads no invocation) starts, and a
// caller that asks then is told "not only leaders" by a look of its own,
// while the held look's caller still gets that look's answer.
func TestOnlyLeaderChildrenNeverAnswersFromAStaleLook(t *testing.T) {
	if !onlyLeaderChildren() {
		t.Skip("this test process has children that lead no invocation")
	}
	looked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	childrenLook.After = func() {
		once.Do(func() {
			close(looked)
			<-release
		})
	}
	defer func() { childrenLook.After = nil }()
	held := make(chan bool)
	go func() { held <- onlyLeaderChildren() }()
	select {
	case <-looked:
	case <-time.After(10 * time.Second):
		t.Fatal("the caller was answered without a look of its own")
	}
	startOnForkThread(t, exec.Command("sleep", "10")) // where a narrow look sees it too
	fresh := make(chan bool)
	go func() { fresh <- onlyLeaderChildren() }()
	time.Sleep(50 * time.Millisecond) // the fresh caller asks while the held look is in progress
	close(release)
	if !<-held {
		t.Error("the held look, made before the stranger started, did not find only leaders")
	}
	if <-fresh {
		t.Fatal("a caller that asked after the stranger started was answered: only leaders")
	}
}

// [GRP-4] a child that a look listed and that is gone by the time it is
// checked (a leader reaped meanwhile) is not a stranger; a running child
// that leads no invocation is.
func TestReapedLeaderIsNoStranger(t *testing.T) {
	child := exec.Command("sleep", "10")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	pid := child.Process.Pid
	if reapedLeader(pid) {
		t.Fatal("a running child was taken for a reaped leader")
	}
	child.Process.Kill()
	child.Wait()
	if !reapedLeader(pid) {
		t.Fatal("a reaped child was taken for a stranger")
	}
}

// [GRP-2] [GRP-4] A look, narrow or wide, reads every child of a children
// file, past the first read's buffer: 200 children (over 1 KiB of pids in
// one children file) that are all recorded as leaders make a true answer;
// one more child that leads nothing, started last, makes it false. All are
// forked from the fork thread, as leaders are.
func TestOnlyLeaderChildrenReadsEveryChild(t *testing.T) {
	narrowLooks(t)
	if !lookOnlyLeaderChildren() {
		t.Skip("this test process has children that lead no invocation")
	}
	for range 200 {
		cmd := exec.Command("sleep", "60")
		startOnForkThread(t, cmd)
		pid := cmd.Process.Pid
		leaders.Store(pid, struct{}{})
		t.Cleanup(func() { leaders.Delete(pid) })
	}
	for _, wide := range []bool{false, true} {
		if !lookAs(wide) {
			t.Fatalf("200 children recorded as leaders (wide %v): want true", wide)
		}
	}
	startOnForkThread(t, exec.Command("sleep", "60"))
	for _, wide := range []bool{false, true} {
		if lookAs(wide) {
			t.Fatalf("a child that leads nothing (wide %v): want false", wide)
		}
	}
}

// lockedThread is a goroutine locked to an OS thread that is neither the
// main thread nor the fork thread, running the functions sent to it.
type lockedThread struct {
	tid  int
	reqs chan func()
	once sync.Once
}

// newLockedThread starts a lockedThread; the test's end ends its thread.
func newLockedThread(t *testing.T) *lockedThread {
	for {
		th := &lockedThread{reqs: make(chan func())}
		tids := make(chan int)
		go func() {
			runtime.LockOSThread() // returning locked ends the thread
			tids <- unix.Gettid()
			for fn := range th.reqs {
				fn()
			}
		}()
		th.tid = <-tids
		if th.tid != os.Getpid() {
			t.Cleanup(th.exit)
			return th
		}
		// The main thread (the fork thread is held by its own goroutine):
		// hold it for the test, then let it go on.
		t.Cleanup(func() {
			th.do(runtime.UnlockOSThread)
			th.exit()
		})
	}
}

func (th *lockedThread) do(fn func()) {
	done := make(chan struct{})
	th.reqs <- func() {
		defer close(done)
		fn()
	}
	<-done
}

// exit makes the goroutine return, locked unless it unlocked, so Go ends
// its thread.
func (th *lockedThread) exit() { th.once.Do(func() { close(th.reqs) }) }

// listedBy returns the threads of this process whose children file lists pid.
func listedBy(t *testing.T, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var tids []int
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/children")
		if errors.Is(err, fs.ErrNotExist) {
			continue // the thread ended
		}
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(strings.Fields(string(b)), strconv.Itoa(pid)) {
			tid, _ := strconv.Atoi(e.Name())
			tids = append(tids, tid)
		}
	}
	return tids
}

// startOnForkThread starts cmd from the fork thread, as start starts a
// leader, and kills and reaps it at the test's end.
func startOnForkThread(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	var err error
	onForkThread(func() {
		forkMu.Lock()
		defer forkMu.Unlock()
		err = cmd.Start()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
}

// orphan runs sh from a thread (through run) to start a sleep of secs
// seconds in the background and exit, and returns the sleep's pid: an orphan
// of this process, which is a child subreaper. reap kills and reaps it; the
// test's end does, if the test did not.
func orphan(t *testing.T, run func(func()), secs string) (pid int, reap func()) {
	t.Helper()
	var (
		out []byte
		err error
	)
	run(func() {
		out, err = exec.Command("sh", "-c", "sleep "+secs+" </dev/null >/dev/null 2>&1 & echo $!").Output()
	})
	pid, perr := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || perr != nil {
		t.Fatalf("sh: %q %v %v", out, err, perr)
	}
	reap = sync.OnceFunc(func() {
		unix.Kill(pid, unix.SIGKILL) // pinned until reaped: ours
		unix.Wait4(pid, nil, unix.WALL, nil)
	})
	t.Cleanup(reap)
	return pid, reap
}

// narrowLooks makes every look of the test narrow (and no process-wide
// stray noted), as in a serve between two wide looks, and restores both at
// its end.
func narrowLooks(t *testing.T) {
	stray := strayChild.Load()
	wideDue.Store(math.MaxInt64)
	strayChild.Store(false)
	t.Cleanup(func() {
		wideDue.Store(0)
		strayChild.Store(stray)
	})
}

// lookAs makes one look, wide or narrow as asked (a narrow one is wide all
// the same once a stray is noted).
func lookAs(wide bool) bool {
	if wide {
		wideDue.Store(0)
	} else {
		wideDue.Store(math.MaxInt64)
	}
	return lookOnlyLeaderChildren()
}

// [GRP-4] The kernel facts the narrow look rests on (onlyLeaderChildren),
// with real processes while this process has 40 more threads: a child is
// listed by the children file of the thread that forked it (the fork
// thread, for every leader); an orphan, live or exited (a zombie), is listed
// by the main thread's file whichever thread forked its dead parent, the
// fork thread included; and the children of a thread that ends are listed by
// the main thread's file.
func TestOrphansAreAdoptedByTheMainThread(t *testing.T) {
	main := os.Getpid()
	var threads []*lockedThread
	for range 40 {
		threads = append(threads, newLockedThread(t))
	}
	onFork := func(fn func()) {
		onForkThread(func() {
			forkMu.Lock()
			defer forkMu.Unlock()
			fn()
		})
	}
	leader := exec.Command("sleep", "60")
	startOnForkThread(t, leader)
	fork := int(forkThread.tid.Load())
	if got := listedBy(t, leader.Process.Pid); !slices.Equal(got, []int{fork}) {
		t.Fatalf("a child of the fork thread %d is listed by %v", fork, got)
	}

	runs := []func(func()){onFork}
	for _, th := range threads[:8] {
		runs = append(runs, th.do)
	}
	for i, run := range runs {
		pid, _ := orphan(t, run, "60")
		if got := listedBy(t, pid); !slices.Equal(got, []int{main}) {
			t.Fatalf("orphan %d (its parent forked by thread %d of %d) is listed by %v, not the main thread %d", pid, i, len(runs), got, main)
		}
	}

	pid, _ := orphan(t, threads[8].do, "0.2")
	for st, err := procstat.Read(pid); err == nil && !st.Dead(); st, err = procstat.Read(pid) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := listedBy(t, pid); !slices.Equal(got, []int{main}) {
		t.Fatalf("zombie orphan %d is listed by %v, not the main thread %d", pid, got, main)
	}

	th := threads[9]
	child := exec.Command("sleep", "60")
	th.do(func() {
		if err := child.Start(); err != nil {
			t.Error(err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	if got := listedBy(t, child.Process.Pid); !slices.Equal(got, []int{th.tid}) {
		t.Fatalf("a child of thread %d is listed by %v", th.tid, got)
	}
	th.exit()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat("/proc/self/task/" + strconv.Itoa(th.tid)); errors.Is(err, fs.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d did not end", th.tid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := listedBy(t, child.Process.Pid); !slices.Equal(got, []int{main}) {
		t.Fatalf("the child of ended thread %d is listed by %v, not the main thread %d", th.tid, got, main)
	}
}

// [GRP-4] A sibling that a child of the fork thread makes with CLONE_PARENT
// is a child of this process listed by the fork thread's children file, as
// the narrow look assumes of a leader's such siblings.
func TestCloneParentSiblingIsListedByTheForkThread(t *testing.T) {
	var out strings.Builder
	leader := exec.Command(exe())
	leader.Env = []string{envMode + "=clone-parent", "PATH=" + os.Getenv("PATH"), noRaceExitSleep}
	leader.Stdout = &out
	startOnForkThread(t, leader)
	if err := leader.Wait(); err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(out.String())
	if err != nil {
		t.Fatalf("helper printed %q", out.String())
	}
	t.Cleanup(func() {
		unix.Kill(pid, unix.SIGKILL) // pinned until reaped: ours
		unix.Wait4(pid, nil, unix.WALL, nil)
	})
	if got, fork := listedBy(t, pid), int(forkThread.tid.Load()); !slices.Equal(got, []int{fork}) {
		t.Fatalf("sibling %d is listed by %v, not the fork thread %d", pid, got, fork)
	}
	narrowLooks(t)
	if lookOnlyLeaderChildren() {
		t.Fatalf("a narrow look missed sibling %d", pid)
	}
}

// [GRP-1] [GRP-4] Every leader is forked by the fork thread, whichever
// thread starts the launch: its barrier is listed by the fork thread's
// children file only.
func TestLeadersAreForkedByTheForkThread(t *testing.T) {
	f := newFixture(t)
	var (
		p   *Pending
		err error
	)
	newLockedThread(t).do(func() { p, err = Prepare(context.Background(), f.spec("good")) })
	if err != nil {
		t.Fatal(err)
	}
	defer p.Abort()
	leader := onlyRecord(t, f.records).Leader.PID
	if got, fork := listedBy(t, leader), int(forkThread.tid.Load()); !slices.Equal(got, []int{fork}) {
		t.Fatalf("leader %d is listed by %v, not the fork thread %d", leader, got, fork)
	}
}

// [GRP-4] A narrow look reads only the main thread's and the fork thread's
// children files: a child of another thread goes unseen by it; a wide look
// sees it, refuses, and makes every later look wide, and so does
// ReapOrphans, which reads every file. An orphan, adopted by the main
// thread, is seen by a narrow look.
func TestNarrowLookReadsTwoFiles(t *testing.T) {
	narrowLooks(t)
	if !lookOnlyLeaderChildren() {
		t.Skip("this test process has children that lead no invocation")
	}
	pid, reap := orphan(t, newLockedThread(t).do, "60")
	if lookOnlyLeaderChildren() {
		t.Fatalf("a narrow look missed orphan %d", pid)
	}
	reap()
	if !lookOnlyLeaderChildren() {
		t.Fatal("no child left but leaders: want true")
	}

	stranger := exec.Command("sleep", "60")
	newLockedThread(t).do(func() {
		if err := stranger.Start(); err != nil {
			t.Error(err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() { stranger.Process.Kill(); stranger.Wait() })
	if !lookOnlyLeaderChildren() {
		t.Fatal("a narrow look read the children file of a thread other than the main and the fork thread")
	}
	if lookAs(true) {
		t.Fatal("a wide look missed a stranger of another thread")
	}
	if !strayChild.Load() {
		t.Fatal("a wide look did not note a child of another thread")
	}
	strayChild.Store(false)
	ReapOrphans()
	if !strayChild.Load() {
		t.Fatal("ReapOrphans did not note a child of another thread")
	}
	if lookAs(false) {
		t.Fatal("a look after a stray was noted was not wide")
	}
	stranger.Process.Kill()
	stranger.Wait()
	if !lookOnlyLeaderChildren() {
		t.Fatal("no child left but leaders: want true")
	}
}
