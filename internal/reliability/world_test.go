package reliability

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/internal/wake"
)

// fmBin is the fm binary every test runs: $FM_TEST_BIN when set
// (scripts/test-unprivileged.sh sets it), else one built by TestMain.
var fmBin string

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	if fmBin = os.Getenv("FM_TEST_BIN"); fmBin != "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "fm-reliability-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	fmBin = filepath.Join(dir, "fm")
	if out, err := exec.Command("go", "build", "-o", fmBin, "firstmate.dev/fm/cmd/fm").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build fm: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// The fake package every world binds: internal/testpkg's entrypoint, whose
// part is chosen by mode files in its state dir.
const (
	fakeID      = "org.example.fake"
	fakeAdapter = "fake"
)

// world is one throwaway home for real fm processes: $base/home (FM_HOME,
// 0700), $base/root (FM_ROOT_OVERRIDE, an empty code root) and packages
// beside them, outside any Git tree.
type world struct {
	t    testing.TB
	base string
	h    *home.Home
	env  []string
	// note prefixes every failure, e.g. the crash seed and kill point.
	note string
}

func newWorld(t testing.TB) *world {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testpkg.Unlock(base) })
	h := &home.Home{Root: filepath.Join(base, "root"), Dir: filepath.Join(base, "home")}
	h.State = filepath.Join(h.Dir, "state")
	for _, d := range []string{h.Dir, filepath.Join(h.Root, "bin")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return &world{t: t, base: base, h: h, env: []string{"PATH=" + os.Getenv("PATH"), "FM_HOME=" + h.Dir, "FM_ROOT_OVERRIDE=" + h.Root}}
}

func (w *world) failf(format string, args ...any) {
	w.t.Helper()
	if w.note != "" {
		format = w.note + ": " + format
	}
	w.t.Fatalf(format, args...)
}

// must fails the test on err.
func (w *world) must(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
}

// fakeState is the state dir (FIRSTMATE_EXTENSION_STATE) of extension id.
func (w *world) fakeState(id string) string { return w.h.ExtensionState(id) }

// mode chooses the fake's part for verb (handshake or invoke) of extension
// id, or for one source when source is not "".
func (w *world) mode(id, verb, source, mode string) {
	w.t.Helper()
	if source != "" {
		verb += "." + source
	}
	if err := testpkg.SetMode(w.fakeState(id), verb, mode); err != nil {
		w.t.Fatal(err)
	}
}

// makePackage writes a fake package at $base/<dir> and returns its path.
func (w *world) makePackage(dir, id, adapters string) string {
	w.t.Helper()
	p := filepath.Join(w.base, dir)
	if err := testpkg.Make(p, id, adapters, `[]`); err != nil {
		w.t.Fatal(err)
	}
	return p
}

// run is one finished fm process.
type run struct {
	args           []string
	stdout, stderr string
	code           int  // exit status; -1 when a signal ended it
	killed         bool // our SIGKILL ended it
	took           time.Duration
	// ended is when the host stopped (the SIGKILL was sent, or its exit
	// was seen), in clock ticks since boot (testpkg.Now): every member of a
	// group it left started before.
	ended uint64
}

var errLine = regexp.MustCompile(`^error\[([a-z-]+)\]: `)

// errCode is the code of the run's error line, or "".
func (r *run) errCode() string {
	if m := errLine.FindStringSubmatch(r.stderr); m != nil {
		return m[1]
	}
	return ""
}

func (r *run) String() string {
	return fmt.Sprintf("fm %s: exit %d after %s\nstdout: %s\nstderr: %s", strings.Join(r.args, " "), r.code, r.took, r.stdout, r.stderr)
}

// fm runs fm with stdin (nil for none) to completion.
func (w *world) fm(stdin []byte, args ...string) *run { return w.fmKill(-1, stdin, args...) }

// fmKill runs fm and, unless delay is negative, sends it SIGKILL after delay
// (only the fm process: its package groups are left behind, as a crash
// leaves them).
func (w *world) fmKill(delay time.Duration, stdin []byte, args ...string) *run {
	w.t.Helper()
	cmd := exec.Command(fmBin, args...)
	cmd.Env = w.env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	if err := cmd.Start(); err != nil {
		w.t.Fatalf("start fm: %v", err)
	}
	var killedAt atomic.Uint64
	if delay >= 0 {
		timer := time.AfterFunc(delay, func() {
			killedAt.Store(testpkg.Now())
			cmd.Process.Signal(syscall.SIGKILL)
		})
		defer timer.Stop()
	}
	err := cmd.Wait()
	r := &run{args: args, stdout: out.String(), stderr: errb.String(), took: time.Since(start), code: cmd.ProcessState.ExitCode(), ended: testpkg.Now()}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		w.failf("fm %s: %v", strings.Join(args, " "), err)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		r.killed, r.ended = true, killedAt.Load()
	}
	return r
}

// ok runs fm and requires exit 0.
func (w *world) ok(stdin []byte, args ...string) *run {
	w.t.Helper()
	r := w.fm(stdin, args...)
	if r.code != 0 {
		w.failf("want exit 0: %s", r)
	}
	return r
}

// okOr runs fm and requires exit 0 or one of the error codes.
func (w *world) okOr(stdin []byte, codes []string, args ...string) *run {
	w.t.Helper()
	r := w.fm(stdin, args...)
	if r.code != 0 && (r.code != 1 || !slices.Contains(codes, r.errCode())) {
		w.failf("want exit 0 or error %v: %s", codes, r)
	}
	return r
}

// field returns the value of the "<name>: " line of out, or "".
func field(out, name string) string {
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, name+": "); ok {
			return v
		}
	}
	return ""
}

// bindings loads the registry as every reader does ([BND-4]): it must load
// (or be absent) after anything, since a half-written or duplicated record
// would refuse the whole registry.
func (w *world) bindings() []*binding.Binding {
	w.t.Helper()
	bs, err := binding.Load(w.h)
	if err != nil {
		w.failf("[BND-4] the registry does not load: %v", err)
	}
	return bs
}

// binding returns the enabled binding of id, or nil.
func (w *world) binding(id string) *binding.Binding {
	w.t.Helper()
	b, _ := binding.Find(w.bindings(), id)
	return b
}

// sources reads every registration; the registry must always be readable.
func (w *world) sources() []*procevent.Registration {
	w.t.Helper()
	rs, err := procevent.Sources(w.h)
	if err != nil {
		w.failf("[REG-2] the source registry does not load: %v", err)
	}
	return rs
}

// inbox reads every captured result with its meta; it must always be
// readable ([CAP-1]: a result never exists without its owner).
func (w *world) inbox() []procevent.Result {
	w.t.Helper()
	rs, err := procevent.Inbox(w.h)
	if err != nil {
		w.failf("[CAP-1] the inbox does not load: %v", err)
	}
	return rs
}

// wakes reads the wake queue; a torn last line is ignored, never an error
// ([WAKE-1]).
func (w *world) wakes() []wake.Wake {
	w.t.Helper()
	ws, err := wake.List(w.h.State, 0)
	if err != nil {
		w.failf("[WAKE-1] the wake queue does not load: %v", err)
	}
	return ws
}

// records lists the owner records; they must always parse ([GRP-1]).
func (w *world) records() []launch.Record {
	w.t.Helper()
	rs, err := launch.List(w.h.Invocations())
	if err != nil {
		w.failf("[GRP-1] the owner records do not load: %v", err)
	}
	return rs
}

// pollContent is what the fake's echo and signal modes answer for the poll
// of source with sequence seq under token: prefix, a space and the request
// id of [RID-1].
func pollContent(prefix, source string, seq int64, token, packageDigest string) string {
	return prefix + " " + protocol.PollRequestID(fakeAdapter, source, seq, token, packageDigest)
}

// cleanedUp is the orphan check after a crash: the next command's cleanup
// (fm extension cleanup-invocations) exits 0 and leaves no record, every
// group that a record named before it is gone, and no process of this world's
// packages is alive ([GRP-3], [GRP-4]). groups are the groups of the records
// read before the cleanup, left by a host that stopped at since (see
// testpkg.GroupAlive). It returns how many records the cleanup resolved.
func (w *world) cleanedUp(groups []int, since uint64) int {
	w.t.Helper()
	r := w.fm(nil, "extension", "cleanup-invocations")
	if r.code != 0 {
		w.failf("[GRP-3] a left-over record is not resolvable: %s", r)
	}
	var n int
	fmt.Sscanf(r.stdout, "cleaned-invocations: %d", &n)
	if rs := w.records(); len(rs) > 0 {
		w.failf("[GRP-3] %d owner records remain after cleanup-invocations: %+v", len(rs), rs[0])
	}
	for _, g := range groups {
		if testpkg.GroupAlive(g, since) {
			w.failf("[GRP-3] process group %d, recorded by a killed host, is alive after cleanup-invocations", g)
		}
	}
	w.noStrays()
	return n
}

// noStrays checks that no live process carries the environment of any
// package state dir of this world. A barrier whose host died before
// releasing it exits by itself (it reads end of file), so stragglers get
// five seconds.
func (w *world) noStrays() {
	w.t.Helper()
	ents, _ := os.ReadDir(filepath.Join(w.h.State, "extensions"))
	deadline := time.Now().Add(5 * time.Second)
	for _, e := range ents {
		kv := "FIRSTMATE_EXTENSION_STATE=" + w.fakeState(e.Name())
		for {
			pids := testpkg.Processes(kv)
			if len(pids) == 0 {
				break
			}
			if time.Now().After(deadline) {
				w.failf("[GRP-3] processes %v of %s are alive after cleanup", pids, e.Name())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// groupsOf returns the process groups the records name.
func groupsOf(rs []launch.Record) []int {
	var out []int
	for _, r := range rs {
		if r.GroupPID != nil {
			out = append(out, *r.GroupPID)
		}
	}
	return out
}
