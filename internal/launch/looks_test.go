package launch

import (
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"
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
	afterLook = func() {
		once.Do(func() {
			close(looked)
			<-release
		})
	}
	defer func() { afterLook = nil }()
	held := make(chan bool)
	go func() { held <- onlyLeaderChildren() }()
	select {
	case <-looked:
	case <-time.After(10 * time.Second):
		t.Fatal("the caller was answered without a look of its own")
	}
	stranger := exec.Command("sleep", "10")
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stranger.Process.Kill()
		stranger.Wait()
	}()
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

// [GRP-2] [GRP-4] A look reads every child of every thread, past the first
// read's buffer: 200 children (over 1 KiB of pids in one children file)
// that are all recorded as leaders make a true answer; one more child that
// leads nothing, started last, makes it false. All are forked from one
// thread, so one children file holds them all.
func TestOnlyLeaderChildrenReadsEveryChild(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if !lookOnlyLeaderChildren() {
		t.Skip("this test process has children that lead no invocation")
	}
	start := func() *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	for range 200 {
		pid := start().Process.Pid
		leaders.Store(pid, struct{}{})
		t.Cleanup(func() { leaders.Delete(pid) })
	}
	if !lookOnlyLeaderChildren() {
		t.Fatal("200 children recorded as leaders: want true")
	}
	start()
	if lookOnlyLeaderChildren() {
		t.Fatal("a child that leads nothing: want false")
	}
}
