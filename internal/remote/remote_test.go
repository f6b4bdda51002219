package remote

import (
	"bytes"
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/testpkg"
)

func wantCode(t *testing.T, err error, code errcode.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("got success, want error[%s]", code)
	}
	if got := errcode.Of(err); got != code {
		t.Fatalf("got error[%s]: %v; want error[%s]", got, err, code)
	}
}

func canonicalTemp(t *testing.T) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func writeFile(t *testing.T, p, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// TestLookup checks the route file rules of [XFER-4] and [HOME-4]: a private
// 0600 file, strict JSON, absolute clean paths, a host that cannot be an ssh
// option and is never empty (an empty host is refused, not run locally), a
// remote root that needs no quoting in any shell, and one bad route refusing
// the whole file.
func TestLookup(t *testing.T) {
	for _, c := range []struct {
		name, routes string
		mode         os.FileMode
		id           string
		code         errcode.Code // "" for success
	}{
		{"local", `{"sm1":{"home":"/srv/h","root":"/srv/r"}}`, 0o600, "sm1", ""},
		{"remote", `{"sm1":{"home":"/srv/h","root":"/srv/r","host":"me@box.example"}}`, 0o600, "sm1", ""},
		{"unknown id", `{"sm1":{"home":"/srv/h","root":"/srv/r"}}`, 0o600, "sm2", errcode.SecondmateMissing},
		{"group-readable file", `{"sm1":{"home":"/srv/h","root":"/srv/r"}}`, 0o640, "sm1", errcode.ModeUnsafe},
		{"relative home", `{"sm1":{"home":"srv/h","root":"/srv/r"}}`, 0o600, "sm1", errcode.PathUnsafe},
		{"unclean root", `{"sm1":{"home":"/srv/h","root":"/srv/../r"}}`, 0o600, "sm1", errcode.PathUnsafe},
		{"newline in home", `{"sm1":{"home":"/srv/h\n","root":"/srv/r"}}`, 0o600, "sm1", errcode.PathUnsafe},
		{"host that is an option", `{"sm1":{"home":"/srv/h","root":"/srv/r","host":"-oProxyCommand=x"}}`, 0o600, "sm1", errcode.SchemaInvalid},
		{"host with a space", `{"sm1":{"home":"/srv/h","root":"/srv/r","host":"a b"}}`, 0o600, "sm1", errcode.SchemaInvalid},
		{"bad route elsewhere", `{"sm1":{"home":"/srv/h","root":"/srv/r"},"sm2":{"home":"x","root":"/r"}}`, 0o600, "sm1", errcode.PathUnsafe},
		{"empty host", `{"sm1":{"home":"/srv/h","root":"/srv/r","host":""}}`, 0o600, "sm1", errcode.SchemaInvalid},
		{"empty host elsewhere", `{"sm1":{"home":"/srv/h","root":"/srv/r"},"sm2":{"home":"/srv/h","root":"/srv/r","host":""}}`, 0o600, "sm1", errcode.SchemaInvalid},
		{"null host", `{"sm1":{"home":"/srv/h","root":"/srv/r","host":null}}`, 0o600, "sm1", errcode.SchemaInvalid},
		{"remote root with a quote", `{"sm1":{"home":"/srv/h","root":"/srv/it's","host":"me@box"}}`, 0o600, "sm1", errcode.SchemaInvalid},
		{"remote root with a space", `{"sm1":{"home":"/srv/h","root":"/srv/a b","host":"me@box"}}`, 0o600, "sm1", errcode.SchemaInvalid},
		{"remote root with a dollar", `{"sm1":{"home":"/srv/h","root":"/srv/$HOME","host":"me@box"}}`, 0o600, "sm1", errcode.SchemaInvalid},
		{"unknown key", `{"sm1":{"home":"/srv/h","root":"/srv/r","env":{"A":"b"}}}`, 0o600, "sm1", errcode.SchemaInvalid},
		{"missing root", `{"sm1":{"home":"/srv/h"}}`, 0o600, "sm1", errcode.SchemaInvalid},
		{"duplicate id", `{"sm1":{"home":"/a","root":"/b"},"sm1":{"home":"/c","root":"/d"}}`, 0o600, "sm1", errcode.JSONInvalid},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &home.Home{Dir: canonicalTemp(t)}
			writeFile(t, h.Secondmates(), c.routes, c.mode)
			r, err := Lookup(h, c.id)
			if c.code == "" {
				if err != nil || r.Home != "/srv/h" || r.Root != "/srv/r" {
					t.Fatalf("route %+v, %v", r, err)
				}
				return
			}
			wantCode(t, err, c.code)
			if c.code == errcode.SchemaInvalid && !strings.Contains(err.Error(), h.Secondmates()) {
				t.Errorf("%v does not name the route file", err)
			}
		})
	}
	// A local route's root and home need no shell, so they may hold any
	// character but a control character.
	t.Run("local root with a quote and a space", func(t *testing.T) {
		h := &home.Home{Dir: canonicalTemp(t)}
		writeFile(t, h.Secondmates(), `{"sm1":{"home":"/srv/it's home","root":"/srv/a b"}}`, 0o600)
		if r, err := Lookup(h, "sm1"); err != nil || r.Root != "/srv/a b" {
			t.Fatalf("route %+v, %v", r, err)
		}
	})
	t.Run("no route file", func(t *testing.T) {
		_, err := Lookup(&home.Home{Dir: canonicalTemp(t)}, "sm1")
		wantCode(t, err, errcode.SecondmateMissing)
	})
}

// argvScript is a stand-in bin/fm that prints its argv (one per line), its
// FM_ variables and its stdin.
const argvScript = `#!/bin/sh
for a in "$@"; do printf 'arg:%s\n' "$a"; done
printf 'FM_HOME=%s\nFM_ROOT_OVERRIDE=%s\nFM_STATE_OVERRIDE=%s\n' "$FM_HOME" "${FM_ROOT_OVERRIDE-unset}" "${FM_STATE_OVERRIDE-unset}"
printf 'stdin:'; cat
exit "${FM_TEST_EXIT:-0}"
`

// hostile are arguments a shell would interpret if they were not quoted.
var hostile = []string{"extension", "inspect", "$(touch PWNED)", "`touch PWNED`", "; touch PWNED", "it's", `"dq"`, "*", "a b", "", "${HOME}", `back\slash`, "-u", "--"}

func fakeRoot(t *testing.T) string {
	t.Helper()
	root := canonicalTemp(t)
	writeFile(t, filepath.Join(root, "bin", "fm"), argvScript, 0o755)
	return root
}

// expectedOutputPrefix is what argvScript prints first for args.
func expectedOutputPrefix(args []string) string {
	var b strings.Builder
	for _, a := range args {
		b.WriteString("arg:" + a + "\n")
	}
	return b.String()
}

func expectedOutput(home string, args []string, stdin string) string {
	var b strings.Builder
	for _, a := range args {
		b.WriteString("arg:" + a + "\n")
	}
	b.WriteString("FM_HOME=" + home + "\nFM_ROOT_OVERRIDE=unset\nFM_STATE_OVERRIDE=unset\nstdin:" + stdin)
	return b.String()
}

// shells are the shells on this machine that the remote command is run
// through, standing in for the remote login shell.
func shells(t *testing.T) []string {
	var found []string
	for _, sh := range []string{"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "csh", "tcsh"} {
		if p, err := exec.LookPath(sh); err == nil {
			found = append(found, p)
		}
	}
	if len(found) == 0 {
		t.Skip("no shell")
	}
	return found
}

// safeWords is the whole alphabet of the remote command: characters no
// shell interprets, and spaces between exactly three words.
var safeWords = regexp.MustCompile(`^[A-Za-z0-9._/-]+ on-receive [A-Za-z0-9_-]+$`)

// TestRemoteCommandEncoding checks the command string ssh hands to the
// remote login shell ([XFER-4], [XFER-5]): three words of letters, digits
// and ._/-, so no shell's quoting rules matter (sh, bash, fish, csh and the
// rest split it the same way and interpret nothing); run through every shell
// here, the secondmate's bin/fm gets exactly "on-receive <job>", and the job
// decodes to the route's home and exactly the caller's argv.
func TestRemoteCommandEncoding(t *testing.T) {
	root := fakeRoot(t)
	work := canonicalTemp(t)
	r := &Route{Home: "/srv/it's home; $(touch PWNED)", Root: root, Host: "me@box"}
	command, err := RemoteCommand(r, hostile)
	if err != nil {
		t.Fatal(err)
	}
	if !safeWords.MatchString(command) || !strings.HasPrefix(command, root+"/bin/fm ") {
		t.Fatalf("remote command %q holds characters a shell could interpret", command)
	}
	job := strings.Fields(command)[2]
	for _, sh := range shells(t) {
		cmd := exec.Command(sh, "-c", command)
		cmd.Dir = work
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", sh, err)
		}
		if got, want := string(out), expectedOutputPrefix([]string{ReceiveVerb, job}); !strings.HasPrefix(got, want) {
			t.Fatalf("%s: remote side saw\n%s\nwant\n%s", sh, got, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(work, "PWNED")); err == nil {
		t.Fatal("an argument was executed by the shell")
	}
	j, err := DecodeJob(job)
	if err != nil {
		t.Fatal(err)
	}
	if j.Home != r.Home || !slices.Equal(j.Argv, hostile) {
		t.Fatalf("decoded job %+v; want home %q and argv %q", j, r.Home, hostile)
	}
	env := JobEnv(j)
	if len(env) < 2 || env[0] != "PATH=/usr/local/bin:/usr/bin:/bin" || env[1] != "FM_HOME="+r.Home || (len(env) == 3 && !strings.HasPrefix(env[2], "HOME=/")) || len(env) > 3 {
		t.Errorf("job environment %q; want exactly PATH, FM_HOME and at most HOME", env)
	}

	r.Root = "/srv/it's"
	_, err = RemoteCommand(r, hostile)
	wantCode(t, err, errcode.SchemaInvalid)
	_, err = RemoteCommand(&Route{Home: "/h", Root: root, Host: "me@box"}, []string{"extension", strings.Repeat("x", MaxJob)})
	wantCode(t, err, errcode.RequestOversized)
}

// TestDecodeJob checks the remote end's refusals ([XFER-4]): only a job
// fm on wrote, in its one canonical encoding, for a command that runs in a
// home; everything else is usage and runs nothing.
func TestDecodeJob(t *testing.T) {
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	good, err := EncodeJob("/srv/h", []string{"extension", "list"})
	if err != nil {
		t.Fatal(err)
	}
	if j, err := DecodeJob(good); err != nil || j.Home != "/srv/h" || !slices.Equal(j.Argv, []string{"extension", "list"}) {
		t.Fatalf("good job: %+v %v", j, err)
	}
	for name, word := range map[string]string{
		"padded":            good + "=",
		"standard base64":   strings.NewReplacer("-", "+", "_", "/").Replace(enc(`{"argv":["wake","list"],"home":"/srv/h~~~>","schema":"firstmate.fm-on-job.v1"}`)),
		"not canonical":     enc(`{"schema":"firstmate.fm-on-job.v1","home":"/srv/h","argv":["wake","list"]}`),
		"unknown key":       enc(`{"argv":["wake","list"],"env":{"A":"b"},"home":"/srv/h","schema":"firstmate.fm-on-job.v1"}`),
		"other schema":      enc(`{"argv":["wake","list"],"home":"/srv/h","schema":"firstmate.fm-on-job.v2"}`),
		"relative home":     enc(`{"argv":["wake","list"],"home":"srv/h","schema":"firstmate.fm-on-job.v1"}`),
		"on itself":         enc(`{"argv":["on","sm1","wake","list"],"home":"/srv/h","schema":"firstmate.fm-on-job.v1"}`),
		"on-receive itself": enc(`{"argv":["on-receive","x"],"home":"/srv/h","schema":"firstmate.fm-on-job.v1"}`),
		"a program":         enc(`{"argv":["sh","-c","true"],"home":"/srv/h","schema":"firstmate.fm-on-job.v1"}`),
		"empty argv":        enc(`{"argv":[],"home":"/srv/h","schema":"firstmate.fm-on-job.v1"}`),
		"control character": enc(`{"argv":["wake","a\nb"],"home":"/srv/h","schema":"firstmate.fm-on-job.v1"}`),
		"too long":          strings.Repeat("A", base64.RawURLEncoding.EncodedLen(MaxJob)+1),
		"empty":             "",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeJob(word)
			wantCode(t, err, errcode.Usage)
		})
	}
}

// TestRunLocal checks a route without a host ([XFER-4]): the secondmate's
// own bin/fm runs directly with exactly the argv and stdin, FM_HOME set to
// the route's home and the caller's overrides removed; its output and exit
// status come back unchanged.
func TestRunLocal(t *testing.T) {
	root := fakeRoot(t)
	r := &Route{Home: "/srv/h", Root: root}
	t.Setenv("FM_ROOT_OVERRIDE", "/controller/root")
	t.Setenv("FM_STATE_OVERRIDE", "/controller/state")
	t.Setenv("FM_TEST_EXIT", "75")
	res, err := Run(context.Background(), r, hostile, []byte("input bytes"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(res.Stdout), expectedOutput(r.Home, hostile, "input bytes"); got != want {
		t.Fatalf("local fm saw\n%s\nwant\n%s", got, want)
	}
	if res.Status != 75 {
		t.Errorf("status %d, want 75", res.Status)
	}
}

// TestRunSSH checks the ssh job ([XFER-4]): argv is exactly the fixed safe
// options, the host and the encoded command; ssh's own failure (255) is
// process-failed.
func TestRunSSH(t *testing.T) {
	dir := canonicalTemp(t)
	log := filepath.Join(dir, "argv")
	writeFile(t, filepath.Join(dir, "ssh"), `#!/bin/sh
for a in "$@"; do printf '%s\n' "$a"; done >`+log+`
echo "ssh: connect to host box port 22: Connection refused" >&2
exit 255
`, 0o755)
	t.Setenv(SSHEnv, filepath.Join(dir, "ssh"))
	r := &Route{Home: "/srv/h", Root: "/srv/r", Host: "me@box"}
	_, err := Run(context.Background(), r, []string{"extension", "list"}, nil, 0)
	wantCode(t, err, errcode.ProcessFailed)
	if !strings.Contains(err.Error(), "Connection refused") {
		t.Errorf("error %v does not say why ssh failed", err)
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	job, err := EncodeJob("/srv/h", []string{"extension", "list"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"-T", "-a", "-x", "-o", "BatchMode=yes", "-o", "ClearAllForwardings=yes",
		"-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3", "--", "me@box",
		"/srv/r/bin/fm on-receive " + job}
	if !slices.Equal(got, want) {
		t.Fatalf("ssh argv %q\nwant %q", got, want)
	}
}

// TestRunBounds checks the bounded job of [XFER-4]: stdin, stdout, and
// arguments that a remote shell could split.
func TestRunBounds(t *testing.T) {
	root := canonicalTemp(t)
	writeFile(t, filepath.Join(root, "bin", "fm"), "#!/bin/sh\nhead -c "+strconv.Itoa(MaxStdout+1)+" /dev/zero\nexec sleep 30\n", 0o755)
	r := &Route{Home: "/srv/h", Root: root}
	_, err := Run(context.Background(), r, []string{"wake", "list"}, nil, 0)
	wantCode(t, err, errcode.ResponseOversized)

	_, err = Run(context.Background(), r, []string{"wake", "list"}, make([]byte, MaxStdin+1), 0)
	wantCode(t, err, errcode.RequestOversized)
	_, err = ReadInput(bytes.NewReader(make([]byte, MaxStdin+1)))
	wantCode(t, err, errcode.RequestOversized)
	if in, err := ReadInput(bytes.NewReader(make([]byte, MaxStdin))); err != nil || len(in) != MaxStdin {
		t.Fatalf("exactly MaxStdin: %d %v", len(in), err)
	}

	_, err = Run(context.Background(), r, []string{"extension", "inspect", "a\nb"}, nil, 0)
	wantCode(t, err, errcode.Usage)
}

// [XFER-4] --timeout takes a duration or milliseconds, 0 for none.
func TestTimeouts(t *testing.T) {
	for in, want := range map[string]time.Duration{"1500": 1500 * time.Millisecond, "0": 0, "90s": 90 * time.Second, "15m": 15 * time.Minute, "0s": 0} {
		if d, err := ParseTimeout(in); err != nil || d != want {
			t.Errorf("ParseTimeout(%q) = %v, %v; want %v", in, d, err, want)
		}
	}
	for _, in := range []string{"", "-1", "-5s", "soon", "1.5", "9223372036854775807", " 1s", "+5", "1e3"} {
		if _, err := ParseTimeout(in); errcode.Of(err) != errcode.Usage {
			t.Errorf("ParseTimeout(%q): %v, want usage", in, err)
		}
	}
}

// [XFER-4] A local route's fm that hangs is stopped at the deadline with
// its whole process group, as a transport is: remote-invalid naming the
// deadline, within the deadline and the stop grace.
func TestRunLocalDeadline(t *testing.T) {
	root := canonicalTemp(t)
	marker := "FMTEST_LOCAL_HUNG=" + filepath.Base(root)
	t.Setenv("FMTEST_LOCAL_HUNG", filepath.Base(root))
	writeFile(t, filepath.Join(root, "bin", "fm"), "#!/bin/sh\ntrap '' TERM\nsleep 300 &\nsleep 300\n", 0o755)
	r := &Route{Home: "/srv/h", Root: root}
	start := time.Now()
	_, err := Run(context.Background(), r, []string{"wake", "list"}, nil, 500*time.Millisecond)
	wantCode(t, err, errcode.RemoteInvalid)
	if !strings.Contains(err.Error(), "deadline of 500ms") {
		t.Errorf("%v does not name the deadline", err)
	}
	if took := time.Since(start); took > 500*time.Millisecond+StopGrace+5*time.Second {
		t.Errorf("took %s", took)
	}
	for deadline := time.Now().Add(5 * time.Second); len(testpkg.Processes(marker)) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("processes %v of the job's group survive", testpkg.Processes(marker))
		}
	}
}
