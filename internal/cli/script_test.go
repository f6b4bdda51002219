package cli_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"firstmate.dev/fm/internal/cli"
	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/pkgtree"
	"firstmate.dev/fm/internal/procstat"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/internal/testpkg"
)

func TestMain(m *testing.M) {
	launch.MaybeBarrier()
	testscript.Main(m, map[string]func(){
		"fm": func() { os.Exit(cli.Run()) },
		// fm on a kernel without Landlock (a seccomp filter hides it).
		"fm-nolandlock": func() {
			if err := testpkg.HideLandlock(); err != nil {
				fmt.Fprintln(os.Stderr, "hide landlock:", err)
				os.Exit(3)
			}
			os.Exit(cli.Run())
		},
	})
}

// TestScripts runs the CLI scenarios in testdata/script. Each starts with:
//
//	$WORK/home        the effective home (FM_HOME), mode 0700
//	$WORK/root        the code root (FM_ROOT_OVERRIDE), with an empty bin/
//	$WORK/pkg         a package "org.example.fake" 1.0.0 declaring adapters
//	                  fake and other, whose entrypoint is testdata/fake-entrypoint.sh
//	$STATE            the state root, $WORK/home/state
//	$FAKESTATE        that package's state dir (where fakemode writes)
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		Setup:               setup,
		Condition:           condition,
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"fakemode": fakemode,
			"mkpkg":    mkpkg,
			"chmodr":   chmodr,
			"sparse":   sparse,
			"waitgone": waitgone,
			"capture":  capture,
			"wrappers": wrappers,
			"waitfile": waitfile,
			"fill":     fill,
			"aligned":  aligned,
			"jsondoc":  jsondoc,
		},
	})
}

// condition adds [root]: the scripts run as root and, by
// scripts/test-unprivileged.sh, as an unprivileged user, and root alone can
// write into a 0555 store copy; and [landlock]: the kernel has the Landlock
// ABI that confines fully (6 or later).
func condition(cond string) (bool, error) {
	switch cond {
	case "root":
		return os.Geteuid() == 0, nil
	case "landlock":
		return confine.Probe() >= 6, nil
	}
	return false, fmt.Errorf("unknown condition %q", cond)
}

func setup(env *testscript.Env) error {
	w := env.WorkDir
	for _, d := range []string{"home", "root/bin"} {
		if err := os.MkdirAll(filepath.Join(w, d), 0o700); err != nil {
			return err
		}
	}
	if err := testpkg.Make(filepath.Join(w, "pkg"), "org.example.fake", `["fake","other"]`, `[]`); err != nil {
		return err
	}
	tree, err := pkgtree.Scan(filepath.Join(w, "pkg"), pkgtree.Source)
	if err != nil {
		return err
	}
	env.Setenv("PKGHEX", strings.TrimPrefix(tree.Digest, "sha256:"))
	env.Defer(func() { testpkg.Unlock(w) })
	env.Setenv("FM_HOME", filepath.Join(w, "home"))
	env.Setenv("FM_ROOT_OVERRIDE", filepath.Join(w, "root"))
	env.Setenv("STATE", filepath.Join(w, "home", "state"))
	env.Setenv("FAKESTATE", filepath.Join(w, "home", "state", "extensions", "org.example.fake"))
	return nil
}

// fakemode <verb> <mode>: choose the fake entrypoint's behaviour.
func fakemode(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: fakemode <verb> <mode>")
	}
	ts.Check(testpkg.SetMode(ts.Getenv("FAKESTATE"), args[0], args[1]))
}

// mkpkg <dir> <id> <adapters-json> <consents-json>: another fake package.
func mkpkg(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 4 {
		ts.Fatalf("usage: mkpkg <dir> <id> <adapters-json> <consents-json>")
	}
	ts.Check(testpkg.Make(ts.MkAbs(args[0]), args[1], args[2], args[3]))
}

// chmodr <mode> <path>: chmod without following a final symlink check (like chmod).
func chmodr(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: chmodr <octal-mode> <path>")
	}
	m, err := strconv.ParseUint(args[0], 8, 32)
	ts.Check(err)
	ts.Check(os.Chmod(ts.MkAbs(args[1]), os.FileMode(m)))
}

// sparse <path> <size>: a sparse file of that size.
func sparse(ts *testscript.TestScript, neg bool, args []string) {
	n, err := strconv.ParseInt(args[1], 10, 64)
	ts.Check(err)
	f, err := os.Create(ts.MkAbs(args[0]))
	ts.Check(err)
	ts.Check(f.Truncate(n))
	ts.Check(f.Close())
	ts.Check(os.Chmod(ts.MkAbs(args[0]), 0o644))
}

// capture NAME REGEXP: set $NAME to the first submatch of REGEXP (multi-line
// mode) in the last command's stdout.
func capture(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: capture NAME REGEXP")
	}
	m := regexp.MustCompile("(?m)" + args[1]).FindStringSubmatch(ts.ReadFile("stdout"))
	if len(m) < 2 {
		ts.Fatalf("capture: %q does not match stdout", args[1])
	}
	ts.Setenv(args[0], m[1])
}

// wrappers <dir>: copy the repository's bin/fm-*.sh wrappers into dir, beside
// an "fm" that is this test's fm program.
func wrappers(ts *testscript.TestScript, neg bool, args []string) {
	dir := ts.MkAbs(args[0])
	fm, err := exec.LookPath("fm")
	if err == nil && !filepath.IsAbs(fm) {
		fm, err = filepath.Abs(fm)
	}
	ts.Check(err)
	for _, w := range []string{"fm-extension.sh", "fm-procevent.sh", "fm-on.sh"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "bin", w))
		ts.Check(err)
		ts.Check(os.WriteFile(filepath.Join(dir, w), data, 0o755))
	}
	ts.Check(os.Symlink(fm, filepath.Join(dir, "fm")))
}

// waitfile <path>: the file exists within 10 s.
func waitfile(ts *testscript.TestScript, neg bool, args []string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(ts.MkAbs(args[0])); err == nil {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s did not appear", args[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitgone <pidfile>: the pid in the file is dead (or a zombie) within 3 s.
func waitgone(ts *testscript.TestScript, neg bool, args []string) {
	data, err := os.ReadFile(ts.MkAbs(args[0]))
	ts.Check(err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	ts.Check(err)
	deadline := time.Now().Add(3 * time.Second)
	for {
		alive := syscall.Kill(pid, 0) == nil
		if alive {
			if st, err := procstat.Read(pid); err == nil && st.State == 'Z' {
				alive = false
			}
		}
		if !alive {
			if neg {
				ts.Fatalf("pid %d is gone", pid)
			}
			return
		}
		if time.Now().After(deadline) {
			if !neg {
				ts.Fatalf("pid %d is still alive", pid)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fill <dir> <count> <size>: count files of size zero bytes each, mode
// 0644, in dir (created 0755): the bulk of a large package.
func fill(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 3 {
		ts.Fatalf("usage: fill <dir> <count> <size>")
	}
	count, err := strconv.Atoi(args[1])
	ts.Check(err)
	size, err := strconv.Atoi(args[2])
	ts.Check(err)
	dir := ts.MkAbs(args[0])
	ts.Check(os.MkdirAll(dir, 0o755))
	ts.Check(os.Chmod(dir, 0o755))
	data := make([]byte, size)
	for i := range count {
		p := filepath.Join(dir, fmt.Sprintf("f%05d", i))
		ts.Check(os.WriteFile(p, data, 0o644))
		ts.Check(os.Chmod(p, 0o644))
	}
}

// terminalText is the last command's stdout as a terminal showed it: the
// pseudo-terminal's CR LF line ends turned back into LF.
func terminalText(ts *testscript.TestScript) string {
	return strings.ReplaceAll(ts.ReadFile("stdout"), "\r\n", "\n")
}

// aligned: the last command's stdout is a table whose first line is a
// header of upper-case column names separated by two or more spaces, and in
// every other line each column's cell starts exactly under its name.
func aligned(ts *testscript.TestScript, neg bool, args []string) {
	lines := strings.Split(strings.TrimSuffix(terminalText(ts), "\n"), "\n")
	if len(lines) < 2 {
		ts.Fatalf("aligned: no table rows in %q", lines)
	}
	header := lines[0]
	if !regexp.MustCompile(`^[A-Z_]+(  +[A-Z_]+)+$`).MatchString(header) {
		ts.Fatalf("aligned: %q is not a table header", header)
	}
	var starts []int
	for _, m := range regexp.MustCompile(`[A-Z_]+`).FindAllStringIndex(header, -1) {
		starts = append(starts, m[0])
	}
	for _, row := range lines[1:] {
		for _, c := range starts[1:] {
			if len(row) <= c || row[c] == ' ' || row[c-1] != ' ' {
				ts.Fatalf("aligned: in row %q the cell of column %q does not start at byte %d", row, header[c:], c)
			}
		}
	}
}

// jsondoc: the last command's stdout is exactly one strict JSON document
// (no duplicate key, nothing before or after it but whitespace).
func jsondoc(ts *testscript.TestScript, neg bool, args []string) {
	ts.Check(strictjson.CheckSyntax([]byte(terminalText(ts)), "stdout"))
}
