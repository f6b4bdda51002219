package procevent

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/strictjson"
)

// The built-in ("legacy") adapter interface, documented in docs/procevent.md.
//
// Poll: the registration's argv is executed directly (no shell; a bare
// program name is looked up in the runner's PATH) with the runner's
// environment, working directory "/", stdin empty and stderr discarded, in a
// process group of its own. Exit 0 with non-empty stdout is a result (stdout
// is the result, at most protocol.MaxPollOutput bytes); exit 0 with empty
// stdout, or exit 75, is no result; anything else is a failure, reported and
// not captured (only extensions produce captured failure evidence).
//
// Verdicts and classification: the adapter script
// <code root>/bin/fm-procevent-<adapter>.sh is run directly as
// [script, verb, source-id, seq] with verb classify, terminal or silent, the
// captured result on stdin, and the fixed environment builtinEnv (nothing of
// the caller's environment, so no variable can steer a verdict). classify
// prints one lower-case token; terminal and silent print "true" or "false".
// Any other answer, a non-zero exit or a timeout is a failure: no
// classification, and the false path for terminal and silent.

const (
	builtinPollTimeout    = 300 * time.Second
	builtinVerdictTimeout = 30 * time.Second
	// builtinGrace is how long a stopped group has between TERM and KILL.
	builtinGrace = 500 * time.Millisecond
	// builtinNoResult is the exit status of a poll with no result
	// (EX_TEMPFAIL), the same as `fm extension process-event`'s.
	builtinNoResult  = 75
	maxVerdictOutput = 4096
)

// builtinEnv is the whole environment of an adapter script's verdicts.
var builtinEnv = []string{"PATH=" + host.SystemPath, "LANG=C", "LC_ALL=C"}

// pollBuiltin runs one built-in poll; nil content with a nil error is no
// result.
func pollBuiltin(ctx context.Context, argv []string) ([]byte, error) {
	out, status, err := runGroup(ctx, argv, os.Environ(), nil, protocol.MaxPollOutput, builtinPollTimeout)
	switch {
	case err != nil:
		return nil, err
	case status == builtinNoResult || (status == 0 && len(out) == 0):
		return nil, nil
	case status == 0:
		return out, nil
	}
	return nil, errcode.New(errcode.ProcessFailed, "built-in poll %q exited with status %d", argv[0], status)
}

// askBuiltin asks the adapter script of a built-in result one of the result
// operations and returns the answer in the extension result types.
func askBuiltin(ctx context.Context, h *home.Home, m *Meta, op string, content []byte) (any, error) {
	verb := strings.TrimPrefix(op, "result.")
	script := host.BuiltinScript(h, m.Adapter)
	out, status, err := runGroup(ctx, []string{script, verb, m.SourceID, strconv.FormatInt(m.Sequence, 10)}, builtinEnv, content, maxVerdictOutput, builtinVerdictTimeout)
	if err != nil {
		return nil, err
	}
	if status != 0 {
		return nil, errcode.New(errcode.ProcessFailed, "built-in adapter %q %s exited with status %d", script, verb, status)
	}
	answer := strings.TrimSuffix(string(out), "\n")
	if op == protocol.OpClassify {
		// The extension rule for a classification applies unchanged.
		raw, err := strictjson.Canonical(protocol.ClassifyResult{Classification: answer})
		if err != nil {
			return nil, err
		}
		return protocol.DecodeResult(op, raw)
	}
	if answer != "true" && answer != "false" {
		return nil, errcode.New(errcode.ResponseInvalid, "built-in adapter %q %s must answer true or false", script, verb)
	}
	return &protocol.BoolResult{Value: answer == "true"}, nil
}

// runGroup runs argv directly in a new process group with exactly env and
// stdin, keeps at most limit bytes of stdout (one more stops it:
// response-oversized) and discards stderr. The timeout or ctx stops it
// (timeout, process-failed). Returns stdout and the exit status (-1 for a
// death by signal).
//
// Stopping sends TERM to the whole group, then KILL after builtinGrace. When
// the leader exits, whatever is left of its group is killed as well: a
// built-in poll owns no process beyond its answer. The leader is observed
// with waitid(WNOWAIT) and reaped only after those signals, so its unreaped
// zombie pins the group number and no signal can reach a reused group.
func runGroup(ctx context.Context, argv, env []string, stdin []byte, limit int, timeout time.Duration) ([]byte, int, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, 0, errcode.Wrap(errcode.Internal, err, "pipe")
	}
	defer r.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir, cmd.Stdin, cmd.Stdout = env, "/", bytes.NewReader(stdin), w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return nil, 0, errcode.Wrap(errcode.ProcessFailed, err, "start %q", argv[0])
	}
	pgid := cmd.Process.Pid

	var out []byte
	over := make(chan struct{})
	read := make(chan struct{})
	go func() {
		defer close(read)
		out, _ = io.ReadAll(io.LimitReader(r, int64(limit)+1))
		if len(out) > limit {
			close(over)
		}
	}()
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		var info unix.Siginfo
		for unix.Waitid(unix.P_PID, pgid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
		}
	}()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var stopErr error
	select {
	case <-exited:
	case <-ctx.Done():
		stopErr = errcode.New(errcode.ProcessFailed, "%q was interrupted", argv[0])
	case <-timer.C:
		stopErr = errcode.New(errcode.Timeout, "%q did not answer within %s", argv[0], timeout)
	case <-over:
		stopErr = errcode.New(errcode.ResponseOversized, "%q wrote more than %d bytes", argv[0], limit)
	}
	if stopErr != nil {
		unix.Kill(-pgid, unix.SIGTERM)
		select {
		case <-exited:
		case <-time.After(builtinGrace):
		}
	}
	unix.Kill(-pgid, unix.SIGKILL)
	<-exited
	// Every member is killed; a member that escaped the group (setsid) may
	// still hold stdout, so the read gets a bounded wait.
	select {
	case <-read:
	case <-time.After(time.Second):
		r.Close()
		<-read
	}
	werr := cmd.Wait()
	reapGroup(pgid)
	if stopErr != nil {
		return nil, 0, stopErr
	}
	if len(out) > limit {
		return nil, 0, errcode.New(errcode.ResponseOversized, "%q wrote more than %d bytes", argv[0], limit)
	}
	if werr != nil && cmd.ProcessState == nil {
		return nil, 0, errcode.Wrap(errcode.ProcessFailed, werr, "wait for %q", argv[0])
	}
	return out, cmd.ProcessState.ExitCode(), nil
}

// reapGroup reaps the zombies of group pgid that are this process's own
// children: members orphaned by the leader re-parent here when fm is a child
// subreaper (see package launch), and nobody else would reap them. Only
// children in that exact group are waited for.
func reapGroup(pgid int) {
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-pgid, &ws, unix.WNOHANG, nil)
		switch {
		case err == unix.EINTR || pid > 0:
			continue
		case err != nil:
			return // ECHILD: no child of ours is left in the group
		}
		time.Sleep(10 * time.Millisecond)
	}
}
