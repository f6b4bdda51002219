package remote

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/transfer"
)

// What a remote fm may answer. fm on presents an answer only when it has one
// of these forms ([CLI-3]: one error line, nothing partial presented as a
// result):
//
//   - exit 0: a result; stdout and stderr are relayed as they are;
//   - a result status of the command (resultStatuses: doctor's 1 for an
//     unhealthy home, extension process-event's 70 and 75 of [OP-2]),
//     whose stdout is the result: relayed as it is, with that status;
//   - an fm failure: nothing on stdout and, on stderr, exactly one line
//     error[<code>]: <message> with exit 1, or for a usage error that line
//     and the usage text with exit 2: relayed as it is, with that status.
//     Of a command that streams its lines as it goes (procevent serve, wake
//     watch), stdout may hold the lines written before the failure: each is
//     a whole result, so they are relayed too.
//
// Anything else (a transport that exits 0 after printing noise is still an
// exit 0; but a non-zero status with output on stdout, no error line, two of
// them, or another status) is remote-invalid, and nothing of the answer's
// stdout is shown. ssh's own failure, 255, is process-failed (Run).
var resultStatuses = []struct {
	argv     []string
	statuses []int
}{
	{[]string{"doctor"}, []int{1}},
	{[]string{"extension", "process-event"}, []int{70, 75}},
}

// streaming are the commands whose stdout lines are written as they come.
var streaming = [][]string{{"procevent", "serve"}, {"wake", "watch"}}

// startsWith reports whether argv starts with the words of cmd.
func startsWith(argv, cmd []string) bool {
	return len(argv) >= len(cmd) && slices.Equal(argv[:len(cmd)], cmd)
}

var errorLine = lazyRegexp(`^error\[([a-z][a-z-]*)\]: \S`)

// CheckAnswer applies the rules above to res, the answer to the job argv
// run through r.
func CheckAnswer(r *Route, argv []string, res *Result) error {
	if res.Status == 0 {
		return nil
	}
	for _, rs := range resultStatuses {
		if startsWith(argv, rs.argv) && slices.Contains(rs.statuses, res.Status) {
			return nil
		}
	}
	partial := len(res.Stdout) > 0 && !slices.ContainsFunc(streaming, func(c []string) bool { return startsWith(argv, c) })
	stderr := string(res.Stderr)
	first, rest, _ := strings.Cut(stderr, "\n")
	m := errorLine().FindStringSubmatch(first)
	var ok bool
	switch {
	case partial || m == nil || !strings.HasSuffix(stderr, "\n"):
	case res.Status == 1:
		ok = m[1] != string(errcode.Usage) && rest == ""
	case res.Status == 2:
		ok = m[1] == string(errcode.Usage) && !strings.Contains(rest, "error[")
	}
	if ok {
		return nil
	}
	return errcode.New(errcode.RemoteInvalid, "fm on %s: %s exited %d without the one error line of an fm failure (%d bytes on stdout, not shown; stderr: %q)",
		r.where(), argv[0], res.Status, len(res.Stdout), truncate(first, 200))
}

// BoundKeys are the lines a successful receive-transfer-bind prints, in
// order (cli's printBound, then the transfer digest).
var BoundKeys = []string{"bound", "binding", "binding-digest", "package", "package-digest", "verified", "transfer-digest"}

// CheckBound checks that out, the stdout of a remote receive-transfer-bind
// that exited 0, is exactly the lines of a successful bind of p, the
// transfer that was sent: its extension id@version, the registry record of
// that id, the store directory of that identity and package digest, and
// its transfer digest. Anything else is remote-invalid: a transport that
// prints a banner or terminal escapes and exits 0 bound nothing that can be
// trusted ([XFER-5]).
func CheckBound(r *Route, out []byte, p *transfer.Package) error {
	m := &p.Manifest
	bad := func(why string) error {
		return errcode.New(errcode.RemoteInvalid, "remote-bind %s: the remote did not answer as a successful receive-transfer-bind of transfer %s (%s); nothing is known to be bound: look with fm on <secondmate> extension list", r.where(), p.Digest, why)
	}
	text := string(out)
	if !strings.HasSuffix(text, "\n") {
		return bad(fmt.Sprintf("%d bytes that do not end a line", len(out)))
	}
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) != len(BoundKeys) {
		return bad(fmt.Sprintf("%d lines, not %d", len(lines), len(BoundKeys)))
	}
	absolute := func(v, suffix string) bool {
		return filepath.IsAbs(v) && filepath.Clean(v) == v && plain(v) && strings.HasSuffix(v, suffix)
	}
	for i, l := range lines {
		key := BoundKeys[i]
		v, found := strings.CutPrefix(l, key+": ")
		var good bool
		switch key {
		case "bound":
			good = v == m.ExtensionID+"@"+m.ExtensionVersion
		case "binding":
			good = absolute(v, "/"+filepath.Join("config", "extensions.d", m.ExtensionID+".json"))
		case "binding-digest":
			good = binding.CheckDigest(v)
		case "package":
			good = absolute(v, "/"+filepath.Join("data", "extensions", "packages", m.ExtensionID, m.ExtensionVersion, binding.Hex(m.PackageDigest)))
		case "package-digest":
			good = v == m.PackageDigest
		case "verified":
			good = strings.HasPrefix(v, "process-event-adapter/") && plain(v)
		case "transfer-digest":
			good = v == p.Digest
		}
		if !found || !good {
			return bad(fmt.Sprintf("line %d is %q, not the expected %s line", i+1, truncate(l, 120), key))
		}
	}
	return nil
}
