package launch

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/launch/barrier"
)

// [GRP-1]: a barrier the host prepares starts with barrier.RuntimeEnv first
// in its environment, so its Go runtime (which reads the first GOMAXPROCS)
// runs on one P. What that saves is a matter of scheduling (a thread fewer
// for its execve to wait for), measured in docs/performance.md, "Ninth pass".
func TestPreparedBarrierRunsOnOneP(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p, err := Prepare(context.Background(), f.spec("good"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Abort()
	pid := strconv.Itoa(onlyRecord(t, f.records).Leader.PID)
	environ, err := os.ReadFile("/proc/" + pid + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	if first, _, _ := bytes.Cut(environ, []byte{0}); string(first) != barrier.RuntimeEnv {
		t.Fatalf("the barrier's environment starts with %q, want %q", first, barrier.RuntimeEnv)
	}
}

// [INV-2] [GRP-1]: the entrypoint's environment is exactly the spec's: the
// barrier takes its own barrier.RuntimeEnv out and leaves an entrypoint's own
// GOMAXPROCS as it is, wherever the spec puts it.
func TestEntrypointKeepsItsOwnGOMAXPROCS(t *testing.T) {
	t.Parallel()
	for _, env := range [][]string{{"GOMAXPROCS=7"}, {barrier.RuntimeEnv}, {"A=1", barrier.RuntimeEnv}} {
		t.Run(strings.Join(env, ","), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			s := f.spec("good")
			s.Env = append(env, s.Env...)
			s.Stdin = []byte("x")
			res, err := Run(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("ok:x|%s invoke|%s|%s", exe(), f.reports, strings.Join(s.Env, ","))
			if string(res.Stdout) != want {
				t.Errorf("stdout = %q\nwant     %q", res.Stdout, want)
			}
		})
	}
}

// [GRP-1]: a barrier started without barrier.RuntimeEnv first (not by the
// host's launch) refuses, exit 125, and runs nothing, even released: the
// entrypoint's environment could not be told from what was added to it.
func TestBarrierWithoutRuntimeEnvRunsNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	script := filepath.Join(dir, "ep")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n: > "+marker+"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, env := range [][]string{nil, {"A=1"}, {"A=1", barrier.RuntimeEnv}} {
		cmd := exec.Command(os.Args[0], BarrierArg, script, "verb")
		cmd.Env = env
		cmd.ExtraFiles = []*os.File{releasedPipe(t)}
		err := cmd.Run()
		if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != barrier.NotReleased {
			t.Errorf("env %q: %v, want exit %d", env, err, barrier.NotReleased)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("env %q: the entrypoint ran", env)
		}
	}
}
