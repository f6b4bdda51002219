package procevent_test

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/cli"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/procstat"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/internal/wake"
)

// The tests run real processes against real files: every fixture is a fresh
// home in a temp dir, fake extension packages are real directories bound with
// host.Bind (their entrypoint is testdata/adapter.sh), and "fm" is this test
// binary (testscript.Main installs it in PATH), run as a subprocess.

func TestMain(m *testing.M) {
	launch.MaybeBarrier()
	testscript.Main(m, map[string]func(){
		"fm": func() { os.Exit(cli.Run()) },
	})
}

//go:embed testdata/adapter.sh
var adapterScript []byte

// builtinScript is the repository's real built-in adapter.
const builtinScript = "../../bin/fm-procevent-file-watch.sh"

const extID = "org.example.sig"

type fixture struct {
	t        *testing.T
	work     string
	h        *home.Home
	env      []string // the environment of fm subprocesses
	extState string   // the fake package's FIRSTMATE_EXTENSION_STATE
	b        *binding.Binding
}

// newFixture makes a home ($work/home, 0700) and a code root ($work/root) with
// the real built-in file-watch adapter in root/bin.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	work, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, work: work}
	h := &home.Home{Root: filepath.Join(work, "root"), Dir: filepath.Join(work, "home")}
	h.State = filepath.Join(h.Dir, "state")
	f.h = h
	for _, d := range []string{h.Dir, filepath.Join(h.Root, "bin")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	script, err := os.ReadFile(builtinScript)
	if err != nil {
		t.Fatal(err)
	}
	f.write(host.BuiltinScript(h, "file-watch"), string(script), 0o755)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FM_") {
			f.env = append(f.env, kv)
		}
	}
	f.env = append(f.env, "FM_HOME="+h.Dir, "FM_ROOT_OVERRIDE="+h.Root)
	f.extState = h.ExtensionState(extID)
	t.Cleanup(func() { testpkg.Unlock(work) })
	return f
}

func (f *fixture) write(path, data string, mode os.FileMode) {
	f.t.Helper()
	testpkg.WriteFile(f.t, path, data, 0o700, mode)
}

// makePackage writes the fake package at dir.
func makePackage(dir string, adapters ...string) error {
	names := `["` + strings.Join(adapters, `","`) + `"]`
	manifest := fmt.Sprintf(`{"schema":"firstmate.extension-manifest.v1","id":%q,"version":"1.0.0","host_protocols":[1],"entrypoint":"bin/adapter","capabilities":[{"name":"process-event-adapter","versions":[1],"adapter_names":%s}],"required_consents":[]}`, extID, names)
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "firstmate-extension.json"), []byte(manifest), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "bin", "adapter"), adapterScript, 0o755)
}

// bind installs and enables the fake package for adapter "sig" with a 20 s
// invoke timeout (bindTimeout for another), and prepares its state directory.
func (f *fixture) bind() *binding.Binding { return f.bindTimeout(20000) }

func (f *fixture) bindTimeout(ms int64) *binding.Binding {
	f.t.Helper()
	dir := filepath.Join(f.work, "pkg")
	if err := makePackage(dir, "sig"); err != nil {
		f.t.Fatal(err)
	}
	b, err := host.Bind(context.Background(), f.h, host.BindOptions{Dir: dir, Adapters: []string{"sig"}, Trust: true, TimeoutMS: ms})
	if err != nil {
		f.t.Fatal(err)
	}
	f.b = b
	return b
}

// mode sets the fake's behaviour for an operation (poll, classify, terminal,
// silent), optionally for one source.
func (f *fixture) mode(op, mode string) {
	f.write(filepath.Join(f.extState, "mode-"+op), mode, 0o600)
}

// fmCmd returns an fm subprocess command in this fixture's home.
func (f *fixture) fmCmd(args ...string) *exec.Cmd {
	cmd := exec.Command("fm", args...)
	cmd.Env = f.env
	return cmd
}

// fm runs fm to completion and returns stdout, stderr and the exit status.
func (f *fixture) fm(args ...string) (string, string, int) {
	f.t.Helper()
	var out, errb bytes.Buffer
	cmd := f.fmCmd(args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		f.t.Fatalf("fm %v: %v", args, err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// ok runs fm and requires exit 0 and an empty stderr, but for the lines in
// which start reports a captured failure or a failed verdict [RUN-1].
func (f *fixture) ok(args ...string) string {
	f.t.Helper()
	out, errs, code := f.fm(args...)
	if len(args) > 1 && args[0] == "procevent" && args[1] == "start" {
		errs = startReport.ReplaceAllString(errs, "")
	}
	if code != 0 || errs != "" {
		f.t.Fatalf("fm %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// fails runs fm and requires exit 1 with exactly one error line of code and
// nothing on stdout ([CLI-3]).
func (f *fixture) fails(code string, args ...string) string {
	f.t.Helper()
	out, errs, status := f.fm(args...)
	if status != 1 || out != "" || !strings.HasPrefix(errs, "error["+code+"]: ") || strings.Count(errs, "\n") != 1 {
		f.t.Fatalf("fm %s: want error[%s], got exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, status, out, errs)
	}
	return errs
}

// startReport matches the stderr lines of start that report a failure.
var startReport = regexp.MustCompile(`(?m)^(failed|check-failed): .*\n`)

var tokenRe = regexp.MustCompile(`(?m)^owner-token: (sha256:[0-9a-f]{64})$`)

// registerExt registers source id for adapter sig and returns its token.
func (f *fixture) registerExt(id string) string {
	f.t.Helper()
	out := f.ok("procevent", "register-extension", "sig", id, "--config-ref", "ref-"+id)
	m := tokenRe.FindStringSubmatch(out)
	if m == nil {
		f.t.Fatalf("no owner token in %q", out)
	}
	// The fixture's code root has no wrapper: the retire line names the
	// running fm ([REG-2]).
	want := regexp.MustCompile(fmt.Sprintf(`^registered: %s \(sig from %s@1\.0\.0\)\nowner-token: %s\nretire: /\S+ procevent retire %s --if-owner %s\n$`,
		regexp.QuoteMeta(id), regexp.QuoteMeta(extID), m[1], regexp.QuoteMeta(id), m[1]))
	if !want.MatchString(out) {
		f.t.Fatalf("register-extension printed %q, want %s", out, want)
	}
	return m[1]
}

// inbox lists the names in the inbox.
func (f *fixture) inbox() []string {
	f.t.Helper()
	ents, err := os.ReadDir(f.h.Inbox())
	if err != nil && !os.IsNotExist(err) {
		f.t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func (f *fixture) wakes() []wake.Wake {
	f.t.Helper()
	ws, err := wake.List(f.h.State, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	return ws
}

func (f *fixture) read(path string) string {
	f.t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		f.t.Fatal(err)
	}
	return string(data)
}

// log returns the fake's invoke log lines "<op> <source> <request-id>" for op.
func (f *fixture) log(op string) []string {
	data, _ := os.ReadFile(filepath.Join(f.extState, "log"))
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if strings.HasPrefix(l, op+" ") {
			out = append(out, l)
		}
	}
	return out
}

// waitFor polls cond every 20 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// groupGone reports whether no live (non-zombie) process has pgid.
func groupGone(pgid int) bool {
	if syscall.Kill(-pgid, 0) != nil {
		return true
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := procstat.Read(pid); err == nil && st.PGID == pgid && st.State != 'Z' {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool { return slices.Contains(list, s) }

// background starts fm in the background; its output is collected.
func (f *fixture) background(args ...string) (*exec.Cmd, *testpkg.SyncBuffer, *testpkg.SyncBuffer) {
	f.t.Helper()
	cmd := f.fmCmd(args...)
	out, errs := new(testpkg.SyncBuffer), new(testpkg.SyncBuffer)
	cmd.Stdout, cmd.Stderr = out, errs
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, out, errs
}

// stopsOnTerm sends SIGTERM to cmd, a command waiting for a lock, and
// fails unless it exits within 2 s with status 1 and a process-failed error
// on stderr (errs).
func stopsOnTerm(t *testing.T, cmd *exec.Cmd, errs *testpkg.SyncBuffer) {
	t.Helper()
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, cmd, 5*time.Second); code != 1 || !strings.HasPrefix(errs.String(), "error[process-failed]: ") {
		t.Fatalf("after SIGTERM: exit %d %q", code, errs)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("%v took %s to stop", cmd.Args[1:], d)
	}
}

// waitExit waits up to d for cmd to exit and returns its exit status.
func waitExit(t *testing.T, cmd *exec.Cmd, d time.Duration) int {
	t.Helper()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
		return cmd.ProcessState.ExitCode()
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not exit within %s", cmd.Args, d)
		return -1
	}
}
