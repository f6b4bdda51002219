package procevent_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/testpkg"
)

// [INV-1] [RUN-1] hostile review: while another process keeps renaming a
// different executable over the bound adapter's installed entrypoint, the
// polls that start and serve drive never run it. Every poll captures either
// the verified adapter's result or failure evidence (the call was refused);
// the replacement's marker never appears. start runs in-process HostileCalls
// times (every tenth with the swapper held, which must capture a result); serve (a real fm process, 10 ms between polls) runs until it has
// captured a quarter of that many polls.
func TestSwapperNeverRunsReplacementInPolls(t *testing.T) {
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	scratch := filepath.Join(f.work, "scratch")
	if err := os.Mkdir(scratch, 0o700); err != nil {
		t.Fatal(err)
	}
	f.mode("terminal", "false")
	f.mode("silent", "true") // results are marked handled: nothing piles up to announce
	sw := testpkg.StartSwapper(t, filepath.Join(f.b.PackageRoot, f.b.Entrypoint), scratch)
	n := testpkg.HostileCalls(t, 50) // each poll is several calls, and serve a whole fm
	results, evidence := 0, 0
	for i := range n {
		var out *procevent.Outcome
		var err error
		start := func() { out, err = procevent.Start(context.Background(), f.h, "s1") }
		if i%10 == 9 {
			// Every tenth poll runs with the swapper held: it must
			// capture the verified adapter's result.
			if qerr := sw.Quiet(start); qerr != nil {
				t.Fatal(qerr)
			}
			if err == nil && out.Evidence {
				t.Fatalf("a poll without a swap was refused: %s", f.read(out.Path))
			}
		} else {
			start()
		}
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		if out.Status != procevent.Captured {
			t.Fatalf("start: %+v", out)
		}
		body := f.read(out.Path)
		switch {
		case out.Evidence && (strings.Contains(body, "integrity-mismatch") || strings.Contains(body, "mode-unsafe")):
			evidence++
		case !out.Evidence && strings.HasPrefix(body, "event s1 "):
			results++
		default:
			t.Fatalf("start captured %q (evidence %v)", body, out.Evidence)
		}
	}
	runs, err := sw.Runs()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("uid %d, start: %d polls, %d swaps: %d results of the verified adapter, %d refused (evidence); replacement ran %d times", os.Geteuid(), n, sw.Swaps.Load(), results, evidence, runs)
	if runs != 0 {
		t.Fatalf("the replacement ran %d times under start", runs)
	}

	before := len(f.inbox())
	serve, log := f.serve("--min-gap", "10ms", "--max-backoff", "20ms")
	// A refusal like the last one is counted in its run, not captured
	// [OP-5]: count serve's lines of polls, captured or collapsed.
	polls := regexp.MustCompile(`(?m)^(captured|collapsed): `)
	waitFor(t, time.Duration(n)*time.Second, "serve's polls", func() bool { return len(polls.FindAllString(log.String(), -1)) >= n })
	serve.Process.Signal(syscall.SIGTERM)
	serve.Wait()
	sw.Stop()
	runs, err = sw.Runs()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("uid %d, serve: %d polls captured, %d swaps in all; replacement ran %d times", os.Geteuid(), len(f.inbox())-before, sw.Swaps.Load(), runs)
	if runs != 0 {
		t.Fatalf("the replacement ran %d times under serve\n%s", runs, log)
	}
}

// [INV-2] [INV-3] [GRP-1]: nothing of the operator's shell reaches a
// package through `fm procevent start`: started as
// `trap "" PIPE HUP; umask 0; exec 9>lock; exec fm procevent start <id>`, an
// extension adapter (a script that execs sleep, so nothing of it opens
// anything) runs with exactly descriptors 0, 1, 2 and 3 (its own verified
// file), and a built-in adapter's program (sh that execs sleep) with exactly
// 0, 1, 2; both with no signal ignored or blocked, and umask 0077.
func TestShellStateDoesNotReachThePackage(t *testing.T) {
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.mode("poll", "inherit")
	builtinPid := filepath.Join(f.work, "builtin.pid")
	f.ok("procevent", "register", "file-watch", "b1", "--", "/bin/sh", "-c", `echo $$ >"$0.tmp" && mv "$0.tmp" "$0"; exec sleep 3`, builtinPid)
	for _, tc := range []struct {
		id, pidFile, fds, fd3 string
	}{
		{"s1", filepath.Join(f.extState, "inherit.pid"), "0 1 2 3", filepath.Join(f.b.PackageRoot, f.b.Entrypoint)},
		{"b1", builtinPid, "0 1 2", ""},
	} {
		t.Run(tc.id, func(t *testing.T) {
			lock := filepath.Join(f.work, "serve.lock")
			cmd := exec.Command("/bin/sh", "-c", `trap '' PIPE HUP; umask 0; exec 9>"$1"; exec fm procevent start "$2"`, "sh", lock, tc.id)
			cmd.Env = f.env
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			var pid string
			waitFor(t, 20*time.Second, "the adapter's pid", func() bool {
				b, err := os.ReadFile(tc.pidFile)
				pid = strings.TrimSpace(string(b))
				return err == nil
			})
			proc := "/proc/" + pid
			// Asleep, not merely renamed: the kernel names the new program
			// before it closes the old one's close-on-exec descriptors, so
			// the name alone can show descriptors that are about to go.
			waitFor(t, 10*time.Second, "the adapter to become sleep and sleep", func() bool {
				b, _ := os.ReadFile(proc + "/comm")
				st, _ := os.ReadFile(proc + "/stat")
				_, after, _ := strings.Cut(string(st), ") ")
				return strings.TrimSpace(string(b)) == "sleep" && strings.HasPrefix(after, "S ")
			})
			// fm itself did inherit descriptor 9: the test is about what
			// reaches the package.
			if _, err := os.Readlink("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/fd/9"); err != nil {
				t.Fatalf("fm did not inherit descriptor 9: %v", err)
			}
			ents, err := os.ReadDir(proc + "/fd")
			if err != nil {
				t.Fatal(err)
			}
			var fds []string
			for _, e := range ents {
				fds = append(fds, e.Name())
			}
			if strings.Join(fds, " ") != tc.fds {
				t.Errorf("the adapter has descriptors %v, want exactly %s", fds, tc.fds)
			}
			if target, _ := os.Readlink(proc + "/fd/3"); tc.fd3 != "" && target != tc.fd3 {
				t.Errorf("descriptor 3 is %q, want the verified entrypoint", target)
			}
			status := f.read(proc + "/status")
			for _, want := range []string{"SigIgn:\t0000000000000000", "SigBlk:\t0000000000000000", "Umask:\t0077"} {
				if !strings.Contains(status, want+"\n") {
					t.Errorf("adapter status lacks %q:\n%s", want, status)
				}
			}
			cmd.Wait()
		})
	}
}

// [WAKE-2]: a FIFO at <state>/.wake-queue makes `wake list` and the
// re-announcement refuse at once (not a regular file) instead of blocking.
func TestFIFOWakeQueueRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.registerExt("s1")
	f.ok("procevent", "start", "s1")
	queue := filepath.Join(f.h.State, ".wake-queue")
	if err := os.Remove(queue); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(queue, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // unblock a stuck reader, should there be one
		if w, err := os.OpenFile(queue, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	})
	for _, args := range [][]string{{"wake", "list"}, {"procevent", "reconcile", "--reannounce-after", "0"}} {
		cmd, _, errs := f.background(args...)
		if code := waitExit(t, cmd, 5*time.Second); code != 1 || !strings.HasPrefix(errs.String(), "error[path-unsafe]: ") {
			t.Fatalf("fm %v with a FIFO queue: exit %d %q", args, code, errs)
		}
	}
}
