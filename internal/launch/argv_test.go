package launch

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/procstat"
)

// argvSpec is a Spec that runs /bin/sh -c script (with $0 = "arg0") through
// the Argv form, as the process-event core runs a built-in adapter's command.
func argvSpec(t *testing.T, script string) Spec {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	records := filepath.Join(dir, "records")
	return Spec{
		Path: "/bin/sh", Verb: "poll", Argv: []string{"/bin/sh", "-c", script, "arg0"},
		Dir: "/", Env: []string{"PATH=/usr/bin:/bin"},
		StdoutLimit: 1024, StderrLimit: 1024, Timeout: 20 * time.Second,
		Records: records, Owner: testOwner,
	}
}

// [GRP-1] [GRP-2]: the Argv form runs the program with exactly that argv
// under the same barrier, record and group proof; an answer status is a
// result, any other non-zero status a failure; with StopLeftovers, members
// that outlive an answering leader are stopped and the answer stands, and
// without it they are a leak.
func TestArgvAnswersAndLeftovers(t *testing.T) {
	t.Parallel()
	s := argvSpec(t, `echo "$0"; exit 75`)
	s.AnswerStatuses = []int{75}
	res, err := Run(context.Background(), s)
	if err != nil || string(res.Stdout) != "arg0\n" || res.ExitStatus != 75 {
		t.Fatalf("answer status: %+v %v", res, err)
	}
	s.AnswerStatuses = nil
	if _, err := Run(context.Background(), s); !errcode.Is(err, errcode.ProcessFailed) {
		t.Fatalf("status 75 without AnswerStatuses: %v", err)
	}

	s = argvSpec(t, `sleep 60 & echo $! >"$REPORT"; echo ok`)
	report := filepath.Join(filepath.Dir(s.Records), "leftover")
	s.Env = append(s.Env, "REPORT="+report)
	s.StopLeftovers = true
	res, err = Run(context.Background(), s)
	if err != nil || string(res.Stdout) != "ok\n" || res.ExitStatus != 0 {
		t.Fatalf("leftovers stopped: %+v %v", res, err)
	}
	data, _ := os.ReadFile(report)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	if st, err := procstat.Read(pid); pid <= 0 || (err == nil && !st.Dead()) {
		t.Fatalf("the leftover %d still runs", pid)
	}
	s.StopLeftovers = false
	if _, err := Run(context.Background(), s); !errcode.Is(err, errcode.ProcessLeak) {
		t.Fatalf("leftovers without StopLeftovers: %v", err)
	}
	if recs, err := List(s.Records); err != nil || len(recs) != 0 {
		t.Fatalf("records left: %v %+v", err, recs)
	}
}

// [GRP-5]: a process that left its invocation's group re-parents to the host
// (a child subreaper) and, once it exits, ReapOrphans reaps it. Not
// parallel: ReapOrphans reaps any such child of the test process.
func TestReapOrphans(t *testing.T) {
	// The leader waits until its child has left the group (the file is
	// written after setsid), so the child is no leftover of the group.
	s := argvSpec(t, `setsid sh -c 'echo x >"$0"; exec sleep 0.1' "$REPORT" </dev/null >/dev/null 2>&1 & echo $!; while [ ! -s "$REPORT" ]; do sleep 0.01; done`)
	s.Env = append(s.Env, "REPORT="+filepath.Join(filepath.Dir(s.Records), "escaped"))
	res, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := procstat.Read(pid)
		if err != nil {
			t.Fatalf("the escaped process %d vanished without being reaped here: %v", pid, err)
		}
		if st.Dead() && st.PPID == os.Getpid() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the escaped process %d did not become this process's zombie (%+v)", pid, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := ReapOrphans(); n < 1 {
		t.Fatalf("ReapOrphans reaped %d", n)
	}
	if _, err := procstat.Read(pid); err != procstat.ErrNoProcess {
		t.Fatalf("the zombie %d was not reaped: %v", pid, err)
	}
}
