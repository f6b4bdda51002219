package cli_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/cli"
	"firstmate.dev/fm/internal/testpkg"
)

// run is one cli.Main in this process.
func run(args ...string) (status int, stdout, stderr string) {
	var out, errb bytes.Buffer
	status = cli.Main(args, strings.NewReader(""), &out, &errb)
	return status, out.String(), errb.String()
}

// [CLI-1] [CLI-4] cli.Main runs twice in one process: every run parses its
// flags into state made for that run, so a second run sees none of the first
// one's flag values. Each case runs a verb with flags, then the same verb
// without them, and checks that the second answers as a first run would (a
// second, fresh home proves what a first run answers).
func TestMainTwiceSeesNoEarlierFlags(t *testing.T) {
	cases := []struct {
		name          string
		first, second []string
	}{
		{"extension list --json", []string{"extension", "list", "--json"}, []string{"extension", "list"}},
		{"procevent list --json", []string{"procevent", "list", "--json"}, []string{"procevent", "list"}},
		{"procevent inbox --json", []string{"procevent", "inbox", "--json"}, []string{"procevent", "inbox"}},
		{"wake list --after", []string{"wake", "list", "--after", "5"}, []string{"wake", "list"}},
		{"wake list --json", []string{"wake", "list", "--json"}, []string{"wake", "list"}},
		{"doctor --json", []string{"doctor", "--json"}, []string{"doctor"}},
		{"home import --json", []string{"home", "import", "--dry-run", "--json"}, []string{"home", "import", "--dry-run"}},
		{"register-extension --config-ref", []string{"procevent", "register-extension", "fake", "src", "--config-ref", "main"}, []string{"procevent", "register-extension", "fake", "src"}},
		{"retire-binding --if-binding-digest", []string{"extension", "retire-binding", "org.example.fake", "--if-binding-digest", "sha256:" + strings.Repeat("0", 64)}, []string{"extension", "retire-binding", "org.example.fake"}},
		{"retire-transfer digests", []string{"extension", "retire-transfer", "org.example.fake", "--if-transfer-digest", "sha256:" + strings.Repeat("1", 64), "--if-binding-digest", "sha256:" + strings.Repeat("0", 64)}, []string{"extension", "retire-transfer", "org.example.fake"}},
		{"procevent retire --if-absent", []string{"procevent", "retire", "src", "--if-absent"}, []string{"procevent", "retire", "src", "--if-owner", "sha256:" + strings.Repeat("2", 64)}},
		{"process-event --show-stderr", []string{"extension", "process-event", "fake", "source.poll", "--source-id", "direct", "--config-ref", "main"}, []string{"extension", "process-event", "fake", "source.poll"}},
		{"procevent retire --if-owner ''", []string{"procevent", "retire", "src", "--if-owner", ""}, []string{"procevent", "retire", "src"}},
		{"procevent retire --if-matches ''", []string{"procevent", "retire", "src", "--if-matches="}, []string{"procevent", "retire", "src"}},
		{"bind --timeout-ms", []string{"extension", "bind", "$PKG", "--adapter", "fake", "--timeout-ms", "5"}, []string{"extension", "bind", "$PKG", "--adapter", "fake"}},
		{"wake compact --keep", []string{"wake", "compact", "--keep", "-1"}, []string{"wake", "compact"}},
		{"sweep-home --preflight", []string{"procevent", "sweep-home", "--preflight"}, []string{"procevent", "sweep-home"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// in runs one fm command line after another in a fresh home,
			// and returns the last one's answer with the home's place
			// spelled $ROOT; $PKG in an argument is the home's package.
			in := func(lines ...[]string) (status int, stdout, stderr string) {
				h, pkg := testpkg.Home(t)
				t.Setenv("FM_HOME", h.Dir)
				t.Setenv("FM_ROOT_OVERRIDE", h.Root)
				for _, args := range lines {
					args = slices.Clone(args)
					for i, a := range args {
						args[i] = strings.ReplaceAll(a, "$PKG", pkg)
					}
					status, stdout, stderr = run(args...)
				}
				return status, strings.ReplaceAll(stdout, h.Root, "$ROOT"), strings.ReplaceAll(stderr, h.Root, "$ROOT")
			}
			wantStatus, wantOut, wantErr := in(c.second)
			status, out, errs := in(c.first, c.second)
			if status != wantStatus || out != wantOut || errs != wantErr {
				t.Fatalf("fm %s after fm %s: exit %d\nstdout:\n%s\nstderr:\n%s\nwant (as a first run) exit %d\nstdout:\n%s\nstderr:\n%s",
					strings.Join(c.second, " "), strings.Join(c.first, " "), status, out, errs, wantStatus, wantOut, wantErr)
			}
		})
	}
}
