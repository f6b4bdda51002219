package procevent

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// The built-in ("legacy") adapter interface, documented in docs/procevent.md.
//
// Poll: the registration's argv is executed directly (no shell; a bare
// program name is looked up in the runner's PATH) with the runner's
// environment, working directory "/", stdin empty and stderr discarded, in a
// process group of its own. Exit 0 with non-empty stdout is a result (stdout
// is the result, at most wire.MaxOutputBytes bytes); exit 0 with empty
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
//
// Supervision [RUN-4], [REG-4], [GRP-1]..[GRP-3]: every built-in process
// (polls and verdicts) runs under exactly the supervision of an extension
// invocation (package launch): the launch barrier starts it in a new process
// group, and its owner record <state>/extension-invocations/<hex>.owner.json
// is published before the command runs, with extension_id and binding_digest
// both "builtin:<adapter>" (BuiltinOwner; a built-in has no binding), the
// source id and the operation. When the command exits, is stopped, times out
// or overflows, the group is stopped and proved gone; anything left in it
// after the command answered is stopped too, and the answer stands (a
// built-in owns no process beyond its answer). If the runner dies, the record
// stays, and the next start, reconcile, serve, retirement or
// `fm extension cleanup-invocations` proves that exact group gone (stopping
// it) before the source polls again, exactly as for an extension's poll.

const (
	builtinPollTimeout    = 300 * time.Second
	builtinVerdictTimeout = 30 * time.Second
	// builtinNoResult is the exit status of a poll with no result
	// (EX_TEMPFAIL), the same as `fm extension process-event`'s.
	builtinNoResult  = 75
	maxVerdictOutput = 4096
)

// builtinEnv is the whole environment of an adapter script's verdicts.
var builtinEnv = []string{"PATH=" + host.SystemPath, "LANG=C", "LC_ALL=C"}

// BuiltinOwner is the extension_id and binding_digest of the owner record of
// a built-in adapter's process: "builtin:<adapter>". It never equals a
// binding digest (sha256:<hex>), so no binding is ever pinned by it.
func BuiltinOwner(adapter string) string { return "builtin:" + adapter }

// builtinRun is one supervised run of a built-in adapter's process.
type builtinRun struct {
	adapter, sourceID, op string
	argv                  []string // argv[0] is absolute or a bare name
	env                   []string
	stdin                 []byte
	limit                 int
	timeout               time.Duration
	answers               []int // non-zero exit statuses that are an answer
}

// run runs b through the launch supervision and returns its stdout and exit
// status.
func (b builtinRun) run(ctx context.Context, h *home.Home) ([]byte, int, error) {
	path := b.argv[0]
	if !filepath.IsAbs(path) {
		// A bare name, looked up in the runner's PATH; a lookup that only
		// finds it relative to the working directory is refused.
		found, err := exec.LookPath(path)
		if err != nil || !filepath.IsAbs(found) {
			return nil, 0, errcode.New(errcode.ProcessFailed, "built-in %s program %q is not an executable found in PATH", b.adapter, path)
		}
		path = found
	}
	if err := home.EnsurePrivate(h.Invocations(), true); err != nil {
		return nil, 0, err
	}
	owner := BuiltinOwner(b.adapter)
	// A slot of ctx's launch gate (serve's, reconcile's) until the program
	// has been executed, as for an extension's call (host.Invoke).
	leave, err := launch.Enter(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer leave()
	res, err := launch.Run(ctx, launch.Spec{
		Running:        leave,
		Path:           path,
		Verb:           filepath.Base(path), // names it in messages only
		Argv:           b.argv,
		Dir:            "/",
		Env:            b.env,
		Stdin:          b.stdin,
		StdoutLimit:    b.limit,
		StderrLimit:    math.MaxInt, // discarded, never bounded (only counted)
		Timeout:        b.timeout,
		Records:        h.Invocations(),
		AnswerStatuses: b.answers,
		StopLeftovers:  true,
		Owner: launch.Owner{
			ExtensionID:   owner,
			BindingDigest: owner,
			RequestID:     protocol.NewRequestID(),
			SourceID:      b.sourceID,
			Operation:     b.op,
		},
	})
	if err != nil {
		return nil, 0, err
	}
	return res.Stdout, res.ExitStatus, nil
}

// pollBuiltin runs one built-in poll of r; nil content with a nil error is
// no result.
func pollBuiltin(ctx context.Context, h *home.Home, r *Registration) ([]byte, error) {
	out, status, err := builtinRun{
		adapter: r.Adapter, sourceID: r.SourceID, op: wire.OpPoll,
		argv: r.Argv, env: os.Environ(),
		limit: wire.MaxOutputBytes, timeout: builtinPollTimeout,
		answers: []int{builtinNoResult},
	}.run(ctx, h)
	switch {
	case err != nil:
		return nil, err
	case status == builtinNoResult || len(out) == 0:
		return nil, nil
	}
	return out, nil
}

// askBuiltin asks the adapter script of a built-in result one of the result
// operations and returns the answer as the result object of the extension
// protocol, which the operation's decoder then judges like an extension's.
func askBuiltin(ctx context.Context, h *home.Home, m *Meta, op string, content []byte) ([]byte, error) {
	verb := strings.TrimPrefix(op, "result.")
	script := host.BuiltinScript(h, m.Adapter)
	out, _, err := builtinRun{
		adapter: m.Adapter, sourceID: m.SourceID, op: op,
		argv:  []string{script, verb, m.SourceID, strconv.FormatInt(m.Sequence, 10)},
		env:   builtinEnv,
		stdin: content, limit: maxVerdictOutput, timeout: builtinVerdictTimeout,
	}.run(ctx, h)
	if err != nil {
		return nil, err
	}
	answer := strings.TrimSuffix(string(out), "\n")
	if op == wire.OpClassify {
		// The extension rule for a classification applies unchanged.
		return strictjson.Canonical(wire.ClassifyResult{Classification: answer})
	}
	if answer != "true" && answer != "false" {
		return nil, errcode.New(errcode.ResponseInvalid, "built-in adapter %q %s must answer true or false", script, verb)
	}
	return strictjson.Canonical(wire.BoolResult{Value: answer == "true"})
}
