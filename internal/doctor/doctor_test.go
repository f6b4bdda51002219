package doctor_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/doctor"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/testpkg"
)

func TestMain(m *testing.M) {
	launch.MaybeBarrier()
	code := m.Run()
	testpkg.RemoveBuiltFM()
	os.Exit(code)
}

// fixture is a throwaway home with the fake package beside it.
type fixture struct {
	t   *testing.T
	h   *home.Home
	pkg string
}

func newFixture(t *testing.T) *fixture {
	h, pkg := testpkg.Home(t)
	return &fixture{t: t, h: h, pkg: pkg}
}

// bind binds the fake package with adapter "fake".
func (f *fixture) bind() *binding.Binding {
	f.t.Helper()
	b, err := host.Bind(context.Background(), f.h, host.BindOptions{Dir: f.pkg, Adapters: []string{"fake"}, Trust: true, TimeoutMS: 30000})
	if err != nil {
		f.t.Fatal(err)
	}
	return b
}

// register registers extension source id of adapter fake.
func (f *fixture) register(id string) {
	f.t.Helper()
	if _, err := procevent.RegisterExtension(context.Background(), f.h, "fake", id, "main"); err != nil {
		f.t.Fatal(err)
	}
}

// mode sets the fake package's behaviour for verb.
func (f *fixture) mode(verb, mode string) {
	f.t.Helper()
	if err := testpkg.SetMode(f.h.ExtensionState("org.example.fake"), verb, mode); err != nil {
		f.t.Fatal(err)
	}
}

// write writes path with exactly mode, its missing parents private.
func (f *fixture) write(path, text string, mode os.FileMode) {
	f.t.Helper()
	testpkg.WriteFile(f.t, path, text, 0o700, mode)
}

func (f *fixture) chmod(path string, mode os.FileMode) {
	f.t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		f.t.Fatal(err)
	}
}

// only runs every check and returns the one finding of check, failing the
// test when there is not exactly one.
func (f *fixture) only(check string) doctor.Finding {
	f.t.Helper()
	var got []doctor.Finding
	for _, x := range doctor.Check(f.h) {
		if x.Check == check {
			got = append(got, x)
		}
	}
	if len(got) != 1 {
		f.t.Fatalf("%d findings of check %q, want 1: %+v", len(got), check, got)
	}
	return got[0]
}

// want checks a finding's status, code and that message and fix hold the
// given texts.
func want(t *testing.T, x doctor.Finding, status doctor.Status, code errcode.Code, message, fix string) {
	t.Helper()
	if x.Status != status || x.Code != code || !strings.Contains(x.Message, message) || !strings.Contains(x.Fix, fix) {
		t.Fatalf("finding %+v\nwant status %q, code %q, message with %q, fix with %q", x, status, code, message, fix)
	}
}

// [HOME-5] [CAP-6] a fresh home: every check passes in the report's order,
// and checking creates nothing.
func TestFreshHome(t *testing.T) {
	f := newFixture(t)
	got := doctor.Check(f.h)
	var checks []string
	full := confine.Probe() >= 6
	for _, x := range got {
		if (x.Status != doctor.OK || x.Code != "") && (full || x.Check != "confinement") {
			t.Errorf("finding %+v in a fresh home", x)
		}
		checks = append(checks, x.Check)
	}
	if s := strings.Join(checks, " "); s != "home state confinement registry invocations sources serve results failing wakes routes" {
		t.Fatalf("checks %q", s)
	}
	if p, w := doctor.Count(got); p != 0 || (w != 0 && full) {
		t.Fatalf("count %d problems %d warnings", p, w)
	}
	want(t, got[1], doctor.OK, "", f.h.State+" does not exist yet", "")
	want(t, got[len(got)-1], doctor.OK, "", "no secondmate routes", "")
	names, err := os.ReadDir(f.h.Dir)
	if err != nil || len(names) != 0 {
		t.Fatalf("the check created %v (%v)", names, err)
	}
}

// [HOME-2] a home that does not resolve is one failure, with the fix.
func TestUnresolvedHome(t *testing.T) {
	t.Setenv("FM_HOME", filepath.Join(t.TempDir(), "missing"))
	t.Setenv("FM_ROOT_OVERRIDE", t.TempDir())
	_, err := home.Resolve()
	if err == nil {
		t.Fatal("a missing home resolved")
	}
	got := doctor.Unresolved(err)
	if len(got) != 1 {
		t.Fatalf("findings %+v", got)
	}
	want(t, got[0], doctor.Fail, errcode.HomeInvalid, "does not exist", "point FM_HOME at an existing directory you own")
	if p, w := doctor.Count(got); p != 1 || w != 0 {
		t.Fatalf("count %d problems %d warnings", p, w)
	}
}

// A group-writable home warns: another user can rename what it
// holds.
func TestWritableHome(t *testing.T) {
	f := newFixture(t)
	f.chmod(f.h.Dir, 0o770)
	want(t, f.only("home"), doctor.Warn, "", "is group- or world-writable (mode 0770)", "chmod go-w "+f.h.Dir)
}

// [HOME-4] what the earlier implementation left fails until fm home import
// converts it.
func TestImportPending(t *testing.T) {
	f := newFixture(t)
	f.write(filepath.Join(f.h.State, ".wake-queue.lock"), "", 0o600)
	want(t, f.only("import"), doctor.Fail, errcode.HomeImportNeeded, "runtime file(s) of the earlier implementation", "fm home import")
}

// [HOME-4] [CAP-6] the state root and every state directory must be
// private: each one that is not is a failure with its own fix.
func TestStateDirectories(t *testing.T) {
	f := newFixture(t)
	f.bind()
	f.register("src")
	want(t, f.only("state"), doctor.OK, "", "are private (0700)", "")
	ext := f.h.ExtensionState("org.example.fake")
	if err := os.MkdirAll(ext, 0o700); err != nil {
		t.Fatal(err)
	}
	f.chmod(ext, 0o750)
	want(t, f.only("state"), doctor.Fail, errcode.ModeUnsafe, `directory "`+ext+`" has mode 0750`, "chmod 700 "+ext)
	f.chmod(ext, 0o700)
	f.chmod(f.h.Inbox(), 0o755)
	f.chmod(f.h.Registrations(), 0o711)
	var fails []string
	for _, x := range doctor.Check(f.h) {
		if x.Check == "state" {
			want(t, x, doctor.Fail, errcode.ModeUnsafe, "", "chmod 700 ")
			fails = append(fails, x.Fix)
		}
	}
	if len(fails) != 2 {
		t.Fatalf("state failures %q, want one per directory", fails)
	}
	f.chmod(f.h.Inbox(), 0o700)
	f.chmod(f.h.Registrations(), 0o700)
	// A symlink in place of a state directory: make it a real directory.
	moved := filepath.Join(f.h.Dir, "elsewhere")
	if err := os.Rename(ext, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(moved, ext); err != nil {
		t.Fatal(err)
	}
	want(t, f.only("state"), doctor.Fail, errcode.Of(home.CheckPrivate(ext, true)), "", "make "+ext+" a real directory (not a symlink)")
}

// [BND-4] a malformed registry fails, pointing at the code's row of the
// troubleshooting table; with it readable, each binding is revalidated.
func TestRegistry(t *testing.T) {
	f := newFixture(t)
	b := f.bind()
	want(t, f.only("registry"), doctor.OK, "", "1 binding(s) in "+f.h.Bindings(), "")
	want(t, f.only("binding"), doctor.OK, "", "org.example.fake@1.0.0: installed package "+b.PackageDigest+" verifies", "")
	f.chmod(b.Path, 0o644)
	want(t, f.only("registry"), doctor.Fail, errcode.ModeUnsafe, "has mode 0644", `see "mode-unsafe" in docs/troubleshooting.md`)
	for _, x := range doctor.Check(f.h) {
		if x.Check == "binding" {
			t.Fatalf("a binding was checked from a refused registry: %+v", x)
		}
	}
}

// [INV-1] a store copy that changed after bind fails its binding, named, with
// how to recover; a missing one says where to bind again from. Nothing runs.
func TestBindingStoreCopy(t *testing.T) {
	f := newFixture(t)
	b := f.bind()
	requests := filepath.Join(f.h.ExtensionState("org.example.fake"), "requests")
	before, err := os.ReadFile(requests)
	if err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(b.PackageRoot, "firstmate-extension.json")
	f.chmod(manifest, 0o644)
	want(t, f.only("binding"), doctor.Fail, errcode.ModeUnsafe, "org.example.fake@1.0.0: installed package", "the store copy changed after bind")
	f.chmod(manifest, 0o444)
	testpkg.Unlock(b.PackageRoot)
	if err := os.RemoveAll(b.PackageRoot); err != nil {
		t.Fatal(err)
	}
	want(t, f.only("binding"), doctor.Fail, errcode.PackageMissing, "org.example.fake@1.0.0", "bind again from "+f.pkg)
	if after, err := os.ReadFile(requests); err != nil || string(after) != string(before) {
		t.Fatalf("the package ran during the checks: %q, then %q (%v)", before, after, err)
	}
}

// [GRP-3] an owner record whose fm was SIGKILLed is stale until cleanup
// proves its group gone.
func TestStaleInvocations(t *testing.T) {
	f := newFixture(t)
	f.bind()
	want(t, f.only("invocations"), doctor.OK, "", "0 live, none stale", "")
	f.mode("invoke", "hang")
	requests := filepath.Join(f.h.ExtensionState("org.example.fake"), "requests")
	cmd := exec.Command(testpkg.FM(t), "extension", "process-event", "fake", "source.poll", "--source-id", "direct", "--config-ref", "main")
	cmd.Env = append(os.Environ(), "FM_HOME="+f.h.Dir, "FM_ROOT_OVERRIDE="+f.h.Root)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { launch.Cleanup(f.h.Invocations(), func(launch.Record) bool { return true }) })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if data, _ := os.ReadFile(requests); strings.Contains(string(data), "source.poll") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the poll did not start")
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	want(t, f.only("invocations"), doctor.Fail, errcode.ProcessCleanupFailed, "belong to an fm that died", "run fm extension cleanup-invocations")
	if _, err := launch.Cleanup(f.h.Invocations(), func(r launch.Record) bool { return !r.HostLive }); err != nil {
		t.Fatal(err)
	}
	want(t, f.only("invocations"), doctor.OK, "", "0 live, none stale", "")
}

// Temps left by killed writers warn, with what removes them; without any
// there is no temps line.
func TestTemps(t *testing.T) {
	f := newFixture(t)
	f.bind()
	for _, x := range doctor.Check(f.h) {
		if x.Check == "temps" {
			t.Fatalf("temps reported with none left: %+v", x)
		}
	}
	temp := filepath.Join(filepath.Dir(f.h.Bindings()), ".tmp-killed")
	f.write(temp, "x", 0o600)
	want(t, f.only("temps"), doctor.Warn, "", "1 temp file(s) or directories left by killed writers, first "+temp, "the next bind")
}

// [REG-2] [RUN-1] sources: registered without serve warns, a running serve
// is seen, unhandled results warn, and an extension source whose binding is
// no longer enabled fails.
func TestSourcesServeResults(t *testing.T) {
	f := newFixture(t)
	b := f.bind()
	want(t, f.only("serve"), doctor.OK, "", "not running (no sources registered)", "")
	f.register("src")
	want(t, f.only("sources"), doctor.OK, "", "1 registered, 0 polling now", "")
	want(t, f.only("serve"), doctor.Warn, "", "nothing polls the 1 registered source(s)", "run fm procevent serve")

	f.mode("invoke", "keep")
	if _, err := procevent.Start(context.Background(), f.h, "src"); err != nil {
		t.Fatal(err)
	}
	want(t, f.only("results"), doctor.Warn, "", "1 of 1 captured result(s) are unhandled", "fm procevent handled <source-id> <seq>")
	if _, err := procevent.MarkHandled(f.h, "src", 1); err != nil {
		t.Fatal(err)
	}
	want(t, f.only("results"), doctor.OK, "", "1 captured, none unhandled", "")

	f.mode("invoke", "no-result")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- procevent.Serve(ctx, f.h, procevent.DefaultServeOptions()) }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st, err := procevent.ReadStatus(f.h); err == nil && st.Serving {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("serve did not start")
		}
	}
	want(t, f.only("serve"), doctor.OK, "", "fm procevent serve is running for this home", "")
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}

	aside := filepath.Join(f.h.Dir, "aside.json")
	if err := os.Rename(b.Path, aside); err != nil {
		t.Fatal(err)
	}
	want(t, f.only("source"), doctor.Fail, errcode.BindingMissing, `source "src" (fake from org.example.fake@1.0.0) is registered with binding `+b.Digest, "fm procevent retire src --if-owner")
}

// [CAP-1] [CAP-3] a source whose sequence cannot advance fails, with what to do.
func TestSequenceExhausted(t *testing.T) {
	f := newFixture(t)
	f.bind()
	f.register("src")
	f.write(filepath.Join(f.h.Registrations(), "src.seq"), "9007199254740992\n", 0o600)
	want(t, f.only("source"), doctor.Fail, errcode.SequenceExhausted, "", "register it under a new source id")
}

// [WAKE-1] lines of the queue that are not wakes warn; a queue that cannot
// be read fails.
func TestWakes(t *testing.T) {
	f := newFixture(t)
	f.write(f.h.WakeQueue(), "1700000000\t1\tprocevent\tprocevent:src:1\tx\nnot a wake\n", 0o600)
	want(t, f.only("wakes"), doctor.Warn, "", "1 line(s) of "+f.h.WakeQueue()+" are not wakes", "fm wake compact drops them")
	f.write(f.h.WakeQueue(), "1700000000\t1\tprocevent\tprocevent:src:1\tx\n", 0o600)
	want(t, f.only("wakes"), doctor.OK, "", "1 queued in "+f.h.WakeQueue(), "")
	f.chmod(f.h.WakeQueue(), 0o644)
	x := f.only("wakes")
	want(t, x, doctor.Fail, errcode.ModeUnsafe, "", `see "mode-unsafe" in docs/troubleshooting.md`)
}

// [XFER-4] the secondmate routes: none, some, or a file that refuses them
// all.
func TestRoutes(t *testing.T) {
	f := newFixture(t)
	want(t, f.only("routes"), doctor.OK, "", "no secondmate routes ("+f.h.Secondmates()+" does not exist)", "")
	f.write(f.h.Secondmates(), `{"sm1":{"home":"/srv/sm1","root":"/opt/fm"}}`, 0o600)
	want(t, f.only("routes"), doctor.OK, "", "1 secondmate route(s) in "+f.h.Secondmates(), "")
	f.write(f.h.Secondmates(), `{"sm1":{"home":"relative","root":"/opt/fm"}}`, 0o600)
	want(t, f.only("routes"), doctor.Fail, errcode.PathUnsafe, "sm1.home", `see "path-unsafe" in docs/troubleshooting.md`)
}
