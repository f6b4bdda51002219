package host

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/pkgtree"
)

// maxShebang bounds the bytes of an entrypoint's first line that a message
// shows.
const maxShebang = 128

// explain adds to the failure of a run of rec's entrypoint what the host
// knows and its author needs, without any of the package's output
// ([HINT-1] to [HINT-4]):
//
//   - a timeout at the run's own bound: when what the package had written
//     to stdout by then is one complete JSON document, that it answered
//     but did not exit (an open watcher or timer keeps it running);
//     otherwise the bound and the setting that raises it (--timeout-ms of
//     the binding for an invoke, --handshake-timeout-ms for a handshake);
//   - exit status 127 or 126 (the barrier's execve failed, or a shell found
//     no program or could not run it): the entrypoint's first line, read
//     from the verified store copy (at most maxShebang bytes, quoted as
//     printable ASCII), what is wrong with it when the host can tell (a
//     carriage return: CRLF line ends; no "#!"), and the fixed PATH, the
//     only one an entrypoint gets [INV-3];
//   - any other non-zero exit: how to see the package's stderr, which the
//     host never stores or shows unasked. Nothing is guessed about why: the
//     host cannot tell a syntax error from a refused write.
//
// In both exit cases a script entrypoint that finds its files through $0
// (dollarZero) is told that $0 is /dev/fd/<n> under fm [INV-2]. Other
// failures are returned as they are.
func explain(rec *binding.Record, verb string, err error) error {
	var t launch.TimedOut
	if errors.As(err, &t) {
		return &errcode.Error{Code: errcode.Of(err), Msg: timedOut(rec, verb, t), Err: err}
	}
	var st launch.ExitStatus
	if !errors.As(err, &st) {
		return err
	}
	hint := "; " + stderrHint
	if st == 126 || st == 127 {
		hint = "; " + notRunnable(rec, int(st))
	}
	if dollarZero(rec) {
		hint += "; " + dollarZeroHint
	}
	return &errcode.Error{Code: errcode.Of(err), Msg: err.Error() + hint, Err: err}
}

// stderrHint ends the message of an entrypoint that exited non-zero.
const stderrHint = "its stderr is never stored: --show-stderr of fm extension bind, upgrade or process-event shows it"

// dollarZeroHint is what a script that finds its files through $0 is told.
const dollarZeroHint = "the entrypoint script finds files through $0 (dirname \"$0\" or alike), but under fm $0 is /dev/fd/<n>: find the package's files from the working directory, the package root (docs/protocol.md §2, \"How your entrypoint is run\")"

// timedOut words a timeout at t's bound for verb.
func timedOut(rec *binding.Record, verb string, t launch.TimedOut) string {
	ms := t.After.Milliseconds()
	if out := bytes.TrimSpace(t.Stdout); len(out) > 0 && json.Valid(out) {
		return fmt.Sprintf("%s: answered but did not exit within %d ms: its response (%d bytes) was complete, but the entrypoint kept running (an open watcher, timer, server or child process keeps it alive); an entrypoint must exit once its response is written", t.What, ms, len(out))
	}
	switch verb {
	case "handshake":
		return fmt.Sprintf("%s; the handshake bound is %d ms: set it with --handshake-timeout-ms of fm extension bind or upgrade", t.Error(), ms)
	case "invoke":
		return fmt.Sprintf("%s; the binding's timeout_ms is %d: for a slower operation run fm extension upgrade %s <package-dir> --trust-same-user-code --timeout-ms <n>", t.Error(), ms, rec.ExtensionID)
	}
	return t.Error()
}

// dollarZeroPattern matches the shell idioms that find a script's own
// directory through $0: dirname, readlink or realpath of $0, ${0%/*}, and
// bash's BASH_SOURCE.
var dollarZeroPattern = regexp.MustCompile(`dirname\s+(--\s+)?["']?\$\{?0\}?|\$\{0%/?\*\}|(readlink|realpath)\s+(-[a-z]+\s+)*["']?\$\{?0\}?|BASH_SOURCE`)

// maxScript bounds the bytes of a script entrypoint that dollarZero reads.
const maxScript = 65536

// dollarZero reports whether rec's entrypoint, read from its verified store
// copy, is a script ("#!") whose first maxScript bytes use one of the
// dollarZeroPattern idioms: a static fact the host states as a hint, never
// by showing package text.
func dollarZero(rec *binding.Record) bool {
	head, ok := readHead(filepath.Join(rec.PackageRoot, filepath.FromSlash(rec.Entrypoint)), maxScript)
	return ok && bytes.HasPrefix(head, []byte("#!")) && dollarZeroPattern.Match(head)
}

// DollarZeroWarning is the warning bind and upgrade print when rec's
// entrypoint script finds its files through $0 ([HINT-4]); "" otherwise.
func DollarZeroWarning(rec *binding.Record) string {
	if !dollarZero(rec) {
		return ""
	}
	return "entrypoint " + rec.Entrypoint + " of " + rec.ExtensionID + ": " + dollarZeroHint
}

// notRunnable words exit status 127 (not found) or 126 (found, not runnable)
// with the entrypoint's first line and the fixed PATH.
func notRunnable(rec *binding.Record, status int) string {
	what := "a program it names was not found"
	if status == 126 {
		what = "a program it names could not be executed"
	}
	line, shown, ok := firstLine(filepath.Join(rec.PackageRoot, filepath.FromSlash(rec.Entrypoint)))
	switch {
	case !ok:
	case !bytes.HasPrefix(line, []byte("#!")):
		what += "; the entrypoint has no #! line, so unless it is a binary for this machine the kernel cannot run it (its first line is " + shown + ")"
	case bytes.HasSuffix(line, []byte("\r")):
		what += "; its #! line " + shown + " ends in a carriage return (CRLF line ends), which becomes part of the interpreter's name: save the file with LF line ends"
	default:
		what += " (its #! line is " + shown + ")"
	}
	return what + "; an entrypoint runs with PATH=" + SystemPath + " only, without a shell"
}

// firstLine reads at most maxShebang bytes of the regular file at path (not
// following a symlink: readHead) up to its first newline. shown is the line
// as one printable-ASCII Go string, followed by "..." when the bound cut it.
func firstLine(path string) (line []byte, shown string, ok bool) {
	// One byte more than shown tells a line of exactly maxShebang bytes
	// from a longer one.
	line, ok = readHead(path, maxShebang+1)
	if !ok {
		return nil, "", false
	}
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	cut := len(line) > maxShebang
	if cut {
		line = line[:maxShebang]
	}
	shown = strconv.QuoteToASCII(string(line))
	if cut {
		shown += "..."
	}
	return line, shown, true
}

// readHead reads at most n bytes of the regular file at path, not following
// a symlink. Any other kind of file is not read: package code may have
// replaced its entrypoint with a FIFO that a process outside its group
// holds open, and a read of it would block fm past every timeout.
func readHead(path string, n int) ([]byte, bool) {
	f, err := fsutil.OpenNoFollow(path)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, false
	}
	buf := make([]byte, n)
	got, err := io.ReadFull(f, buf)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return nil, false
	}
	return buf[:got], true
}

// damagedAtBind is the refusal of a bind whose installed copy no longer
// verifies (err) once the bind's handshake ran package code in it
// ([BIND-6], [INV-1]): a handshake that wrote into its working directory
// (possible only as root, where 0555 does not stop a write) must not leave
// a binding whose next run is refused. On drift nothing is published, and
// the copy is removed when this bind created it (created); a store copy
// that existed before this bind is shared by whatever else names it (a
// retired binding, an earlier bind) and is kept for the operator's repair.
func damagedAtBind(rec *binding.Record, created bool, err error) error {
	fate := "it existed before this bind, so it was kept: repair or remove it as in \"A damaged store copy\" (docs/configuration.md §3)"
	if created {
		fate = "this bind had created it, and removed it again"
		if rerr := pkgtree.RemoveInstalled(rec.PackageRoot); rerr != nil {
			fate = "this bind had created it but could not remove it (" + rerr.Error() + "): remove it as in \"A damaged store copy\" (docs/configuration.md §3)"
		}
	}
	return &errcode.Error{Code: errcode.Of(err), Err: err, Msg: "the installed copy " + rec.PackageRoot + " no longer verifies after the bind's handshake (" + err.Error() + "); nothing was published and " + fate + ". " + writeHint}
}

// damagedByHandshake is the refusal of a handshake of a bound package (verify,
// register-extension) after which its installed copy no longer verifies
// (err): the copy is shared by the binding, so it is kept for the
// operator's repair.
func damagedByHandshake(rec *binding.Record, err error) error {
	return &errcode.Error{Code: errcode.Of(err), Err: err, Msg: "the installed copy " + rec.PackageRoot + " no longer verifies after the handshake (" + err.Error() + "): repair or remove it as in \"A damaged store copy\" (docs/configuration.md §3). " + writeHint}
}

// writeHint ends the refusal of a handshake that wrote into its package
// root.
const writeHint = "A package must not write into its package root, which is read-only to it; its writable place is $FIRSTMATE_EXTENSION_STATE"
