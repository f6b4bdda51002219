package remote_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"firstmate.dev/fm/internal/testpkg"
)

// misbehave installs a stand-in ssh running script (sh) and returns the
// environment that selects it. The script sees the remote command as its
// last argument in $cmd.
func (w *world) misbehave(t *testing.T, name, script string) []string {
	t.Helper()
	p := filepath.Join(w.base, name)
	write(t, p, []byte("#!/bin/sh\nfor cmd in \"$@\"; do :; done\n"+script+"\n"), 0o755)
	return []string{"FM_SSH_BIN=" + p}
}

// cleanFailure checks [CLI-3] for a run of the real fm: exit 1, nothing on
// stdout, exactly one error line with code on stderr, naming want.
func cleanFailure(t *testing.T, what, out, errOut string, exit int, code, want string) {
	t.Helper()
	if exit != 1 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "error["+code+"]: ") || !strings.Contains(errOut, want) {
		t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1, no stdout and one error[%s] line naming %q", what, exit, out, errOut, code, want)
	}
}

// [XFER-5] [CLI-3] A transport that exits 0 after printing anything but the
// exact lines of a successful receive-transfer-bind of the transfer that was
// packed bound nothing that fm can vouch for: remote-bind fails with
// remote-invalid and presents none of it. The real remote's answer for
// another transfer digest is refused the same way.
func TestRemoteBindChecksTheAnswer(t *testing.T) {
	for name, script := range map[string]string{
		"escapes":     `cat >/dev/null; printf '\033]0;title\007\033[2J'; exit 0`,
		"nothing":     `cat >/dev/null; exit 0`,
		"banner":      `cat >/dev/null; echo "Welcome to secondmate"; exit 0`,
		"half":        `cat >/dev/null; printf 'bound: ` + exampleID + `@1.0.0\n'; exit 0`,
		"other-xfer":  `sh -c "$cmd" | sed 's/^transfer-digest: .*/transfer-digest: sha256:` + strings.Repeat("0", 64) + `/'`,
		"other-pkg":   `sh -c "$cmd" | sed 's/^package-digest: .*/package-digest: sha256:` + strings.Repeat("0", 64) + `/'`,
		"other-path":  `sh -c "$cmd" | sed 's#^binding: /#binding: /elsewhere/#; s#/config/extensions.d/#/config/x/#'`,
		"extra-line":  `sh -c "$cmd"; echo "Last login: today"`,
		"no-newline":  `sh -c "$cmd" | head -c -1`,
		"good-answer": `exec sh -c "$cmd"`,
	} {
		w := newWorld(t) // each case its own secondmate: some do bind there
		w.route(t, "me@secondmate.example")
		env := w.misbehave(t, "ssh-"+name, script)
		out, errOut, code := run(w.controller, env, nil, append([]string{"extension", "remote-bind", "sm1", w.pkg}, strings.Fields(bindArgs)...)...)
		if name == "good-answer" {
			if code != 0 || !strings.Contains(out, "transfer-digest: sha256:") {
				t.Errorf("%s: exit %d\n%s%s", name, code, out, errOut)
			}
			continue
		}
		cleanFailure(t, name, out, errOut, code, "remote-invalid", "did not answer as a successful receive-transfer-bind")
	}
}

// [XFER-4] [CLI-3] fm on relays the secondmate's answer only in the form of
// an fm answer: a remote that fails with partial stdout and no error line,
// or with two error lines, or with an unknown status, is remote-invalid with
// nothing of its stdout shown; the remote's own single error line (exit 1)
// and usage error (exit 2) come back as they are, and so do doctor's
// unhealthy report (exit 1) and the poll statuses 70 and 75 of [OP-2].
func TestOnRelaysOnlyAnFmAnswer(t *testing.T) {
	w := newWorld(t)
	w.route(t, "me@secondmate.example")
	for _, c := range []struct {
		name, script string
		args         []string
		exit         int
		stdout       string
		stderr       string // prefix; "" for remote-invalid
	}{
		{"partial stdout", `printf 'bound: x\nbinding: /y\n'; exit 1`, []string{"extension", "list"}, 1, "", ""},
		{"error line after stdout", `echo partial; echo 'error[internal]: boom' >&2; exit 1`, []string{"extension", "list"}, 1, "", ""},
		{"two error lines", `echo 'error[internal]: a' >&2; echo 'error[internal]: b' >&2; exit 1`, []string{"extension", "list"}, 1, "", ""},
		{"no error line", `echo 'Connection closed by remote' >&2; exit 1`, []string{"extension", "list"}, 1, "", ""},
		{"unknown status", `echo 'error[internal]: x' >&2; exit 3`, []string{"extension", "list"}, 1, "", ""},
		{"status 70 of another command", `echo '{}'; exit 70`, []string{"extension", "list"}, 1, "", ""},
		{"one error line", `echo 'error[binding-missing]: no binding' >&2; exit 1`, []string{"extension", "list"}, 1, "", "error[binding-missing]: no binding\n"},
		{"usage", `printf 'error[usage]: bad\nusage: fm extension list\n' >&2; exit 2`, []string{"extension", "list"}, 2, "", "error[usage]: bad\nusage: fm extension list\n"},
		{"doctor unhealthy", `echo 'FAIL  home'; exit 1`, []string{"doctor"}, 1, "FAIL  home\n", ""},
		{"poll evidence", `echo '{"evidence":1}'; exit 70`, []string{"extension", "process-event", "x"}, 70, "{\"evidence\":1}\n", ""},
		{"poll no result", `exit 75`, []string{"extension", "process-event", "x"}, 75, "", ""},
		{"stream then fail", `echo 'captured: /r'; echo 'error[internal]: disk' >&2; exit 1`, []string{"procevent", "serve"}, 1, "captured: /r\n", "error[internal]: disk\n"},
	} {
		env := w.misbehave(t, "ssh-"+strings.ReplaceAll(c.name, " ", "-"), c.script)
		out, errOut, code := run(w.controller, env, nil, append([]string{"on", "sm1"}, c.args...)...)
		if c.stdout == "" && c.stderr == "" && c.exit == 1 && c.args[0] != "doctor" {
			cleanFailure(t, c.name, out, errOut, code, "remote-invalid", "without the one error line of an fm failure")
			continue
		}
		if code != c.exit || out != c.stdout || errOut != c.stderr {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want it relayed: exit %d, stdout %q, stderr %q", c.name, code, out, errOut, c.exit, c.stdout, c.stderr)
		}
	}
}

// [XFER-4] [XFER-5] A hung transport does not hang fm on or remote-bind: at
// the deadline (--timeout, here 1 s) fm stops the transport's whole process
// group (TERM, then KILL for one that ignores TERM) and fails with
// remote-invalid naming the deadline; no process of the group survives.
func TestOnDeadline(t *testing.T) {
	w := newWorld(t)
	w.route(t, "me@secondmate.example")
	marker := "FMTEST_HUNG=" + filepath.Base(w.base)
	for name, script := range map[string]string{
		"hangs":        `sleep 300 & sleep 300`,
		"ignores-term": `trap '' TERM; sleep 300 & sleep 300`,
	} {
		env := append(w.misbehave(t, "ssh-"+name, script), marker)
		for _, args := range [][]string{
			{"on", "--timeout", "1s", "sm1", "extension", "list"},
			{"on", "--timeout=1000", "--stdin", "sm1", "wake", "watch"},
			append([]string{"extension", "remote-bind", "sm1", w.pkg, "--timeout", "1s"}, strings.Fields(bindArgs)...),
		} {
			start := time.Now()
			out, errOut, code := run(w.controller, env, nil, args...)
			took := time.Since(start)
			cleanFailure(t, name+" "+args[0], out, errOut, code, "remote-invalid", "no answer within the deadline of 1s")
			if took > 30*time.Second {
				t.Errorf("%s %v: took %s with a deadline of 1s", name, args, took)
			}
			deadline := time.Now().Add(10 * time.Second)
			for len(testpkg.Processes(marker)) > 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%s %v: processes %v of the transport's group survive", name, args, testpkg.Processes(marker))
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
}

// [XFER-4] An unknown secondmate is not a malformed command: exit 1 with
// secondmate-missing, listing the known routes; with no route file at all,
// saying so. remote-bind looks up the same way.
func TestOnUnknownSecondmate(t *testing.T) {
	w := newWorld(t)
	out, errOut, code := run(w.controller, nil, nil, "on", "nobody", "extension", "list")
	cleanFailure(t, "no routes", out, errOut, code, "secondmate-missing", "there are no routes")
	w.route(t, "")
	out, errOut, code = run(w.controller, nil, nil, "on", "nobody", "extension", "list")
	cleanFailure(t, "fm on", out, errOut, code, "secondmate-missing", `unknown secondmate "nobody"; the routes in `+filepath.Join(w.controller, "data", "secondmates.json")+" are: sm1")
	out, errOut, code = run(w.controller, nil, nil, append([]string{"extension", "remote-bind", "nobody", w.pkg}, strings.Fields(bindArgs)...)...)
	cleanFailure(t, "remote-bind", out, errOut, code, "secondmate-missing", "are: sm1")
	if _, err := os.Lstat(filepath.Join(w.controller, "config")); !os.IsNotExist(err) {
		t.Errorf("the controller home got a registry")
	}
}
