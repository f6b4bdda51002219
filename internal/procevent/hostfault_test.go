package procevent_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/testpkg"
)

// [OP-3] [CLI-3] [RUN-2]: serve under a file limit too small for its 30
// sources (ulimit -n 64, hard and soft, so the Go runtime cannot raise it)
// runs out of descriptors again and again. That is the host's fault: no
// evidence is captured against the valid package, nothing is announced, no
// failure is logged per poll; stderr says host-resource once for the
// episode, and serve still stops cleanly on TERM with every group gone.
func TestServeUnderFileLimit(t *testing.T) {
	f := newFixture(t)
	f.bind()
	for i := range 30 {
		if _, err := procevent.RegisterExtension(context.Background(), f.h, "sig", fmt.Sprintf("s%02d", i), "ref"); err != nil {
			t.Fatal(err)
		}
	}
	f.mode("poll", "no-result")
	cmd := exec.Command("sh", "-c", "ulimit -n 64 && exec fm procevent serve --min-gap 100ms --max-backoff 400ms --rescan 200ms")
	cmd.Env = f.env
	stdout, stderr := new(testpkg.SyncBuffer), new(testpkg.SyncBuffer)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitFor(t, 60*time.Second, "a host-resource episode and 60 polls", func() bool {
		return strings.Contains(stderr.String(), "host-resource") && len(f.log("poll")) >= 60
	})
	time.Sleep(2 * time.Second) // more polls and faults under the limit
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve exited with %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop within 30 s of SIGTERM")
	}
	if n := len(f.inbox()); n != 0 {
		t.Errorf("%d inbox entries captured under the limit: %v", n, f.inbox())
	}
	if n := len(f.wakes()); n != 0 {
		t.Errorf("%d wakes appended under the limit", n)
	}
	if out := stdout.String(); out != "" {
		t.Errorf("serve logged on stdout under the limit:\n%s", out)
	}
	if n := strings.Count(stderr.String(), "host-resource"); n != 1 {
		t.Errorf("stderr says host-resource %d times, want once for the episode:\n%s", n, stderr.String())
	}
	for _, p := range f.pids() {
		if !groupGone(p) {
			t.Errorf("group %d outlived serve", p)
		}
	}
	if recs, err := launch.List(f.h.Invocations()); err != nil || len(recs) != 0 {
		t.Errorf("after TERM: %v, records %+v", err, recs)
	}
	t.Logf("%d polls under ulimit -n 64; stderr: %s", len(f.log("poll")), strings.TrimSpace(stderr.String()))
}
