package lifecycle

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
)

// A child process that takes the lock, says so, and waits to be killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("FM_LIFECYCLE_HOLD"); dir != "" {
		l, err := Acquire(context.Background(), &home.Home{Dir: dir, State: filepath.Join(dir, "state")})
		if err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString("held\n")
		time.Sleep(time.Minute)
		l.Release()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// [LIFE-1] a live holder is never stolen from; its death releases the lock.
func TestLockReleasedOnlyByHolderDeath(t *testing.T) {
	dir, _ := filepath.EvalSymlinks(t.TempDir())
	h := &home.Home{Dir: dir, State: filepath.Join(dir, "state")}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FM_LIFECYCLE_HOLD="+dir)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil || string(buf) != "held\n" {
		t.Fatalf("holder did not take the lock: %q %v", buf, err)
	}
	got := make(chan *Lock, 1)
	go func() {
		l, err := Acquire(context.Background(), h)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	select {
	case <-got:
		t.Fatal("the lock was taken from a live holder")
	case <-time.After(300 * time.Millisecond):
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	select {
	case l := <-got:
		l.Release()
	case <-time.After(5 * time.Second):
		t.Fatal("the holder's death did not release the lock")
	}
	fi, err := os.Lstat(filepath.Join(dir, "data", "extensions", "lifecycle.lock"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("lock file: %v %v", fi, err)
	}
}

// holdLock starts a child process that takes the lock of dir and holds it
// until it is killed.
func holdLock(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FM_LIFECYCLE_HOLD="+dir)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil || string(buf) != "held\n" {
		t.Fatalf("holder did not take the lock: %q %v", buf, err)
	}
	return cmd
}

// [LIFE-1] a waiter whose context ends (SIGTERM or SIGINT in fm) stops
// waiting at once, holding nothing; the live holder keeps the lock.
func TestAcquireStopsWhenCancelled(t *testing.T) {
	dir, _ := filepath.EvalSymlinks(t.TempDir())
	h := &home.Home{Dir: dir, State: filepath.Join(dir, "state")}
	holder := holdLock(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		l, err := Acquire(ctx, h)
		l.Release()
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errcode.Is(err, errcode.ProcessFailed) {
			t.Fatalf("a cancelled wait returned %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a cancelled wait for the lifecycle lock did not return")
	}
	holder.Process.Signal(syscall.SIGKILL)
	holder.Wait()
	l, err := Acquire(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
}

// [LIFE-1] a symlinked lock file is refused, never followed.
func TestLockRefusesLink(t *testing.T) {
	dir, _ := filepath.EvalSymlinks(t.TempDir())
	h := &home.Home{Dir: dir, State: filepath.Join(dir, "state")}
	os.MkdirAll(h.Extensions(), 0o700)
	target := filepath.Join(dir, "elsewhere")
	os.WriteFile(target, nil, 0o600)
	os.Symlink(target, filepath.Join(h.Extensions(), "lifecycle.lock"))
	if l, err := Acquire(context.Background(), h); err == nil {
		l.Release()
		t.Fatal("a symlinked lock file was followed")
	}
}
