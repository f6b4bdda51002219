package cli

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/remote"
)

// on is `fm on` ([XFER-4]): one fm command in a secondmate home. The verb
// is raw: only --stdin, --timeout <d> (or --help) before the secondmate id
// belong to it, and everything after the id is the other fm's command line,
// passed on as argv.
func on(e *Env, args []string) error {
	if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
		fmt.Fprint(e.Stdout, groupUsage(findGroup(commands(), "on")))
		return nil
	}
	var withStdin bool
	var timeout *time.Duration
opts:
	for len(args) > 0 {
		switch a := args[0]; {
		case a == "--stdin" && !withStdin:
			withStdin, args = true, args[1:]
		case (a == "--timeout" || strings.HasPrefix(a, "--timeout=")) && timeout == nil:
			v, inline := strings.CutPrefix(a, "--timeout=")
			if !inline {
				if len(args) < 2 {
					return errcode.New(errcode.Usage, "--timeout needs a value")
				}
				v, args = args[1], args[1:]
			}
			d, err := remote.ParseTimeout(v)
			if err != nil {
				return err
			}
			timeout, args = &d, args[1:]
		case strings.HasPrefix(a, "-"): // no secondmate id starts with '-'
			return errcode.New(errcode.Usage, "%q is not an option of fm on (--stdin, --timeout <duration>), each at most once", a)
		default:
			break opts
		}
	}
	if len(args) < 2 {
		return errcode.New(errcode.Usage, "expected a secondmate id and an fm command")
	}
	if g := args[1]; !slices.Contains(remote.Commands, g) {
		return errcode.New(errcode.Usage, "%q is not an fm command that runs in a secondmate home (%s)", g, strings.Join(remote.Commands, ", "))
	}
	_, r, err := e.route(args[0])
	if err != nil {
		return err
	}
	var stdin []byte
	if withStdin {
		if stdin, err = remote.ReadInput(e.Stdin); err != nil {
			return err
		}
	}
	return runOn(e, r, args[1:], stdin, jobTimeout(timeout), nil)
}

// route resolves the home and the route of secondmate id in it.
func (e *Env) route(id string) (*home.Home, *remote.Route, error) {
	h, err := e.Home()
	if err != nil {
		return nil, nil, err
	}
	r, err := remote.Lookup(h, id)
	return h, r, err
}

// jobTimeout is the caller's --timeout when given, else remote.DefaultTimeout.
func jobTimeout(flag *time.Duration) time.Duration {
	if flag != nil {
		return *flag
	}
	return remote.DefaultTimeout
}

// onReceive is `fm on-receive <job>`: the remote end of fm on over ssh
// ([XFER-4], [XFER-5]). It decodes the job (remote.DecodeJob) and replaces
// itself with this fm running the job's argv in the secondmate home, in an
// environment of only PATH, FM_HOME and HOME (remote.JobEnv). It is fm's
// plumbing, not an operator's command: its group is hidden from the help and
// the completion.
func onReceive(e *Env, args []string) error {
	if len(args) != 1 {
		return errcode.New(errcode.Usage, "expected one job written by fm on")
	}
	return remote.ExecJob(args[0])
}

// runOn runs one job in a secondmate home within timeout and, when its
// answer has the form of an fm answer (remote.CheckAnswer) and check (if
// any) accepts its stdout, passes on its stdout, stderr and exit status
// unchanged, so the secondmate's own error line is the one the caller sees.
func runOn(e *Env, r *remote.Route, args []string, stdin []byte, timeout time.Duration, check func(stdout []byte) error) error {
	res, err := remote.Run(e.Ctx, r, args, stdin, timeout)
	if err != nil {
		return err
	}
	if err := remote.CheckAnswer(r, args, res); err != nil {
		return err
	}
	if check != nil && res.Status == 0 {
		if err := check(res.Stdout); err != nil {
			return err
		}
	}
	e.Stdout.Write(res.Stdout)
	e.Stderr.Write(res.Stderr)
	if res.Status != 0 {
		return &ExitError{Status: res.Status}
	}
	return nil
}
