package host

import (
	"bytes"
	"errors"
	"io"
	"path/filepath"
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
// knows and its author needs, without any of the package's output:
//
//   - exit status 127 or 126 (the barrier's execve failed, or a shell found
//     no program or could not run it): the entrypoint's first line, read
//     from the verified store copy (at most maxShebang bytes, quoted as
//     printable ASCII), what is wrong with it when the host can tell (a
//     carriage return: CRLF line ends; no "#!"), and the fixed PATH, the
//     only one an entrypoint gets [INV-3];
//   - any other non-zero exit: that the working directory, the package
//     root, is read-only, and that the package's writable place is
//     FIRSTMATE_EXTENSION_STATE, since writing beside the code is the most
//     common reason an entrypoint that works by hand fails under the host;
//     for an invoke (a bound package), also how to see its stderr.
//
// Other failures are returned as they are.
func explain(rec *binding.Record, verb string, err error) error {
	var st launch.ExitStatus
	if !errors.As(err, &st) {
		return err
	}
	hint := "; its working directory, the package root, is read-only: the package writes only under $FIRSTMATE_EXTENSION_STATE"
	if verb == "invoke" {
		hint += " (fm extension process-event --show-stderr shows its stderr)"
	}
	if st == 126 || st == 127 {
		hint = "; " + notRunnable(rec, int(st))
	}
	return &errcode.Error{Code: errcode.Of(err), Msg: err.Error() + hint, Err: err}
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
// following a symlink) up to its first newline. shown is the line as one
// printable-ASCII Go string, followed by "..." when the bound cut it. Any
// other kind of file is not read: package code may have replaced its
// entrypoint with a FIFO that a process outside its group holds open, and
// a read of it would block fm past every timeout.
func firstLine(path string) (line []byte, shown string, ok bool) {
	f, err := fsutil.OpenNoFollow(path)
	if err != nil {
		return nil, "", false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, "", false
	}
	// One byte more than shown tells a line of exactly maxShebang bytes
	// from a longer one.
	buf := make([]byte, maxShebang+1)
	n, err := io.ReadFull(f, buf)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return nil, "", false
	}
	line = buf[:n]
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
