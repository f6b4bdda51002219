package launch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/procstat"
)

// [INV-4] [GRP-2] A running invocation costs its caller's goroutine and one
// more, the watcher, which reads stdout and stderr and awaits the leader's
// exit: a serve with a thousand long polls keeps two goroutines for each,
// not one per descriptor. Cancelled, every invocation ends and leaves no
// goroutine behind.
func TestRunningInvocationGoroutines(t *testing.T) {
	if _, err := Run(context.Background(), newFixture(t).spec("quick")); err != nil {
		t.Fatal(err) // the fork thread's goroutine exists from here on
	}
	const n = 20
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, n)
	fs := make([]fixture, n)
	for i := range n {
		fs[i] = newFixture(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = Run(ctx, fs[i].spec("slow"))
		}()
	}
	for _, f := range fs {
		f.reported(t, "leader")
	}
	if got := runtime.NumGoroutine() - before; got > 2*n+2 {
		t.Fatalf("%d running invocations hold %d goroutines, want at most %d", n, got, 2*n+2)
	}
	cancel()
	wg.Wait()
	for i, err := range errs {
		if !errcode.Is(err, errcode.ProcessFailed) {
			t.Fatalf("invocation %d: %v, want process-failed (cancelled)", i, err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after every invocation ended, %d before", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// [GRP-2] [OP-3] Run returns holding no descriptor of its invocation: the
// watcher's epoll instance is closed by then, not a moment later by the
// watcher's goroutine. Else a host near its file limit finds a descriptor
// it counted free still taken (a launch right after another fails as a host
// fault), and TestPipesAtFileLimit's count sees it.
func TestRunReturnsWithoutDescriptors(t *testing.T) {
	f := newFixture(t)
	if _, err := Run(context.Background(), f.spec("quick")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the first watcher is surely done
	before := openFDs(t)
	for i := range 200 {
		if _, err := Run(context.Background(), f.spec("quick")); err != nil {
			t.Fatal(err)
		}
		if n := openFDs(t); n != before {
			t.Fatalf("run %d returned with %d descriptors open, %d before; now %v", i, n, before, fdNames())
		}
	}
}

// [OP-3] A host out of epoll watches (fs.epoll.max_user_watches, counted
// per user over all its epoll instances) fails each launch as a host fault,
// whichever of the watcher's registrations is the one refused (stdout's,
// stderr's, the runtime poller's of the epoll instance itself, the leader's),
// and leaves no descriptor or record, or the launch succeeds. The host runs
// as a uid of its own, which no other process uses, so it alone counts its
// watches: it takes every watch left, then gives back k of them before each
// launch. The limit is lowered for the host's run only, to far above what
// the machine's other users hold, and restored. Root only: it sets a sysctl.
func TestWatchesAtUserLimit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: lowers fs.epoll.max_user_watches and runs a host as a uid of its own")
	}
	const sysctl = "/proc/sys/fs/epoll/max_user_watches"
	b, err := os.ReadFile(sysctl)
	if err != nil {
		t.Skip(err)
	}
	orig, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// Every watch on the machine, whoever holds it: the lowered limit
	// leaves each user at least 20,000 more.
	used := 0
	fdinfos, _ := filepath.Glob("/proc/[0-9]*/fdinfo/*")
	for _, p := range fdinfos {
		if l, _ := os.Readlink(strings.Replace(p, "/fdinfo/", "/fd/", 1)); l == "anon_inode:[eventpoll]" {
			b, _ := os.ReadFile(p)
			used += strings.Count(string(b), "\ntfd:")
		}
	}
	limit := used + 20000
	if limit >= orig {
		t.Skipf("%d watches in use, the limit is %d", used, orig)
	}
	const uid = 61237
	statuses, _ := filepath.Glob("/proc/[0-9]*/status")
	for _, p := range statuses {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), "\nUid:\t"+strconv.Itoa(uid)+"\t") {
			t.Skipf("uid %d is in use", uid)
		}
	}
	dir, err := os.MkdirTemp("", "watch-limit")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := fixture{records: filepath.Join(dir, "extension-invocations"), reports: filepath.Join(dir, "reports")}
	for _, d := range []string{dir, f.reports} {
		if err := os.Mkdir(d, 0o700); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	// The host runs a copy of this binary that its uid can execute.
	bin := filepath.Join(dir, "host")
	if b, err := os.ReadFile(exe()); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	// Bounded, so that a hung launch cannot keep the sysctl lowered.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = []string{envMode + "=watch-limit", envReport + "=" + f.reports, envRecords + "=" + f.records, noRaceExitSleep}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	if err := os.WriteFile(sysctl, []byte(strconv.Itoa(limit)), 0); err != nil {
		t.Skip(err)
	}
	out, err := cmd.CombinedOutput()
	if werr := os.WriteFile(sysctl, []byte(strconv.Itoa(orig)), 0); werr != nil {
		t.Errorf("restore %s to %d: %v", sysctl, orig, werr)
	}
	if err != nil {
		t.Fatalf("host: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	if !strings.Contains(string(out), "host-resource") {
		t.Fatal("no launch met the limit")
	}
	assertNoRecords(t, f.records)
}

// watchLimitHost is the host of TestWatchesAtUserLimit: it takes every epoll
// watch its user has left, then for k = 0..8 gives back k and runs a launch
// (sh, which needs no watch of its own), printing its outcome. It fails on a
// launch that fails otherwise than as a host fault, or that leaves a
// descriptor open.
func watchLimitHost() int {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		fmt.Println(err)
		return 1
	}
	fds := []int{p[0]}
	for range 99 {
		fd, err := unix.Dup(p[0])
		if err != nil {
			fmt.Println(err)
			return 1
		}
		fds = append(fds, fd)
	}
	type watch struct{ ep, fd int }
	var held []watch
	eps := 0
	take := func() error {
		for {
			ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
			if err != nil {
				return err
			}
			eps++
			for _, fd := range fds {
				if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN}); err == unix.ENOSPC {
					return nil
				} else if err != nil {
					return err
				}
				held = append(held, watch{ep, fd})
			}
		}
	}
	records, reports := os.Getenv(envRecords), os.Getenv(envReport)
	s := Spec{
		Path: "/bin/sh", Argv: []string{"/bin/sh", "-c", "cat"}, Verb: "invoke", Dir: reports,
		Env: []string{"PATH=/usr/bin:/bin"}, Stdin: []byte("ok"),
		StdoutLimit: 65536, StderrLimit: 8192, Timeout: 30 * time.Second,
		Records: records, Owner: testOwner,
	}
	if _, err := Run(context.Background(), s); err != nil { // the first launch's one-time set-up
		fmt.Println(err)
		return 1
	}
	countFDs := func() int {
		ents, _ := os.ReadDir("/proc/self/fd")
		return len(ents) - eps
	}
	before := countFDs()
	for k := 0; k <= 8; k++ {
		if err := take(); err != nil {
			fmt.Println(err)
			return 1
		}
		for _, w := range held[len(held)-k:] {
			unix.EpollCtl(w.ep, unix.EPOLL_CTL_DEL, w.fd, nil)
		}
		held = held[:len(held)-k]
		res, err := Run(context.Background(), s)
		switch {
		case err != nil && !errcode.Is(err, errcode.HostResource):
			fmt.Printf("%d watches free: %v, want host-resource\n", k, err)
			return 1
		case err != nil:
			fmt.Printf("%d watches free: %s: %v\n", k, errcode.Of(err), err)
		case string(res.Stdout) != "ok":
			fmt.Printf("%d watches free: stdout %q\n", k, res.Stdout)
			return 1
		default:
			fmt.Printf("%d watches free: ok\n", k)
		}
		if n := countFDs(); n != before {
			fmt.Printf("%d watches free: %d descriptors open, %d before\n", k, n, before)
			return 1
		}
	}
	return 0
}

// [INV-4] [GRP-2] [GRP-5] The watcher against hostile streams, each a real
// sh entrypoint: floods of stdout and stderr at once and past their bounds
// (TERM obeyed or ignored) end the invocation at once; a package that closes
// its streams and runs on is waited for; a process that left the group
// holding stdout or stderr, or writing both while drain cuts them, is a
// process-leak after pipeGrace, never a hang, and is not signalled (a
// writer dies of SIGPIPE once cut); the leader killed by SIGKILL, or leaving
// a child in its group, ends as always. Each leaves no record, descriptor or
// goroutine behind. Not parallel: it counts them.
func TestWatcherHostileStreams(t *testing.T) {
	f := newFixture(t)
	if _, err := Run(context.Background(), f.spec("quick")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the first watcher is surely done
	fds, routines := openFDs(t), runtime.NumGoroutine()
	// An escaped holder reports its pid as $R/held, then the leader answers.
	const escape = ` & while [ ! -s "$R/held" ]; do sleep 0.01; done; echo ok`
	for _, c := range []struct {
		name, script string
		want         []errcode.Code // "" is an answer
		max          time.Duration
	}{
		{"flood both", `cat /dev/zero & cat /dev/zero >&2 & wait`, []errcode.Code{errcode.ResponseOversized, errcode.StderrOversized}, 3 * time.Second},
		{"flood stdout, TERM ignored", `trap '' TERM; exec cat /dev/zero`, []errcode.Code{errcode.ResponseOversized}, 3 * time.Second},
		{"flood stderr, TERM ignored", `trap '' TERM; exec cat /dev/zero >&2`, []errcode.Code{errcode.StderrOversized}, 3 * time.Second},
		{"stdout closed, runs on", `exec >&-; sleep 0.3; echo x >&2`, []errcode.Code{""}, 3 * time.Second},
		{"both closed, runs on", `exec >&- 2>&-; sleep 0.3`, []errcode.Code{""}, 3 * time.Second},
		{"escaped holder of stdout", `setsid sh -c 'echo $$ > "$R/held"; exec sleep 30' 2>/dev/null` + escape, []errcode.Code{errcode.ProcessLeak}, 4 * time.Second},
		{"escaped holder of stderr", `setsid sh -c 'echo $$ > "$R/held"; exec sleep 30' >/dev/null` + escape, []errcode.Code{errcode.ProcessLeak}, 4 * time.Second},
		{"escaped writer of both", `setsid sh -c 'echo $$ > "$R/held"; while :; do echo x; echo y >&2; sleep 0.02; done'` + escape, []errcode.Code{errcode.ProcessLeak}, 4 * time.Second},
		{"leader killed", `echo part; kill -9 $$`, []errcode.Code{errcode.ProcessFailed}, 3 * time.Second},
		{"child left in the group", `sleep 30 & echo ok`, []errcode.Code{errcode.ProcessLeak}, 3 * time.Second},
	} {
		f := newFixture(t)
		s := f.spec("quick")
		s.Path, s.Argv = "/bin/sh", []string{"/bin/sh", "-c", c.script}
		s.Env = []string{"PATH=/usr/bin:/bin", "R=" + f.reports}
		start := time.Now()
		res, err := Run(context.Background(), s)
		took := time.Since(start)
		code := errcode.Code("")
		if err != nil {
			code = errcode.Of(err)
		}
		if !slices.Contains(c.want, code) {
			t.Errorf("%s: %v, want one of %q", c.name, err, c.want)
		} else if code == "" && res.ExitStatus != 0 {
			t.Errorf("%s: exit status %d", c.name, res.ExitStatus)
		}
		if took > c.max {
			t.Errorf("%s: took %v", c.name, took)
		}
		if b, err := os.ReadFile(filepath.Join(f.reports, "held")); err == nil {
			held, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			id := Identity{PID: held}
			id.BootID, _ = BootID()
			if st, err := procstat.Read(held); err == nil {
				id.StartTime = st.Start
			}
			if c.name == "escaped writer of both" {
				reapOrphans(t, id) // SIGPIPE, once cut
			} else if live, _ := alive(id); !live {
				t.Errorf("%s: the escaped process was signalled", c.name)
			}
			syscall.Kill(held, syscall.SIGKILL)
			reapOrphans(t, id)
		}
		assertNoRecords(t, f.records)
	}
	deadline := time.Now().Add(10 * time.Second)
	for openFDs(t) != fds || runtime.NumGoroutine() > routines {
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors, %d before; %d goroutines, %d before; now %v", openFDs(t), fds, runtime.NumGoroutine(), routines, fdNames())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
