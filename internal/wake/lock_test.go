package wake

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
)

// holdQueue starts a real process (flock(1); -o keeps the lock out of its
// child, so the holder is the process that took it) that holds the lock of the queue
// in dir, as a writer in the middle of an append does, until the test ends or
// the returned function kills it.
func holdQueue(t *testing.T, dir string) (kill func()) {
	t.Helper()
	cmd := exec.Command("flock", "-x", "-o", filepath.Join(dir, FileName), "-c", "echo held; exec sleep 60")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("flock(1) is needed to hold the queue from another process: %v", err)
	}
	kill = func() { cmd.Process.Kill(); cmd.Wait() }
	t.Cleanup(kill)
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "held\n" {
		t.Fatalf("the holder did not take the lock: %q %v", line, err)
	}
	return kill
}

// [WAKE-1]: two writers never append at once, even when the queue file is
// removed, or replaced by a new file, while a writer holds its lock: an
// append then waits for that writer (here until its context ends,
// process-failed, writing nothing) and goes on once the writer is gone.
func TestAppendWaitsForHolderOfSpoiledQueue(t *testing.T) {
	for _, replace := range []bool{false, true} {
		dir, state := stateDir(t)
		if _, err := Append(context.Background(), state, "check", "a", "one"); err != nil {
			t.Fatal(err)
		}
		kill := holdQueue(t, dir)
		queue := filepath.Join(dir, FileName)
		if replace {
			if err := os.WriteFile(queue+".new", nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(queue+".new", queue); err != nil {
				t.Fatal(err)
			}
		} else if err := os.Remove(queue); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := Append(ctx, state, "check", "b", "two")
		cancel()
		if !errcode.Is(err, errcode.ProcessFailed) {
			t.Fatalf("replace=%v: an append ran alongside the queue's holder: %v", replace, err)
		}
		if data, _ := os.ReadFile(queue); len(data) != 0 {
			t.Fatalf("replace=%v: the refused append wrote %q", replace, data)
		}
		kill()
		if w, err := Append(context.Background(), state, "check", "c", "three"); err != nil || w.Key != "c" {
			t.Fatalf("replace=%v: after the holder: %+v %v", replace, w, err)
		}
	}
}

// [WAKE-1]: an append waiting for the queue's lock stops when its context
// ends (fm's SIGTERM/SIGINT), promptly and without writing.
func TestAppendStopsOnCancel(t *testing.T) {
	dir, state := stateDir(t)
	if _, err := Append(context.Background(), state, "check", "a", "one"); err != nil {
		t.Fatal(err)
	}
	holdQueue(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Append(ctx, state, "check", "b", "two")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the append did not wait for the holder: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if !errcode.Is(err, errcode.ProcessFailed) {
			t.Fatalf("a cancelled append returned %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a cancelled append did not return")
	}
	if ws, err := List(dir, 0); err != nil || len(ws) != 1 {
		t.Fatalf("queue after the cancelled append: %+v %v", ws, err)
	}
}
