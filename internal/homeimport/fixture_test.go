package homeimport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/testpkg"
)

// fmBin is the fm binary the tests run: $FM_TEST_BIN when set, else one
// built by TestMain.
var fmBin string

// killEnv makes the test binary a child that runs the import of the home in
// its environment and SIGKILLs itself right after the import's n-th durable
// change (crashPoint); it prints "completed" when the import ended first.
const killEnv = "FM_IMPORT_TEST_KILL_AT"

func TestMain(m *testing.M) {
	if n := os.Getenv(killEnv); n != "" {
		os.Exit(killChild(n))
	}
	if fmBin = os.Getenv("FM_TEST_BIN"); fmBin != "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "fm-homeimport-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmBin = filepath.Join(dir, "fm")
	if out, err := exec.Command("go", "build", "-o", fmBin, "firstmate.dev/fm/cmd/fm").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build fm: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func killChild(at string) int {
	n, err := strconv.Atoi(at)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	seen := 0
	crashPoint = func() {
		if seen++; seen == n {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	h, err := home.Resolve()
	if err == nil {
		_, err = Import(context.Background(), h, false)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	fmt.Println("completed")
	return 0
}

// Identities of the fixture.
const (
	fakeID    = "org.example.fake"
	xferID    = "org.example.xfer"
	builtinSh = "#!/bin/sh\ncase $1 in classify) echo web-signal ;; *) echo false ;; esac\n"
)

// fixture is one home in the earlier implementation's format, written from
// the facts of reference-home.md: a real bound package (fake) and a real
// received transfer (xfer) whose receipt is rewritten in the earlier schema,
// built-in and extension registrations (one of them of a binding no longer
// enabled), handled and unhandled results of both kinds, a 0644 wake queue
// with repeated keys, its counter, lock and watcher markers, and runtime
// files of dead processes.
type fixture struct {
	t                    *testing.T
	base, claims         string
	h                    *home.Home
	env                  []string
	fake, xfer           *binding.Binding
	transferDigest       string
	mailToken, oldToken  string
	results              map[string][]byte // inbox name -> captured bytes
	legacySource         map[string][]byte // source id -> its text record
	legacyReceipt, queue []byte
}

// stateOutside, passed to newFixture, puts the state root outside the home
// (FM_STATE_OVERRIDE).
type stateOutside bool

func newFixture(t *testing.T, outside ...stateOutside) *fixture {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testpkg.Unlock(base) })
	f := &fixture{t: t, base: base, claims: filepath.Join(base, "claims")}
	f.h = &home.Home{Root: filepath.Join(base, "root"), Dir: filepath.Join(base, "home")}
	f.h.State = filepath.Join(f.h.Dir, "state")
	for _, d := range []string{f.h.Dir, filepath.Join(f.h.Root, "bin"), f.claims} {
		f.must(os.MkdirAll(d, 0o700))
	}
	f.must(os.WriteFile(filepath.Join(f.h.Root, "bin", "fm-procevent-web.sh"), []byte(builtinSh), 0o755))
	f.env = []string{"PATH=" + os.Getenv("PATH"), "FM_HOME=" + f.h.Dir, "FM_ROOT_OVERRIDE=" + f.h.Root,
		"HOME=" + base, "FM_PROCEVENT_CLAIM_ROOT=" + f.claims}
	if len(outside) > 0 && bool(outside[0]) {
		f.h.State = filepath.Join(base, "state-elsewhere")
		f.env = append(f.env, "FM_STATE_OVERRIDE="+f.h.State)
	}

	// The parts that are already fm's: a binding and a received transfer.
	pkg := filepath.Join(base, "pkg-fake")
	f.must(testpkg.Make(pkg, fakeID, `["fake"]`, `[]`))
	f.fm(0, "extension", "bind", pkg, "--adapter", "fake", "--trust-same-user-code")
	xpkg := filepath.Join(base, "pkg-xfer")
	f.must(testpkg.Make(xpkg, xferID, `["xfer"]`, `[]`))
	env := f.fm(0, "extension", "pack-transfer", xpkg)
	f.fmIn(env, 0, "extension", "receive-transfer-bind", "--adapter", "xfer", "--trust-same-user-code")
	bs, err := binding.Load(f.h)
	f.must(err)
	f.fake, _ = binding.Find(bs, fakeID)
	f.xfer, _ = binding.Find(bs, xferID)
	if f.fake == nil || f.xfer == nil {
		t.Fatal("bind or receive did not enable the bindings")
	}
	f.must(testpkg.SetMode(f.h.ExtensionState(fakeID), "invoke", "keep"))
	f.writeReceipt()

	// The parts that differ, exactly as reference-home.md describes them.
	state, reg, inbox := f.h.State, f.h.Registrations(), f.h.Inbox()
	f.must(os.MkdirAll(reg, 0o755))
	f.must(os.MkdirAll(inbox, 0o700))
	f.must(os.Chmod(state, 0o755))
	f.must(os.Chmod(reg, 0o755))
	f.mailToken, f.oldToken = token("mail"), token("old")
	f.legacySource = map[string][]byte{
		"web":  []byte("adapter=web\nargc=2\nargv:\n/bin/true\nsecond arg with spaces\n"),
		"mail": extensionSource("fake", f.fake.ExtensionID, f.fake.ExtensionVersion, f.fake.PackageDigest, f.fake.Digest, "inbox-1", f.mailToken),
		"old":  extensionSource("fake", f.fake.ExtensionID, "0.9.0", f.fake.PackageDigest, token("gone binding"), "inbox-0", f.oldToken),
	}
	for id, data := range f.legacySource {
		f.write(filepath.Join(reg, id+".source"), data, 0o600)
	}
	dead := deadPID(t)
	f.write(filepath.Join(reg, "web.runner"), []byte(strconv.Itoa(dead)+"\n"), 0o600)
	f.write(filepath.Join(reg, ".mail."+strings.Repeat("c", 16)+".output"), []byte("partial poll output\n"), 0o600)
	f.write(filepath.Join(reg, "mail.2049-77.last-launch"), nil, 0o600)
	f.write(filepath.Join(reg, ".owner-lease"), []byte(strconv.Itoa(dead)+"\n"), 0o600)
	owner := filepath.Join(reg, ".lifecycle-owner.1")
	f.must(os.Mkdir(owner, 0o700))
	f.write(filepath.Join(owner, "pid"), []byte(strconv.Itoa(dead)+"\n"), 0o600)
	f.must(os.Symlink(".lifecycle-owner.1", filepath.Join(reg, lifecycleLockName)))

	f.results = map[string][]byte{
		"web.1.result":  []byte("first built-in result\n"),
		"web.2.result":  []byte("second built-in result\x00 with a NUL\n"),
		"mail.1.result": []byte("handled extension result\n"),
		"mail.3.result": []byte("unhandled extension result, sequence 2 was deleted\n"),
	}
	for n, data := range f.results {
		f.write(filepath.Join(inbox, n), data, 0o600)
	}
	f.must(os.Chmod(filepath.Join(inbox, "web.2.result"), 0o644))
	ext := extensionOwner(f.fake)
	for n, data := range map[string][]byte{
		"web.1.adapter": []byte("web\n"), "web.1.handled": nil, "web.2.adapter": []byte("web\n"),
		"mail.1.adapter": []byte("fake\n"), "mail.1.extension": ext, "mail.1.handled": nil,
		"mail.1.generation": []byte("schema=fm-procevent-capture-generation.v1\nregistration_generation=" + token("gen") + "\n"),
		"mail.3.adapter":    []byte("fake\n"), "mail.3.extension": ext,
	} {
		f.write(filepath.Join(inbox, n), data, 0o600)
	}
	old := time.Unix(1700000000, 0)
	for n := range f.results {
		f.must(os.Chtimes(filepath.Join(inbox, n), old, old))
	}

	var q bytes.Buffer
	for i, k := range []string{"web:1", "web:1", "mail:1", "mail:3", "mail:3"} {
		id, seq, _ := strings.Cut(k, ":")
		adapter := map[string]string{"web": "web", "mail": "fake"}[id]
		fmt.Fprintf(&q, "%d\t%d\tcheck\tprocevent:%s\tcheck: procevent %s %s %s\n", 1700000000+i, i+1, k, adapter, id, seq)
	}
	f.queue = q.Bytes()
	f.write(f.h.WakeQueue(), f.queue, 0o644)
	f.write(filepath.Join(state, ".wake-queue.seq"), []byte("7\n"), 0o600)
	f.write(filepath.Join(state, ".wake-queue.lock"), nil, 0o600)
	f.write(filepath.Join(state, ".seen-procevent-"+hex.EncodeToString([]byte("procevent:web:1"))), nil, 0o600)
	return f
}

// writeReceipt rewrites the received unit's receipt in the earlier schema:
// pretty JSON with exactly its five members.
func (f *fixture) writeReceipt() {
	units, err := filepath.Glob(filepath.Join(f.h.Staging(), xferID, "1.0.0", "*"))
	f.must(err)
	if len(units) != 1 {
		f.t.Fatalf("staged units: %v", units)
	}
	f.transferDigest = "sha256:" + filepath.Base(units[0])
	f.legacyReceipt = fmt.Appendf(nil, "{\n  \"extension_id\": %q,\n  \"extension_version\": \"1.0.0\",\n  \"package_digest\": %q,\n  \"schema\": \"firstmate.extension-package-transfer-manifest.v1\",\n  \"transfer_digest\": %q\n}\n",
		xferID, f.xfer.PackageDigest, f.transferDigest)
	f.write(filepath.Join(units[0], "receipt.json"), f.legacyReceipt, 0o600)
}

func (f *fixture) unit() string {
	return filepath.Join(f.h.Staging(), xferID, "1.0.0", strings.TrimPrefix(f.transferDigest, "sha256:"))
}

func extensionSource(adapter, id, version, pkg, bind, ref, tok string) []byte {
	return fmt.Appendf(nil, "adapter=%s\nowner=extension\nextension_schema=fm-procevent-extension-owner.v1\nextension_id=%s\nextension_version=%s\ncapability_version=1\npackage_digest=%s\nbinding_digest=%s\nconfig_ref=%s\nregistration_token=%s\nargc=0\nargv:\n",
		adapter, id, version, pkg, bind, ref, tok)
}

func extensionOwner(b *binding.Binding) []byte {
	return fmt.Appendf(nil, "schema=fm-procevent-extension-owner.v1\nextension_id=%s\nextension_version=%s\ncapability_version=1\npackage_digest=%s\nbinding_digest=%s\n",
		b.ExtensionID, b.ExtensionVersion, b.PackageDigest, b.Digest)
}

func token(seed string) string {
	s := sha256.Sum256([]byte(seed))
	return "sha256:" + hex.EncodeToString(s[:])
}

// deadPID is the pid of a process that ran and was reaped.
func deadPID(t *testing.T) int {
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	return c.Process.Pid
}

// live starts a real process (sleep) for the test's life and returns its
// pid.
func live(t *testing.T) int {
	c := exec.Command("sleep", "300")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	return c.Process.Pid
}

func (f *fixture) must(err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) write(path string, data []byte, mode os.FileMode) {
	f.t.Helper()
	f.must(os.WriteFile(path, data, mode))
	f.must(os.Chmod(path, mode))
}

// run runs fm with stdin and returns stdout, stderr and the exit status.
func (f *fixture) run(stdin string, args ...string) (string, string, int) {
	f.t.Helper()
	c := exec.Command(fmBin, args...)
	c.Env, c.Stdin = f.env, strings.NewReader(stdin)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		f.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// fm runs fm and requires exit status want; it returns stdout.
func (f *fixture) fm(want int, args ...string) string { f.t.Helper(); return f.fmIn("", want, args...) }

func (f *fixture) fmIn(stdin string, want int, args ...string) string {
	f.t.Helper()
	out, errs, code := f.run(stdin, args...)
	if code != want {
		f.t.Fatalf("fm %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out, errs)
	}
	return out
}

// refused runs fm and requires the one error line of code.
func (f *fixture) refused(code string, args ...string) string {
	f.t.Helper()
	out, errs, status := f.run("", args...)
	if status != 1 || out != "" || !strings.HasPrefix(errs, "error["+code+"]: ") || strings.Count(errs, "\n") != 1 {
		f.t.Fatalf("fm %s: exit %d, want error[%s]\nstdout: %s\nstderr: %s", strings.Join(args, " "), status, code, out, errs)
	}
	return errs
}

// importRefused runs fm home import, which must refuse with code in one
// error line naming path, and change nothing at all.
func (f *fixture) importRefused(code, path string) {
	f.t.Helper()
	before := f.snapshot()
	if e := f.refused(code, "home", "import"); !strings.Contains(e, path) {
		f.t.Fatalf("the refusal does not name %s: %s", path, e)
	}
	if d := diff(before, f.snapshot()); d != "" {
		f.t.Fatalf("a refused import changed the home:\n%s", d)
	}
}

// snapshot is every entry below the fixture's base (the claim root and
// packages included): type, mode and content (a link's target). Lock files
// fm creates empty and the run directory's name are normalized, and so is
// the random token fm gives an imported built-in registration.
// lockTag matches the directory part of a lock file's tag (fsutil.Lock).
var lockTag = regexp.MustCompile(`^fm-lock [0-9]+:[0-9]+ `)

func (f *fixture) snapshot() map[string]string {
	f.t.Helper()
	out := map[string]string{}
	f.must(filepath.WalkDir(f.base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(f.base, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if run, ok := strings.CutPrefix(rel, "home/data/imported/"); ok && !strings.HasPrefix(run, ".") {
			_, rest, _ := strings.Cut(run, "/")
			rel = "home/data/imported/<run>/" + rest
		}
		v := fmt.Sprintf("%v", fi.Mode())
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			t, _ := os.Readlink(p)
			v += " -> " + t
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if rel == "home/state/procevent/web.source" {
				data = bytes.Split(data, []byte(`"owner_token"`))[0]
			}
			// A lock file's tag names its directory by inode, which a
			// re-run may have made anew.
			data = lockTag.ReplaceAll(data, []byte("fm-lock <dir> "))
			v += " " + string(data)
		}
		out[rel] = v
		return nil
	}))
	return out
}

// diff describes how two snapshots differ ("" when equal).
func diff(a, b map[string]string) string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var s strings.Builder
	for _, k := range keys {
		if a[k] != b[k] {
			fmt.Fprintf(&s, "%s:\n  %q\n  %q\n", k, a[k], b[k])
		}
	}
	return s.String()
}

// copyAll copies the tree src to dst: modes, file modification times and
// symlinks as they are (directory modes set last, so 0555 ones fill).
func copyAll(src, dst string) error {
	type dirMode struct {
		path string
		mode os.FileMode
	}
	var dirs []dirMode
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(t, to)
		case fi.IsDir():
			dirs = append(dirs, dirMode{to, fi.Mode().Perm()})
			return os.MkdirAll(to, 0o700)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := os.WriteFile(to, data, 0o600); err != nil {
			return err
		}
		if err := os.Chmod(to, fi.Mode().Perm()); err != nil {
			return err
		}
		return os.Chtimes(to, fi.ModTime(), fi.ModTime())
	})
	for i := len(dirs) - 1; err == nil && i >= 0; i-- {
		err = os.Chmod(dirs[i].path, dirs[i].mode)
	}
	return err
}
