package remote

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
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
// option, and one bad route refusing the whole file.
func TestLookup(t *testing.T) {
	for _, c := range []struct {
		name, routes string
		mode         os.FileMode
		id           string
		code         errcode.Code // "" for success
	}{
		{"local", `{"sm1":{"home":"/srv/h","root":"/srv/r"}}`, 0o600, "sm1", ""},
		{"remote", `{"sm1":{"home":"/srv/h","root":"/srv/r","host":"me@box.example"}}`, 0o600, "sm1", ""},
		{"unknown id", `{"sm1":{"home":"/srv/h","root":"/srv/r"}}`, 0o600, "sm2", errcode.Usage},
		{"group-readable file", `{"sm1":{"home":"/srv/h","root":"/srv/r"}}`, 0o640, "sm1", errcode.ModeUnsafe},
		{"relative home", `{"sm1":{"home":"srv/h","root":"/srv/r"}}`, 0o600, "sm1", errcode.PathUnsafe},
		{"unclean root", `{"sm1":{"home":"/srv/h","root":"/srv/../r"}}`, 0o600, "sm1", errcode.PathUnsafe},
		{"newline in home", `{"sm1":{"home":"/srv/h\n","root":"/srv/r"}}`, 0o600, "sm1", errcode.PathUnsafe},
		{"host that is an option", `{"sm1":{"home":"/srv/h","root":"/srv/r","host":"-oProxyCommand=x"}}`, 0o600, "sm1", errcode.SchemaInvalid},
		{"host with a space", `{"sm1":{"home":"/srv/h","root":"/srv/r","host":"a b"}}`, 0o600, "sm1", errcode.SchemaInvalid},
		{"bad route elsewhere", `{"sm1":{"home":"/srv/h","root":"/srv/r"},"sm2":{"home":"x","root":"/r"}}`, 0o600, "sm1", errcode.PathUnsafe},
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
		})
	}
	t.Run("no route file", func(t *testing.T) {
		_, err := Lookup(&home.Home{Dir: canonicalTemp(t)}, "sm1")
		wantCode(t, err, errcode.Usage)
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

func expectedOutput(home string, args []string, stdin string) string {
	var b strings.Builder
	for _, a := range args {
		b.WriteString("arg:" + a + "\n")
	}
	b.WriteString("FM_HOME=" + home + "\nFM_ROOT_OVERRIDE=unset\nFM_STATE_OVERRIDE=unset\nstdin:" + stdin)
	return b.String()
}

// TestRemoteCommandQuoting runs the exact command string ssh would hand to
// the remote shell through sh: the secondmate's bin/fm gets exactly the
// argv, FM_HOME is the route's home, the override variables are unset, and
// nothing was interpreted as shell text ([XFER-4]).
func TestRemoteCommandQuoting(t *testing.T) {
	root := fakeRoot(t)
	work := canonicalTemp(t)
	r := &Route{Home: "/srv/it's home", Root: root, Host: "me@box"}
	cmd := exec.Command("sh", "-c", RemoteCommand(r, hostile))
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "FM_ROOT_OVERRIDE=/elsewhere", "FM_STATE_OVERRIDE=/elsewhere/state")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), expectedOutput(r.Home, hostile, ""); got != want {
		t.Fatalf("remote side saw\n%s\nwant\n%s", got, want)
	}
	if _, err := os.Lstat(filepath.Join(work, "PWNED")); err == nil {
		t.Fatal("an argument was executed by the shell")
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
	res, err := Run(context.Background(), r, hostile, []byte("input bytes"))
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
// options, the host and the quoted command; ssh's own failure (255) is
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
	_, err := Run(context.Background(), r, []string{"extension", "list"}, nil)
	wantCode(t, err, errcode.ProcessFailed)
	if !strings.Contains(err.Error(), "Connection refused") {
		t.Errorf("error %v does not say why ssh failed", err)
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	want := []string{"-T", "-a", "-x", "-o", "BatchMode=yes", "-o", "ClearAllForwardings=yes", "--", "me@box",
		`'env' '-u' 'FM_ROOT_OVERRIDE' '-u' 'FM_STATE_OVERRIDE' 'FM_HOME=/srv/h' '/srv/r/bin/fm' 'extension' 'list'`}
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
	_, err := Run(context.Background(), r, []string{"wake", "list"}, nil)
	wantCode(t, err, errcode.ResponseOversized)

	_, err = Run(context.Background(), r, []string{"wake", "list"}, make([]byte, MaxStdin+1))
	wantCode(t, err, errcode.RequestOversized)
	_, err = ReadInput(bytes.NewReader(make([]byte, MaxStdin+1)))
	wantCode(t, err, errcode.RequestOversized)
	if in, err := ReadInput(bytes.NewReader(make([]byte, MaxStdin))); err != nil || len(in) != MaxStdin {
		t.Fatalf("exactly MaxStdin: %d %v", len(in), err)
	}

	_, err = Run(context.Background(), r, []string{"extension", "inspect", "a\nb"}, nil)
	wantCode(t, err, errcode.Usage)
}
