package reliability

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/powercut"
	"firstmate.dev/fm/internal/testpkg"
)

// The power-loss sweep: every durable path of fm run with its home on a
// powercut file system (internal/powercut), cut before its k-th operation
// for k = 1 .. K+1 (K: the operations of an uncut run; the last point cuts
// after the command finished), rebuilt from what was synced, and checked by
// fm's own recovery (the next command, reconcile) and the invariants of
// docs/reliability.md. FM_POWERCUT_FULL=1 (make powercut) takes every k;
// without it FM_POWERCUT_POINTS-1 points spread evenly over 1..K besides
// the cut after the command finished (default 2, for CI; 1: only that
// one). FM_POWERCUT_MODEL=ordered
// uses the ext4-ordered-like model instead of strict POSIX.

// pcWorld is a world whose home is on a powercut mount.
type pcWorld struct {
	*world
	fs     *powercut.FS
	mnt    string
	work   string
	pkg    string
	token  string // the registration of source s in the seed, if any
	pkgDig string
	bindDg string // the binding's digest in the seed, if any
	cutOps []string
}

// pcPath is one durable path: seed builds the home the command starts from
// (on an uncut mount), args is the command cut at every point, and after
// checks what a cut run r left, after the power came back.
type pcPath struct {
	name  string
	seed  func(w *pcWorld)
	args  func(w *pcWorld) []string
	after func(w *pcWorld, r *run)
}

func TestPowerCut(t *testing.T) {
	if err := powercut.Available(); err != nil {
		t.Skipf("the power-loss sweep needs FUSE: %v", err)
	}
	model := powercut.Strict
	if os.Getenv("FM_POWERCUT_MODEL") == "ordered" {
		model = powercut.Ordered
	}
	full := os.Getenv("FM_POWERCUT_FULL") == "1"
	budget := envInt(t, "FM_POWERCUT_POINTS", 2)
	var total int
	var took, layer time.Duration
	for _, p := range pcPaths() {
		t.Run(p.name, func(t *testing.T) {
			n, d, l := sweep(t, p, model, full, budget)
			total, took, layer = total+n, took+d, layer+l
			t.Logf("powercut %s (%s): %d cut points, 0 violations (%s per point, the cut and remount %s)", p.name, model, n, per(d, n), per(l, n))
		})
	}
	if !t.Failed() {
		t.Logf("powercut total (%s): %d cut points, 0 violations (%s per point, the cut and remount %s)", model, total, per(took, total), per(layer, total))
	}
}

// sweep runs path p cut at every chosen point and returns how many points
// it checked and what they took. The first point is the uncut run, cut
// after the command finished (operation K+1), which counts K; then k = 1,
// 1+stride, ... up to K.
func sweep(t *testing.T, p pcPath, model powercut.Model, full bool, budget int) (n int, took, layer time.Duration) {
	w := newPCWorld(t, p, model)
	start := time.Now()
	point := func(k int) int {
		w.mount(model)
		w.fs.Arm(k)
		r := w.run(p.args(w))
		ops, _ := w.fs.Ops()
		layer += w.cut()
		p.after(w, r)
		w.fs.Close()
		n++
		return ops
	}
	var ks []int
	if only := os.Getenv("FM_POWERCUT_ONLY"); only != "" {
		k, _ := strconv.Atoi(only)
		ks = []int{k}
	} else {
		w.note = fmt.Sprintf("powercut %s (%s): cut after the command finished", p.name, model)
		last := point(1 << 30)
		for i := 1; i <= last; i++ {
			// Without full, budget-1 points spread evenly over 1..K.
			if full || (i*(budget-1))/max(last, 1) != ((i-1)*(budget-1))/max(last, 1) {
				ks = append(ks, i)
			}
		}
	}
	for _, k := range ks {
		w.note = fmt.Sprintf("powercut %s (%s): cut before operation %d", p.name, model, k)
		point(k)
	}
	return n, time.Since(start), layer
}

// newPCWorld builds path p's seed: a home on an uncut mount, set up by
// p.seed and saved as the tree every cut point starts from.
func newPCWorld(t *testing.T, p pcPath, model powercut.Model) *pcWorld {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testpkg.Unlock(base) })
	mnt, work, seed := filepath.Join(base, "mnt"), filepath.Join(base, "work"), filepath.Join(base, "seed")
	for _, d := range []string{mnt, work, seed, filepath.Join(base, "root", "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h := &home.Home{Root: filepath.Join(base, "root"), Dir: filepath.Join(mnt, "home")}
	h.State = filepath.Join(h.Dir, "state")
	w := &pcWorld{world: &world{t: t, base: base, h: h, env: []string{"PATH=" + os.Getenv("PATH"), "FM_HOME=" + h.Dir, "FM_ROOT_OVERRIDE=" + h.Root}}, mnt: mnt, work: work}
	if drop := os.Getenv("FM_POWERCUT_DROP"); drop != "" {
		w.env = append(w.env, "FM_POWERCUT_DROP="+drop) // the mutation proof's fm
	}
	w.pkg = w.makePackage("pkg", fakeID, `["fake"]`)
	f, err := powercut.Mount(mnt, work, "", model)
	if err != nil {
		t.Fatal(err)
	}
	w.fs = f
	f.Trace = os.Getenv("FM_POWERCUT_TRACE") == "1"
	t.Cleanup(func() {
		if w.fs != nil {
			if t.Failed() && w.fs.Trace {
				t.Logf("operations before the last cut: %q", w.cutOps)
			}
			w.fs.Close()
		}
	})
	w.must(os.Mkdir(h.Dir, 0o700))
	w.mode(fakeID, "invoke", "", "echo")
	p.seed(w)
	w.must(f.Save(seed))
	w.must(f.Close())
	return w
}

// mount mounts the seed for one cut point.
func (w *pcWorld) mount(model powercut.Model) {
	w.t.Helper()
	f, err := powercut.Mount(w.mnt, w.work, filepath.Join(w.base, "seed"), model)
	w.must(err)
	w.fs = f
	f.Trace = os.Getenv("FM_POWERCUT_TRACE") == "1"
}

// cut kills whatever of the world still runs and cuts the power; it
// returns what the cut, the rebuild and the remount took.
func (w *pcWorld) cut() time.Duration {
	w.t.Helper()
	w.killStrays()
	_, w.cutOps = w.fs.Ops()
	start := time.Now()
	if err := w.fs.Cut(); err != nil {
		w.failf("cut: %v", err)
	}
	return time.Since(start)
}

// per is d per one of n, rounded to the millisecond.
func per(d time.Duration, n int) time.Duration {
	return (d / time.Duration(max(n, 1))).Round(time.Millisecond)
}

// killStrays kills every process of the world's packages (a cut leaves
// them running, as a power cut would not).
func (w *pcWorld) killStrays() {
	ents, _ := os.ReadDir(filepath.Join(w.h.State, "extensions"))
	for _, e := range ents {
		for _, pid := range testpkg.Processes("FIRSTMATE_EXTENSION_STATE=" + w.fakeState(e.Name())) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// run runs fm in a process group of its own, killed as a group when it
// ends or after a minute (a cut run fails at the cut, with EIO).
func (w *pcWorld) run(args []string) *run {
	w.t.Helper()
	cmd := exec.Command(fmBin, args...)
	cmd.Env = w.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		w.failf("start fm: %v", err)
	}
	timer := time.AfterFunc(time.Minute, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	err := cmd.Wait()
	timer.Stop()
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		w.failf("fm %s: %v", strings.Join(args, " "), err)
	}
	return &run{args: args, stdout: out.String(), stderr: errb.String(), took: time.Since(start), code: cmd.ProcessState.ExitCode()}
}

// invariants checks, after the power came back and fm's recovery ran, what
// docs/reliability.md promises of every home: the registries and the inbox
// load, every result is whole (the output of the poll of its sequence),
// and every wake names a captured result.
func (w *pcWorld) invariants() {
	w.t.Helper()
	w.bindings()
	w.sources()
	present := map[string]bool{}
	for _, res := range w.inbox() {
		present[res.Path] = true
		data, err := os.ReadFile(res.Path)
		if err != nil {
			w.failf("[CAP-1] read %s: %v", res.Path, err)
		}
		if want := pollContent("event s", "s", res.Sequence, w.token, w.pkgDig); string(data) != want {
			w.failf("[CAP-1] result %s holds %q, want the whole output %q", res.Path, data, want)
		}
	}
	for _, wk := range w.wakes() {
		id, seq, ok := wakeResult(wk.Key)
		if !ok || !present[filepath.Join(w.h.Inbox(), fmt.Sprintf("%s.%d.result", id, seq))] {
			w.failf("[CAP-2] wake %q announces no captured result", wk.Line())
		}
	}
}

// bindSeed binds the fake package and notes its digests.
func (w *pcWorld) bindSeed() {
	w.ok(nil, pcBind(w)...)
	b := w.binding(fakeID)
	w.pkgDig, w.bindDg = b.PackageDigest, b.Digest
}

// registerSeed binds and registers source s.
func (w *pcWorld) registerSeed() {
	w.bindSeed()
	r := w.ok(nil, "procevent", "register-extension", fakeAdapter, "s", "--config-ref", "ref-s")
	w.token = field(r.stdout, "owner-token")
}

// captureAgain is the recovery of every path that may have captured:
// reconcile announces every unhandled result (a result whose runner was cut
// before its wake left its pending marker, which makes it due at once), and
// the next start captures with a sequence above every one present, never
// one reported before.
func (w *pcWorld) captureAgain(reported []string) {
	w.t.Helper()
	for _, p := range reported {
		if _, err := os.Stat(p); err != nil {
			w.failf("[CAP-1] %s was reported captured and is gone after the cut: %v", p, err)
		}
	}
	w.ok(nil, "procevent", "reconcile")
	w.invariants()
	announced := map[string]bool{}
	for _, wk := range w.wakes() {
		announced[wk.Key] = true
	}
	above := int64(0)
	for _, res := range w.inbox() {
		above = max(above, res.Sequence)
		if key := fmt.Sprintf("procevent:s:%d", res.Sequence); !res.Handled && !announced[key] {
			w.failf("[CAP-2] unhandled result %s has no wake after reconcile", res.Path)
		}
	}
	r := w.ok(nil, "procevent", "start", "s")
	want := filepath.Join(w.h.Inbox(), fmt.Sprintf("s.%d.result", above+1))
	if got := field(r.stdout, "captured"); got != want || slices.Contains(reported, got) {
		w.failf("[RID-1] the next start captured %q, want %q (the sequence after every one present, never one reported before)", got, want)
	}
	w.invariants()
}

// captured lists the "captured: <path>" lines of r.
func captured(r *run) []string {
	var out []string
	for _, l := range strings.Split(r.stdout, "\n") {
		if p, ok := strings.CutPrefix(l, "captured: "); ok {
			out = append(out, p)
		}
	}
	return out
}

// pcBind is the bind of the fake package. Its 30 s poll timeout is far
// above an echo poll's duration on a loaded machine, so a poll never ends
// in timeout evidence, which is not the output the checks expect.
func pcBind(w *pcWorld) []string {
	return []string{"extension", "bind", w.pkg, "--adapter", fakeAdapter, "--trust-same-user-code", "--timeout-ms", "30000"}
}

func pcPaths() []pcPath {
	bind := pcBind
	return []pcPath{
		{name: "capture", seed: (*pcWorld).registerSeed,
			args: func(*pcWorld) []string { return []string{"procevent", "start", "s"} },
			after: func(w *pcWorld, r *run) {
				w.invariants()
				w.captureAgain(captured(r))
			}},
		{name: "bind", seed: func(*pcWorld) {},
			args: bind,
			after: func(w *pcWorld, r *run) {
				printed := field(r.stdout, "binding-digest")
				if b := w.binding(fakeID); printed != "" && (b == nil || b.Digest != printed) {
					w.failf("[BIND-6] bind printed binding %s, and after the cut the registry holds %+v", printed, b)
				}
				w.okOr(nil, []string{"binding-exists"}, bind(w)...)
				b := w.binding(fakeID)
				if b == nil {
					w.failf("[BIND-6] no binding after the next bind")
				}
				w.pkgDig = b.PackageDigest
				// The installed copy must be whole: the package runs.
				rr := w.ok(nil, "procevent", "register-extension", fakeAdapter, "s", "--config-ref", "ref-s")
				w.token = field(rr.stdout, "owner-token")
				w.captureAgain(nil)
			}},
		{name: "register-extension", seed: (*pcWorld).bindSeed,
			args: func(*pcWorld) []string {
				return []string{"procevent", "register-extension", fakeAdapter, "s", "--config-ref", "ref-s"}
			},
			after: func(w *pcWorld, r *run) {
				printed := field(r.stdout, "owner-token")
				now := ""
				for _, s := range w.sources() {
					if s.SourceID == "s" {
						now = s.Token
					}
				}
				if printed != "" && now != printed {
					w.failf("[REG-2] register printed generation %s, and after the cut %q is registered", printed, now)
				}
				rr := w.ok(nil, "procevent", "register-extension", fakeAdapter, "s", "--config-ref", "ref-s")
				w.token = field(rr.stdout, "owner-token")
				w.captureAgain(nil)
			}},
		{name: "retire-binding", seed: (*pcWorld).bindSeed,
			args: func(w *pcWorld) []string {
				return []string{"extension", "retire-binding", fakeID, "--if-binding-digest", w.bindDg}
			},
			after: func(w *pcWorld, r *run) {
				kept := filepath.Join(w.h.RetiredBindings(), fakeID, binding.Hex(w.bindDg)+".json")
				_, err := os.Stat(kept)
				retained := err == nil
				switch now := w.binding(fakeID); {
				case now != nil && now.Digest != w.bindDg:
					w.failf("[LIFE-2] the enabled binding changed to %s", now.Digest)
				case now != nil && r.code == 0:
					w.failf("[LIFE-2] retire-binding succeeded, and after the cut the binding is enabled")
				case now == nil && !retained:
					w.failf("[LIFE-2] binding %s is neither enabled nor retained at %s", w.bindDg, kept)
				}
				w.okOr(nil, []string{"binding-missing"}, "extension", "retire-binding", fakeID, "--if-binding-digest", w.bindDg)
				if _, err := os.Stat(kept); w.binding(fakeID) != nil || err != nil {
					w.failf("[LIFE-2] after the next retire-binding the binding is enabled or not retained at %s", kept)
				}
			}},
		{name: "handled", seed: func(w *pcWorld) {
			w.registerSeed()
			w.ok(nil, "procevent", "start", "s")
		},
			args: func(*pcWorld) []string { return []string{"procevent", "handled", "s", "1"} },
			after: func(w *pcWorld, r *run) {
				handled := func() bool {
					for _, res := range w.inbox() {
						if res.Sequence == 1 {
							return res.Handled
						}
					}
					w.failf("[CAP-1] result s.1, captured before the cut, is gone")
					return false
				}
				if r.code == 0 && !handled() {
					w.failf("[CAP-3] handled printed %q, and after the cut s.1 is unhandled", strings.TrimSpace(r.stdout))
				}
				w.ok(nil, "procevent", "handled", "s", "1")
				if !handled() {
					w.failf("[CAP-3] s.1 is unhandled after the next handled")
				}
				w.captureAgain(nil)
			}},
		{name: "retire", seed: (*pcWorld).registerSeed,
			args: func(w *pcWorld) []string { return []string{"procevent", "retire", "s", "--if-owner", w.token} },
			after: func(w *pcWorld, r *run) {
				if r.code == 0 && len(w.sources()) != 0 {
					w.failf("[REG-4] retire succeeded, and after the cut s is registered")
				}
				w.ok(nil, "procevent", "retire", "s", "--if-owner", w.token)
				if len(w.sources()) != 0 {
					w.failf("[REG-4] s is registered after the next retire")
				}
				w.invariants()
			}},
	}
}

// TestPowerCutMutations is the sweep's mutation proof: fm built with the
// powercut_mutate tag, with one fsync call site of the durable-file layer
// left out (FM_POWERCUT_DROP, fsutil.SyncSites), must make the sweep report
// a violation, for every site. Each site runs the sweep (this test binary,
// TestPowerCut, stopping at its first failure) with one cut point per
// path, after the command finished: a left-out sync loses what the
// command made, so that point shows it.
func TestPowerCutMutations(t *testing.T) {
	if err := powercut.Available(); err != nil {
		t.Skipf("the power-loss sweep needs FUSE: %v", err)
	}
	if os.Getenv("FM_POWERCUT_DROP") != "" {
		t.Skip("inside a mutation run")
	}
	bin := filepath.Join(t.TempDir(), "fm")
	if out, err := exec.Command("go", "build", "-tags", "powercut_mutate", "-o", bin, "firstmate.dev/fm/cmd/fm").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags powercut_mutate: %v\n%s", err, out)
	}
	for _, site := range fsutil.SyncSites() {
		t.Run(site, func(t *testing.T) {
			if reason := unswept(site); reason != "" {
				t.Skipf("no swept path reaches fsync site %q: %s", site, reason)
			}
			cmd := exec.Command(os.Args[0], "-test.run", "^TestPowerCut$", "-test.failfast", "-test.v")
			cmd.Env = append(os.Environ(), "FM_TEST_BIN="+bin, "FM_POWERCUT_DROP="+site, "FM_POWERCUT_POINTS=1", "FM_POWERCUT_FULL=")
			out, err := cmd.CombinedOutput()
			i := bytes.Index(out, []byte("): cut "))
			if err == nil || i < 0 {
				t.Fatalf("with the fsync at site %q left out, the sweep reported no violation (%v):\n%s", site, err, out[max(0, len(out)-3000):])
			}
			line, _, _ := bytes.Cut(out[bytes.LastIndexByte(out[:i], '\n')+1:], []byte("\n"))
			t.Logf("site %s: %s", site, bytes.TrimSpace(line))
		})
	}
}

// unswept says why no path of the sweep reaches fsync site site yet, or "".
func unswept(site string) string {
	if site == "publish-temp-dir" {
		return "only fm home import writes with NewOptions.Final, and home import is not a swept path yet"
	}
	return ""
}
