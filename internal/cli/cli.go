// Package cli is fm's command line: the table of verbs (verbs.go), one named
// function per verb, flag state made afresh for every run, output formatting
// and exit codes. It holds no domain logic; every verb calls into the
// packages that own the behaviour. No function here is longer than 80 lines
// (funclen_test.go).
//
// Conventions (CONTRACT §0):
//   - `fm help`, `fm <group> --help` and `fm <group> <verb> --help` print
//     usage to stdout and exit 0; a bad call prints `error[usage]: …` and the
//     usage to stderr and exits 2.
//   - any other failure prints exactly one line `error[<code>]: <message>` to
//     stderr and exits 1, with nothing on stdout: verbs write into a buffer
//     that is flushed only on success (streaming verbs opt out). The one
//     report verb, `fm doctor`, prints its whole report and exits 1 when a
//     check failed (doctor.go).
//   - listings are aligned tables, and take --json for one JSON document;
//     what only a person at a terminal needs (a table instead of the wake
//     queue's lines, progress on stderr) is shown only when that stream is a
//     terminal (terminal.go).
package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/shown"
)

// Version is fm's version, printed by `fm version`.
var Version = "0.1.0"

// Env is what a verb gets: its streams, a context cancelled on SIGTERM,
// SIGINT or SIGHUP (and, for a streaming verb, when its stdout is closed:
// signals.go), and the lazily resolved home.
type Env struct {
	Ctx    context.Context
	cancel context.CancelCauseFunc
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	home   *home.Home
	// ttyOut and ttyErr record whether the stdout and stderr fm was given
	// are terminals (Stdout itself is a buffer while a verb runs).
	ttyOut, ttyErr bool
}

// Home resolves the effective home once.
func (e *Env) Home() (*home.Home, error) {
	if e.home == nil {
		h, err := home.Resolve()
		if err != nil {
			return nil, err
		}
		e.home = h
	}
	return e.home, nil
}

// homeFor checks the number of positional arguments, then resolves the home:
// the opening of most verbs.
func (e *Env) homeFor(args []string, min, max int, what string) (*home.Home, error) {
	if err := need(args, min, max, what); err != nil {
		return nil, err
	}
	return e.Home()
}

// Verb is one command of a group. The verbs are registered in one table,
// commands (verbs.go); each is one named function in the file of its group.
type Verb struct {
	Name    string
	Args    string // the synopsis after "fm <group> <verb>"
	Summary string
	// Stream verbs write straight to stdout (watchers, followers).
	Stream bool
	// Setup declares the verb's flags on fs, a flag set made for this one
	// run, and returns the function that runs the verb with those flags'
	// values and the positional arguments (flags may be interspersed with
	// them; `--` ends flag parsing and everything after it is positional).
	// Flag state lives only in what Setup makes (plain, flagged), never in
	// a package variable, so every run starts from the defaults and
	// cli.Main can run any number of times in one process.
	Setup func(fs *flag.FlagSet) runFunc
	// Raw verbs get their arguments exactly as given: no flag parsing and
	// no --help scan. `fm on` is one, because everything after its
	// secondmate id is another fm's command line.
	Raw bool
}

// runFunc runs a verb with its positional arguments.
type runFunc func(e *Env, args []string) error

// plain is the Setup of a verb without flags.
func plain(run runFunc) func(*flag.FlagSet) runFunc {
	return func(*flag.FlagSet) runFunc { return run }
}

// flagged is the Setup of a verb whose flags are the fields of an F: every
// run declares them on a new F, which run then reads.
func flagged[F any, P interface {
	*F
	declare(fs *flag.FlagSet)
}](run func(e *Env, f P, args []string) error) func(*flag.FlagSet) runFunc {
	return func(fs *flag.FlagSet) runFunc {
		f := P(new(F))
		f.declare(fs)
		return func(e *Env, args []string) error { return run(e, f, args) }
	}
}

// jsonFlag is the --json of a listing or a report.
type jsonFlag struct{ json bool }

func (f *jsonFlag) declare(fs *flag.FlagSet) {
	fs.BoolVar(&f.json, "json", false, "print one JSON document")
}

// ExitError ends a verb with a specific exit status and no error line
// (for example 75 for a poll with no result).
type ExitError struct{ Status int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Status) }

type group struct {
	name, summary string
	verbs         []*Verb
	// hidden groups are fm's own plumbing (the remote end of fm on): left
	// out of the help and the completion.
	hidden bool
}

// findGroup returns the group called name, or nil.
func findGroup(groups []*group, name string) *group {
	for _, g := range groups {
		if g.name == name {
			return g
		}
	}
	return nil
}

// verb returns the group's verb called name ("": the group's only verb), or
// nil.
func (g *group) verb(name string) *Verb {
	for _, v := range g.verbs {
		if v.Name == name {
			return v
		}
	}
	return nil
}

// Main runs fm with args (without the program name) and returns the exit
// status. The process's signal dispositions are as before when it returns.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return run(args, stdin, stdout, stderr, true)
}

// run is Main; with restore false it leaves the stop signals caught when
// it returns (Run: the process exits right after, so giving them back
// would only delay its exit, ~0.2 ms).
func run(args []string, stdin io.Reader, stdout, stderr io.Writer, restore bool) int {
	ctx, cancel, caught, stop := signalContext(restore)
	defer stop()
	e := &Env{Ctx: ctx, cancel: cancel, Stdin: stdin, Stdout: afterSignals(stdout, caught), Stderr: afterSignals(stderr, caught), ttyOut: isTerminal(stdout), ttyErr: isTerminal(stderr)}
	stdout, stderr = e.Stdout, e.Stderr
	groups := commands()
	if len(args) == 0 {
		return usageErr(stderr, errors.New("missing command"), mainUsage(groups))
	}
	switch args[0] {
	case "help", "--help", "-h":
		fmt.Fprint(stdout, mainUsage(groups))
		return 0
	case "version", "--version":
		fmt.Fprintf(stdout, "fm %s\n", Version)
		return 0
	}
	g := findGroup(groups, args[0])
	if g == nil {
		return usageErr(stderr, fmt.Errorf("unknown command %q", args[0]), mainUsage(groups))
	}
	if v := g.verb(""); v != nil {
		return runVerb(e, g, v, args[1:])
	}
	if len(args) < 2 {
		return usageErr(stderr, fmt.Errorf("missing %s verb", g.name), groupUsage(g))
	}
	if args[1] == "--help" || args[1] == "-h" || args[1] == "help" {
		fmt.Fprint(stdout, groupUsage(g))
		return 0
	}
	v := g.verb(args[1])
	if v == nil {
		return usageErr(stderr, fmt.Errorf("unknown %s verb %q", g.name, args[1]), groupUsage(g))
	}
	return runVerb(e, g, v, args[2:])
}

func runVerb(e *Env, g *group, v *Verb, args []string) int {
	fs := flag.NewFlagSet(v.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	run := v.Setup(fs)
	for _, a := range args {
		if a == "--" || v.Raw {
			break
		}
		if a == "--help" || a == "-h" {
			fmt.Fprint(e.Stdout, verbUsage(g, v, fs))
			return 0
		}
	}
	pos, err := args, error(nil)
	if !v.Raw {
		pos, err = parseInterspersed(fs, args)
	}
	if err != nil {
		return usageErr(e.Stderr, err, verbUsage(g, v, fs))
	}
	out := e.Stdout
	var buf bytes.Buffer
	if !v.Stream {
		e.Stdout = &buf
	} else if e.cancel != nil {
		e.Stdout = &stdoutGuard{w: out, cancel: e.cancel}
		defer watchReader(out, e.cancel)()
	}
	err = run(e, pos)
	e.Stdout = out
	if errors.Is(context.Cause(e.Ctx), errStdoutClosed) {
		return 0 // the reader went away; the verb stopped as on TERM
	}
	var exit *ExitError
	switch {
	case err == nil:
		out.Write(buf.Bytes())
		return 0
	case errors.As(err, &exit):
		out.Write(buf.Bytes())
		return exit.Status
	case errcode.Of(err) == errcode.Usage:
		return usageErr(e.Stderr, err, verbUsage(g, v, fs))
	}
	fmt.Fprintf(e.Stderr, "error[%s]: %s\n", errcode.Of(err), oneLine(err.Error()))
	return 1
}

// parseInterspersed parses flags anywhere among the positional arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, errcode.New(errcode.Usage, "%v", err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag.Parse stops at "--" (consumed) or at the first positional.
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// oneLine makes an error's text one plain line (shown.Flatten): no line
// break, carriage return, escape sequence or formatting character of any
// text an error quotes can end, rewrite or forge the error line.
func oneLine(s string) string { return shown.Flatten(s) }

func usageErr(w io.Writer, err error, usage string) int {
	fmt.Fprintf(w, "error[usage]: %s\n", oneLine(err.Error()))
	fmt.Fprint(w, usage)
	return 2
}

func mainUsage(groups []*group) string {
	var b strings.Builder
	b.WriteString("usage: fm <command> [<verb>] [arguments]\n\ncommands:\n")
	for _, g := range visible(groups) {
		fmt.Fprintf(&b, "  %-10s %s\n", g.name, g.summary)
	}
	b.WriteString("  help       print this help\n  version    print fm's version\n\nRun 'fm <command> --help' for the verbs of a command.\n")
	return b.String()
}

func groupUsage(g *group) string {
	var b strings.Builder
	if v := g.verb(""); v != nil {
		fmt.Fprintf(&b, "usage: fm %s %s\n\n%s\n", g.name, v.Args, v.Summary)
		return b.String()
	}
	fmt.Fprintf(&b, "usage: fm %s <verb> [arguments]\n\n%s\n\nverbs:\n", g.name, g.summary)
	for _, v := range sortedVerbs(g) {
		fmt.Fprintf(&b, "  %-22s %s\n", v.Name, v.Summary)
	}
	fmt.Fprintf(&b, "\nRun 'fm %s <verb> --help' for a verb's arguments.\n", g.name)
	return b.String()
}

func verbUsage(g *group, v *Verb, fs *flag.FlagSet) string {
	var b strings.Builder
	name := g.name
	if v.Name != "" {
		name += " " + v.Name
	}
	fmt.Fprintf(&b, "usage: fm %s %s\n\n%s\n", name, v.Args, v.Summary)
	first := true
	fs.VisitAll(func(f *flag.Flag) {
		if first {
			b.WriteString("\nflags:\n")
			first = false
		}
		fmt.Fprintf(&b, "  --%s\t%s\n", f.Name, f.Usage)
	})
	return b.String()
}

// need checks the number of positional arguments.
func need(args []string, min, max int, what string) error {
	if len(args) < min || (max >= 0 && len(args) > max) {
		return errcode.New(errcode.Usage, "expected %s", what)
	}
	return nil
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// Run is the entry point of cmd/fm.
func Run() int { return run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, false) }
