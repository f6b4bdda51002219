package cli

import (
	"fmt"
	"slices"
	"strings"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/remote"
)

// `fm on` ([XFER-4]): one fm command in a secondmate home. The verb is raw:
// only --stdin (or --help) before the secondmate id belongs to it, and
// everything after the id is the other fm's command line, passed on as argv.
func init() {
	register("on", &Verb{
		Name:    "",
		Args:    "[--stdin] <secondmate-id> <fm-command> [<argument>...]",
		Summary: "run one fm command (extension, procevent, wake, doctor, help, version) in the secondmate home routed by data/secondmates.json: locally, or over ssh (FM_SSH_BIN, default ssh) when the route names a host; only the command's argv crosses, and with --stdin this command's bounded stdin",
		Raw:     true,
		Run: func(e *Env, args []string) error {
			if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
				fmt.Fprint(e.Stdout, groupUsage(groups["on"]))
				return nil
			}
			withStdin := len(args) > 0 && args[0] == "--stdin"
			if withStdin {
				args = args[1:]
			}
			if len(args) < 2 {
				return errcode.New(errcode.Usage, "expected a secondmate id and an fm command")
			}
			if g := args[1]; !slices.Contains(remote.Commands, g) {
				return errcode.New(errcode.Usage, "%q is not an fm command that runs in a secondmate home (%s)", g, strings.Join(remote.Commands, ", "))
			}
			h, err := e.Home()
			if err != nil {
				return err
			}
			r, err := remote.Lookup(h, args[0])
			if err != nil {
				return err
			}
			var stdin []byte
			if withStdin {
				if stdin, err = remote.ReadInput(e.Stdin); err != nil {
					return err
				}
			}
			return runOn(e, r, args[1:], stdin)
		},
	})
}

// `fm on-receive <job>`: the remote end of fm on over ssh ([XFER-4],
// [XFER-5]). It decodes the job (remote.DecodeJob) and replaces itself with
// this fm running the job's argv in the secondmate home, in an environment
// of only PATH, FM_HOME and HOME (remote.JobEnv). It is fm's plumbing, not
// an operator's command: hidden from the help and the completion.
func init() {
	addGroup(remote.ReceiveVerb, "the remote end of fm on (internal)")
	groups[remote.ReceiveVerb].hidden = true
	register(remote.ReceiveVerb, &Verb{
		Name:    "",
		Args:    "<job>",
		Summary: "run the job that fm on encoded, in the secondmate home it names (internal: fm on runs this over ssh)",
		Raw:     true,
		Stream:  true,
		Run: func(e *Env, args []string) error {
			if len(args) != 1 {
				return errcode.New(errcode.Usage, "expected one job written by fm on")
			}
			return remote.ExecJob(args[0])
		},
	})
}

// runOn runs one job in a secondmate home and passes on its stdout, stderr
// and exit status unchanged, so the secondmate's own error line is the one
// the caller sees.
func runOn(e *Env, r *remote.Route, args []string, stdin []byte) error {
	res, err := remote.Run(e.Ctx, r, args, stdin)
	if err != nil {
		return err
	}
	e.Stdout.Write(res.Stdout)
	e.Stderr.Write(res.Stderr)
	if res.Status != 0 {
		return &ExitError{Status: res.Status}
	}
	return nil
}
