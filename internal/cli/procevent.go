package cli

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/shown"
	"firstmate.dev/fm/pkg/adapter/wire"
	"firstmate.dev/fm/pkg/fmjson"
)

// Exit statuses of `fm extension process-event source.poll` ([OP-2]).
const (
	exitNoResult = 75 // EX_TEMPFAIL: no result
	exitEvidence = 70 // EX_SOFTWARE: the poll failed; evidence on stdout
)

// proceventRegister is `fm procevent register`.
func proceventRegister(e *Env, args []string) error {
	if len(args) < 3 {
		return errcode.New(errcode.Usage, "expected an adapter, a source id and, after --, the argv to run")
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	r, err := procevent.Register(h, args[0], args[1], args[2:])
	if err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "registered: %s (%s)\n", r.SourceID, r.Adapter)
	return nil
}

// registerExtensionFlags are the flags of register-extension.
type registerExtensionFlags struct{ configRef string }

func (f *registerExtensionFlags) declare(fs *flag.FlagSet) {
	fs.StringVar(&f.configRef, "config-ref", "", "the source's configuration reference, one line of 1..512 bytes (required)")
}

// proceventRegisterExtension is `fm procevent register-extension`.
func proceventRegisterExtension(e *Env, f *registerExtensionFlags, args []string) error {
	if err := need(args, 2, 2, "an adapter and a source id"); err != nil {
		return err
	}
	if f.configRef == "" {
		return errcode.New(errcode.Usage, "--config-ref is required")
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	r, err := procevent.RegisterExtension(e.Ctx, h, args[0], args[1], f.configRef)
	if err != nil {
		return err
	}
	printRegistered(e, h, r)
	return nil
}

// retireProgram is the program and verb the retire line of [REG-2] names,
// by absolute path so that the line works from any directory, and always a
// program that exists: the code root's wrapper bin/fm-procevent.sh where it
// is installed (an executable regular file), else the running fm with
// `procevent retire` (fm run from a directory that is not a bin/, or
// installed alone). Either is quoted for a POSIX shell where it needs it.
func retireProgram(h *home.Home) string {
	wrapper := filepath.Join(h.Root, "bin", "fm-procevent.sh")
	if fi, err := os.Stat(wrapper); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return shellWord(wrapper) + " retire"
	}
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil || !shown.Plain(exe) {
		return "fm procevent retire" // the running fm cannot be named on one line: by PATH
	}
	return shellWord(exe) + " procevent retire"
}

// retireFlags are the conditions of procevent retire.
type retireFlags struct {
	ifOwner, ifMatches string
	ifAbsent           bool
	// An empty --if-owner or --if-matches is a condition that no
	// registration meets, never the bare form: a script whose token
	// variable is empty must not retire what the bare form would.
	ownerSet, matchesSet bool
}

func (f *retireFlags) declare(fs *flag.FlagSet) {
	fs.Func("if-owner", "retire only the extension generation with this owner token (idempotent)", func(v string) error {
		f.ifOwner, f.ownerSet = v, true
		return nil
	})
	fs.Func("if-matches", "retire only a built-in registration of this adapter with exactly the argv after --", func(v string) error {
		f.ifMatches, f.matchesSet = v, true
		return nil
	})
	fs.BoolVar(&f.ifAbsent, "if-absent", false, "succeed only if nothing is registered")
}

// condition checks the flags against the positional arguments and returns
// the retirement's condition.
func (f *retireFlags) condition(args []string) (procevent.Condition, error) {
	var c procevent.Condition
	forms := 0
	switch {
	case f.ownerSet && f.ifOwner == "":
		return c, errcode.New(errcode.Usage, "--if-owner %q must be sha256:<64 lowercase hex>", f.ifOwner)
	case f.matchesSet && f.ifMatches == "":
		return c, errcode.New(errcode.Usage, "--if-matches needs an adapter name")
	}
	for _, set := range []bool{f.ownerSet, f.matchesSet, f.ifAbsent} {
		if set {
			forms++
		}
	}
	if forms > 1 {
		return c, errcode.New(errcode.Usage, "--if-owner, --if-matches and --if-absent exclude each other")
	}
	switch {
	case f.ifMatches != "":
		if len(args) < 2 {
			return c, errcode.New(errcode.Usage, "--if-matches needs the complete argv after --")
		}
		c.IfMatches = &procevent.Match{Adapter: f.ifMatches, Argv: args[1:]}
	case len(args) > 1:
		return c, errcode.New(errcode.Usage, "expected one source id")
	case f.ifOwner != "":
		c.IfOwner = f.ifOwner
	default:
		c.IfAbsent = f.ifAbsent
	}
	return c, nil
}

// proceventRetire is `fm procevent retire`.
func proceventRetire(e *Env, f *retireFlags, args []string) error {
	if len(args) < 1 {
		return errcode.New(errcode.Usage, "expected a source id")
	}
	c, err := f.condition(args)
	if err != nil {
		return err
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	if err := procevent.Retire(e.Ctx, h, args[0], c); err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "retired: %s\n", args[0])
	return nil
}

// proceventStart is `fm procevent start`.
func proceventStart(e *Env, args []string) error {
	h, err := e.homeFor(args, 1, 1, "one source id")
	if err != nil {
		return err
	}
	stop := e.elapsed("polling " + args[0])
	out, err := procevent.Start(e.Ctx, h, args[0])
	stop()
	if err != nil {
		return err
	}
	fmt.Fprintln(e.Stdout, out.Line())
	// [RUN-1] stdout stays the outcome; why a poll failed goes to stderr.
	if out.Evidence {
		fmt.Fprintf(e.Stderr, "failed: %s (%s): %s\n", out.SourceID, errcode.Of(out.Failure), oneLine(out.Failure.Error()))
	}
	for _, l := range out.CheckLines() {
		fmt.Fprintln(e.Stderr, l)
	}
	return nil
}

// proceventServe is `fm procevent serve`.
func proceventServe(e *Env, so *serveFlags, args []string) error {
	h, err := e.homeFor(args, 0, 0, "no arguments")
	if err != nil {
		return err
	}
	o := so.o
	o.Log = func(line string) { fmt.Fprintln(e.Stdout, line) }
	// [STAT-5] serve's own lines on stderr begin with the time.
	o.Warn = func(line string) { fmt.Fprintln(e.Stderr, stampNow()+" "+line) }
	o.Notice = o.Warn
	// This process starts children only through package launch.
	o.ReapOrphans = true
	// A supervisor lives for months holding a thousand idle polls:
	// keep its heap nearer to what is live, for a little more
	// collection work (docs/performance.md, "serve at scale").
	debug.SetGCPercent(50)
	return procevent.Serve(e.Ctx, h, o)
}

// proceventReconcile is `fm procevent reconcile`.
func proceventReconcile(e *Env, ro *reconcileFlags, args []string) error {
	h, err := e.homeFor(args, 0, 0, "no arguments")
	if err != nil {
		return err
	}
	rep, err := procevent.Reconcile(e.Ctx, h, ro.o)
	if err != nil {
		return err
	}
	// A poll whose failure was captured as evidence, or counted in its
	// run [OP-5], failed as much as one that captured nothing.
	polled := 0
	for _, out := range rep.Outcomes {
		fmt.Fprintln(e.Stdout, out.Line())
		if out.Evidence || out.Status == procevent.Collapsed {
			fmt.Fprintf(e.Stdout, "failed: %s (%s): %s\n", out.SourceID, errcode.Of(out.Failure), oneLine(out.Failure.Error()))
			polled++
		}
	}
	failed := slices.Sorted(maps.Keys(rep.Failures))
	for _, id := range failed {
		err := rep.Failures[id]
		fmt.Fprintf(e.Stdout, "failed: %s (%s): %s\n", id, errcode.Of(err), oneLine(err.Error()))
	}
	fmt.Fprintf(e.Stdout, "reconciled: sources=%d failed=%d cleaned-invocations=%d reannounced=%d\n", len(rep.Outcomes)+len(failed), len(failed)+polled, rep.Cleaned, rep.Reannounced)
	return nil
}

// handledFlags are the flags of handled.
type handledFlags struct{ all bool }

func (f *handledFlags) declare(fs *flag.FlagSet) {
	fs.BoolVar(&f.all, "all", false, "mark every unhandled result of the source handled (instead of one <seq>)")
}

// proceventHandled is `fm procevent handled` ([CAP-3], [UPG-3]).
func proceventHandled(e *Env, f *handledFlags, args []string) error {
	if f.all {
		h, err := e.homeFor(args, 1, 1, "a source id (with --all, no sequence number)")
		if err != nil {
			return err
		}
		seqs, err := procevent.HandleAll(h, args[0])
		for _, seq := range seqs {
			fmt.Fprintf(e.Stdout, "handled: %s %d\n", args[0], seq)
		}
		if err == nil {
			fmt.Fprintf(e.Stdout, "handled-all: %s %d\n", args[0], len(seqs))
		}
		return err
	}
	if err := need(args, 2, 2, "a source id and a sequence number (or --all)"); err != nil {
		return err
	}
	seq, err := strconv.ParseInt(args[1], 10, 64)
	if err != nil || seq < 1 {
		return errcode.New(errcode.Usage, "sequence %q must be a positive decimal integer", args[1])
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	already, err := procevent.MarkHandled(h, args[0], seq)
	if err != nil {
		return err
	}
	word := "handled"
	if already {
		word = "already-handled"
	}
	fmt.Fprintf(e.Stdout, "%s: %s %d\n", word, args[0], seq)
	return nil
}

// proceventClassify is `fm procevent classify`.
func proceventClassify(e *Env, args []string) error {
	h, err := e.homeFor(args, 1, 1, "one result file")
	if err != nil {
		return err
	}
	c, err := procevent.Classify(e.Ctx, h, args[0])
	if err != nil {
		return err
	}
	fmt.Fprintln(e.Stdout, c)
	return nil
}

// proceventList is `fm procevent list`.
func proceventList(e *Env, f *jsonFlag, args []string) error {
	h, err := e.homeFor(args, 0, 0, "no arguments")
	if err != nil {
		return err
	}
	regs, err := procevent.Sources(h)
	if err != nil {
		return err
	}
	results, err := procevent.Inbox(h)
	if err != nil {
		return err
	}
	pending := map[string]int64{}
	for _, r := range results {
		if !r.Handled {
			pending[r.SourceID]++
		}
	}
	rows := []fmjson.Source{}
	for _, r := range regs {
		rows = append(rows, fmjson.Source{SourceID: r.SourceID, Adapter: r.Adapter, Kind: r.Kind, Owner: r.Owner(), Pending: pending[r.SourceID]})
	}
	if f.json {
		return writeJSON(e, fmjson.Sources{Sources: rows})
	}
	if len(rows) == 0 {
		fmt.Fprintln(e.Stdout, "no process-event sources")
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tADAPTER\tOWNER\tPENDING")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", r.SourceID, r.Adapter, r.Owner, r.Pending)
	}
	return tw.Flush()
}

// proceventInbox is `fm procevent inbox`.
func proceventInbox(e *Env, f *jsonFlag, args []string) error {
	h, err := e.homeFor(args, 0, 0, "no arguments")
	if err != nil {
		return err
	}
	results, err := procevent.Inbox(h)
	if err != nil {
		return err
	}
	if f.json {
		return writeJSON(e, inboxDocument(results))
	}
	if len(results) == 0 {
		fmt.Fprintln(e.Stdout, "no captured results")
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 0, 2, ' ', 0)
	// CONTENT is --json's evidence (false: result, true: evidence); --json's
	// kind is the owner's kind, which OWNER shows.
	fmt.Fprintln(tw, "SOURCE\tSEQ\tADAPTER\tOWNER\tCONTENT\tSTATE\tRESULT")
	for _, r := range results {
		content, state := "result", "unhandled"
		if r.Evidence {
			content = "evidence"
		}
		if r.Handled {
			state = "handled"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.SourceID, r.Sequence, r.Adapter, r.Owner(), content, state, r.Path)
	}
	return tw.Flush()
}

// sweepFlags are the flags of sweep-home.
type sweepFlags struct{ preflight bool }

func (f *sweepFlags) declare(fs *flag.FlagSet) {
	fs.BoolVar(&f.preflight, "preflight", false, "only check; change nothing (prints how many registrations a sweep would attempt)")
}

// proceventSweepHome is `fm procevent sweep-home`.
func proceventSweepHome(e *Env, f *sweepFlags, args []string) error {
	h, err := e.homeFor(args, 0, 0, "no arguments")
	if err != nil {
		return err
	}
	n, err := procevent.Sweep(e.Ctx, h, f.preflight)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "swept: attempted=%d\n", n)
	return nil
}

// directFlags are the flags of a direct call, extension process-event.
type directFlags struct {
	sourceID, configRef, resultFile, requestID string
	uncaptured, showStderr                     bool
	confinement                                string
}

func (f *directFlags) declare(fs *flag.FlagSet) {
	fs.StringVar(&f.sourceID, "source-id", "", "the source id (source.poll: required)")
	fs.StringVar(&f.configRef, "config-ref", "", "the configuration reference (source.poll: required)")
	fs.StringVar(&f.resultFile, "result-file", "", "a captured result directly inside the inbox (result.*: required)")
	fs.StringVar(&f.requestID, "request-id", "", "the request id, sha256:<64 hex> (default: random)")
	fs.BoolVar(&f.uncaptured, "uncaptured", false, "source.poll: poll a source id registered in this home anyway; its event is consumed and NOT captured")
	fs.BoolVar(&f.showStderr, "show-stderr", false, "print the package's stderr (at most 8192 bytes per invocation, escaped), and the diagnostic of an ok=false answer, on stderr; neither is stored")
	fs.StringVar(&f.confinement, "confinement", "", "enforce, strict or off: this call's confinement instead of the home's (off: check whether confinement is what makes a package fail)")
}

// extensionProcessEvent is `fm extension process-event` ([OP-2]).
func extensionProcessEvent(e *Env, pe *directFlags, args []string) error {
	if err := need(args, 2, 2, "an adapter and an operation"); err != nil {
		return err
	}
	adapter, op := args[0], args[1]
	if !slices.Contains(wire.Operations, op) {
		return errcode.New(errcode.Usage, "unknown operation %q (one of source.poll, result.classify, result.terminal, result.silent)", op)
	}
	if pe.requestID != "" {
		if err := protocol.CheckRequestID(pe.requestID); err != nil {
			return err
		}
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	o := procevent.Direct{RequestID: pe.requestID, Uncaptured: pe.uncaptured, Notice: func(s string) {
		fmt.Fprintf(e.Stderr, "warning[confinement]: %s\n", s)
	}}
	if pe.confinement != "" {
		if o.Confinement, err = confine.ParseMode(pe.confinement); err != nil {
			return err
		}
	}
	if pe.showStderr {
		o.Stderr, o.Diagnostic = showStderr(e.Stderr), showDiagnostic(e.Stderr)
	}
	if op == wire.OpPoll {
		return directPoll(e, adapter, pe.sourceID, pe.configRef, pe.resultFile, o)
	}
	if pe.resultFile == "" || pe.configRef != "" || pe.uncaptured {
		return errcode.New(errcode.Usage, "%s takes --result-file (and no --config-ref or --uncaptured)", op)
	}
	res, err := procevent.Ask(e.Ctx, h, adapter, op, pe.resultFile, pe.sourceID, o)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.Stdout, res)
	return nil
}

// directPoll is `fm extension process-event <adapter> source.poll` ([OP-2]):
// the output on stdout and exit 0; no result: nothing, exit 75; failure: the
// evidence document ([OP-3]), exit 70. A registered source id is refused
// (error[source-registered], exit 1) without --uncaptured; with it the poll
// holds the source's claim, and refuses (error[source-active], exit 1) while
// a runner polls it [RUN-4].
func directPoll(e *Env, adapter, sourceID, configRef, resultFile string, o procevent.Direct) error {
	if resultFile != "" {
		return errcode.New(errcode.Usage, "source.poll takes no --result-file")
	}
	if sourceID == "" || configRef == "" {
		return errcode.New(errcode.Usage, "source.poll needs --source-id and --config-ref")
	}
	if err := protocol.CheckSourceID(sourceID); err != nil {
		return err
	}
	if err := protocol.CheckConfigRef(configRef); err != nil {
		return err
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	out, evidence, err := procevent.Poll(e.Ctx, h, adapter, wire.PollInput{SourceID: sourceID, ConfigRef: configRef}, o)
	switch {
	case err != nil:
		return err // refused before anything ran (a registered source, or its runner is polling it)
	case evidence != nil:
		e.Stdout.Write(evidence)
		return &ExitError{Status: exitEvidence}
	case out == nil:
		return &ExitError{Status: exitNoResult}
	}
	_, err = e.Stdout.Write(out)
	return err
}

// serveFlags are the tuning flags of serve and reconcile; each declaration
// starts from the defaults.
type serveFlags struct{ o procevent.ServeOptions }

func (f *serveFlags) declare(fs *flag.FlagSet) {
	f.declareReannounce(fs)
	fs.DurationVar(&f.o.MinGap, "min-gap", f.o.MinGap, "minimum time between two polls of one source")
	fs.DurationVar(&f.o.MaxBackoff, "max-backoff", f.o.MaxBackoff, "ceiling of the backoff after failures")
	fs.DurationVar(&f.o.Rescan, "rescan", f.o.Rescan, "how often the registry is re-read for new and retired sources")
}

func (f *serveFlags) declareReannounce(fs *flag.FlagSet) {
	f.o = procevent.DefaultServeOptions()
	fs.DurationVar(&f.o.Reannounce, "reannounce-after", f.o.Reannounce, "re-announce an unhandled result once its capture and its latest wake are older than this (0: every cycle)")
}

// reconcileFlags are the one tuning flag of reconcile, serve's
// --reannounce-after.
type reconcileFlags struct{ serveFlags }

func (f *reconcileFlags) declare(fs *flag.FlagSet) { f.declareReannounce(fs) }

// shellWord quotes s for a POSIX shell when it holds anything but letters,
// digits and /._+-@%:,= (a code root with a space, say), so a printed
// command can be pasted as it is.
func shellWord(s string) string {
	safe := s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("/._+-@%:,=", r))
	}) < 0
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// inboxDocument is the --json form of procevent inbox.
func inboxDocument(results []procevent.Result) fmjson.Inbox {
	doc := fmjson.Inbox{Results: make([]fmjson.Result, 0, len(results))}
	for _, r := range results {
		doc.Results = append(doc.Results, fmjson.Result{Meta: fmjson.Meta(r.Meta), Path: r.Path, Handled: r.Handled})
	}
	return doc
}
