package adaptertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/pkg/adapter/wire"
	"firstmate.dev/fm/pkg/fmjson"
)

// Home is a throwaway Firstmate home driven through a real fm binary, for
// testing a built adapter package end to end: fm validates and installs the
// package, runs the entrypoint in its own process group with the minimal
// environment and its timeouts, speaks the strict protocol to it, captures
// the results and announces them, exactly as for an operator. Home only runs
// the fm program (os/exec) and reads what it prints, by the one definition
// of its documents that fm itself uses (packages wire and fmjson).
//
// Every method that runs fm, except Run and Refused, fails the test
// (t.Fatalf) when fm exits non-zero, quoting fm's stderr (its error[<code>] line: see the fm
// repository's docs/troubleshooting.md), and when fm's output does not have
// the exact form it documents. The fields may be changed between calls.
type Home struct {
	T testing.TB
	// FM is the absolute path of the fm binary that is run.
	FM string
	// Version is what `fm version` printed, such as "0.1.0".
	Version string
	// Dir is the home, canonical, mode 0700, given to fm as FM_HOME. Its
	// state root is Dir/state (FM_STATE_OVERRIDE is never passed on).
	Dir string
	// CodeRoot is given to fm as FM_ROOT_OVERRIDE. NewHome sets it to an
	// empty private directory, so the home has no built-in adapter (see
	// NewHome). Set it to "" to pass no FM_ROOT_OVERRIDE: fm then uses its
	// own code root, the parent of the directory holding FM, with whatever
	// built-in adapters (bin/fm-procevent-<name>.sh) are installed there.
	CodeRoot string
	// Env holds extra NAME=value entries for fm's environment (FM_SSH_BIN,
	// say). FM_HOME, FM_ROOT_OVERRIDE and FM_STATE_OVERRIDE are ignored.
	Env []string
	// Timeout bounds one fm command (NewHome: 6 minutes, above the
	// 5-minute default invocation timeout of a binding). On expiry fm gets
	// SIGTERM, which makes it stop the package's process group, then
	// SIGKILL 10 seconds later, and the test fails.
	Timeout time.Duration

	base string // private temp directory holding the home, code root and packages
}

// NewHome creates a private home for one test and returns it; t.Cleanup
// removes it. fmPath is the fm binary to run. When it is "", NewHome uses
// $FM_BIN, else the fm found in $PATH, else it skips the test (t.Skip),
// saying how to provide one. A given fm that cannot be run, or that is not
// the Firstmate fm (`fm version` does not print "fm <version>"), fails the
// test.
//
// Everything lives under one t.TempDir(), canonicalized (symlinks resolved,
// as fm requires of package paths):
//
//	<tmp>/home/       the home (FM_HOME), 0700
//	<tmp>/root/bin/   an empty code root (FM_ROOT_OVERRIDE), 0755
//	<tmp>/packages/   the directories Package lays out
//
// fm refuses to bind a package inside a Git work tree, so the temp directory
// must be outside one: when $TMPDIR (os.TempDir) lies in a work tree,
// NewHome fails the test and says so; point TMPDIR elsewhere.
//
// Why an empty code root: without FM_ROOT_OVERRIDE, fm's code root is the
// parent of the directory holding fm, and every bin/fm-procevent-<name>.sh
// there is a built-in adapter whose name no binding may enable
// (adapter-conflict). So whether a test could bind an adapter would depend on
// where the tested fm happens to live (an fm checkout ships the built-in
// file-watch; /tmp/x/fm has /tmp as its code root). With the empty code root
// the result is the same for any fm. Expect, then: no built-in adapters in
// this home (`fm procevent register` of a built-in fails with
// adapter-unbound unless you put a script into CodeRoot/bin), and a real
// operator's fm may own more adapter names than your test sees; pick adapter
// names that no fm built-in uses (run `ls <code root>/bin/fm-procevent-*`),
// or set CodeRoot to "" to test against fm's own code root.
//
// The home is removed after the test even though fm installs packages with
// read-only (0555) directories: the cleanup first gives the owner write
// permission back on every directory under the temp directory. A poll still
// running then (say, of a `procevent serve` the test started with its own
// os/exec and did not stop) is the test's to stop first.
func NewHome(t testing.TB, fmPath string) *Home {
	t.Helper()
	fmPath = findFM(t, fmPath)
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatalf("adaptertest: %v", err)
	}
	t.Cleanup(func() { unlock(base) })
	for d := base; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
			t.Fatalf("adaptertest: the temp directory %s is inside a Git work tree (%s/.git exists), where fm refuses packages; set TMPDIR to a directory outside any work tree", base, d)
		}
		if d == "/" {
			break
		}
	}
	h := &Home{
		T:        t,
		FM:       fmPath,
		Dir:      filepath.Join(base, "home"),
		CodeRoot: filepath.Join(base, "root"),
		Timeout:  6 * time.Minute,
		base:     base,
	}
	if err := os.Mkdir(h.Dir, 0o700); err != nil {
		t.Fatalf("adaptertest: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(h.CodeRoot, "bin"), 0o755); err != nil {
		t.Fatalf("adaptertest: %v", err)
	}
	for _, d := range []string{h.Dir, h.CodeRoot, filepath.Join(h.CodeRoot, "bin")} {
		mode := os.FileMode(0o755)
		if d == h.Dir {
			mode = 0o700
		}
		if err := os.Chmod(d, mode); err != nil { // whatever the umask
			t.Fatalf("adaptertest: %v", err)
		}
	}
	stdout, stderr, code := h.Run("version")
	v, ok := strings.CutPrefix(stdout, "fm ")
	v, nl := strings.CutSuffix(v, "\n")
	if code != 0 || !ok || !nl || v == "" || strings.ContainsAny(v, " \n") {
		t.Fatalf("adaptertest: %s is not the Firstmate fm: `%s version` exited %d with %q (stderr %q); set FM_BIN or pass the path of the fm binary",
			fmPath, fmPath, code, stdout, stderr)
	}
	h.Version = v
	return h
}

// findFM resolves the fm binary for NewHome.
func findFM(t testing.TB, fmPath string) string {
	t.Helper()
	what := "the fm binary"
	if fmPath == "" {
		if fmPath = os.Getenv("FM_BIN"); fmPath != "" {
			what = "$FM_BIN"
		} else if p, err := exec.LookPath("fm"); err == nil {
			fmPath, what = p, "the fm in $PATH"
		} else {
			t.Skip("adaptertest: no fm binary to test against: set FM_BIN to the path of fm (go build -o /some/dir/fm firstmate.dev/fm/cmd/fm), put fm in PATH, or pass its path to NewHome")
		}
	}
	abs, err := filepath.Abs(fmPath)
	if err == nil {
		var fi os.FileInfo
		if fi, err = os.Stat(abs); err == nil && (fi.IsDir() || fi.Mode().Perm()&0o111 == 0) {
			err = errors.New("not an executable file")
		}
	}
	if err != nil {
		t.Fatalf("adaptertest: %s %q: %v", what, fmPath, err)
	}
	return abs
}

// unlock gives the owner full permission on every directory under dir, so
// that it can be removed after fm installed read-only (0555) directories in
// it.
func unlock(dir string) {
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			if fi, err := d.Info(); err == nil {
				os.Chmod(p, fi.Mode().Perm()|0o700)
			}
		}
		return nil
	})
}

// environ is fm's environment: the test's, without the three variables that
// choose a home, plus FM_HOME, FM_ROOT_OVERRIDE (unless CodeRoot is "") and
// h.Env.
func (h *Home) environ() []string {
	drop := func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return name == "FM_HOME" || name == "FM_ROOT_OVERRIDE" || name == "FM_STATE_OVERRIDE"
	}
	env := slices.DeleteFunc(os.Environ(), drop)
	env = append(env, slices.DeleteFunc(slices.Clone(h.Env), drop)...)
	env = append(env, "FM_HOME="+h.Dir)
	if h.CodeRoot != "" {
		env = append(env, "FM_ROOT_OVERRIDE="+h.CodeRoot)
	}
	return env
}

// Run runs fm with args in the home and returns its stdout, stderr and exit
// status, without judging them; stdin is empty. It fails the test only when
// fm cannot be started or outlives h.Timeout. A status of -1 means fm was
// killed by a signal.
//
//	stdout, stderr, code := h.Run("extension", "verify")
func (h *Home) Run(args ...string) (stdout, stderr string, code int) {
	h.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout())
	defer cancel()
	cmd := exec.CommandContext(ctx, h.FM, args...)
	cmd.Env = h.environ()
	cmd.Dir = h.Dir
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		h.T.Fatalf("adaptertest: %s did not finish within %v\nstderr: %s", h.command(args), h.timeout(), errb.Bytes())
	}
	if err != nil && cmd.ProcessState == nil {
		h.T.Fatalf("adaptertest: %s: %v", h.command(args), err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

func (h *Home) timeout() time.Duration {
	if h.Timeout <= 0 {
		return 6 * time.Minute
	}
	return h.Timeout
}

// command spells a command line for messages.
func (h *Home) command(args []string) string {
	var b strings.Builder
	b.WriteString("fm")
	for _, a := range args {
		b.WriteByte(' ')
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\$`*?[]{}()<>|&;#~") {
			a = strconv.Quote(a)
		}
		b.WriteString(a)
	}
	return b.String()
}

// must runs fm and returns its stdout, failing the test on a non-zero exit.
func (h *Home) must(args ...string) string {
	h.T.Helper()
	stdout, stderr, code := h.Run(args...)
	if code != 0 {
		h.T.Fatalf("adaptertest: %s: exit status %d\nstderr: %s", h.command(args), code, strings.TrimSuffix(stderr, "\n"))
	}
	return stdout
}

// fail fails the test on output of fm that breaks its documented form.
func (h *Home) fail(args []string, stdout string, format string, a ...any) {
	h.T.Helper()
	h.T.Fatalf("adaptertest: %s: %s\nstdout: %q", h.command(args), fmt.Sprintf(format, a...), stdout)
}

// lines splits stdout into its lines: each one non-empty and ended by "\n".
func lines(stdout string) ([]string, bool) {
	body, ok := strings.CutSuffix(stdout, "\n")
	if !ok || body == "" {
		return nil, false
	}
	ls := strings.Split(body, "\n")
	return ls, !slices.Contains(ls, "")
}

// Refused runs fm with args, expecting a refusal, and returns its error code
// and message: exit status 1 with nothing on stdout and exactly one line
// "error[<code>]: <message>" on stderr, or exit status 2 with a first line
// "error[usage]: <message>" (then the usage). Anything else, a success
// included, fails the test.
//
//	if code, _ := h.Refused("procevent", "start", "gone"); code != "source-missing" { ... }
func (h *Home) Refused(args ...string) (code, message string) {
	h.T.Helper()
	stdout, stderr, status := h.Run(args...)
	if status != 1 && status != 2 {
		h.T.Fatalf("adaptertest: %s: exit status %d, want a refusal (1 or 2)\nstdout: %q\nstderr: %q", h.command(args), status, stdout, stderr)
	}
	first, rest, _ := strings.Cut(stderr, "\n")
	m := errorLine.FindStringSubmatch(first)
	if stdout != "" || m == nil || (status == 1 && rest != "") || (status == 2 && m[1] != "usage") {
		h.T.Fatalf("adaptertest: %s: exit status %d without the one error[<code>] line fm documents\nstdout: %q\nstderr: %q", h.command(args), status, stdout, stderr)
	}
	return m[1], m[2]
}

var errorLine = regexp.MustCompile(`^error\[([a-z0-9]+(?:-[a-z0-9]+)*)\]: (.+)$`)

// File is one file of a package laid out by Package: its contents are Data,
// or, when Data is nil, those of the file named by From.
type File struct {
	Data []byte
	From string
	// Exec gives the file mode 0755 (the entrypoint, say) instead of 0644.
	Exec bool
}

// Package lays out a package directory called name in a fresh directory
// outside the home and outside any Git work tree, and returns its absolute,
// canonical path, ready for Bind. files maps slash-separated relative paths
// ("firstmate-extension.json", "bin/firstmate-extension") to their contents.
// Directories get mode 0755 and files 0644, or 0755 with Exec, whatever the
// umask: fm refuses group- or world-writable entries, links and special
// files, so Package writes none.
//
// A package directory is read by bind only: fm copies it into the home's
// store and runs the copy. Lay out a new one for each version you bind.
func (h *Home) Package(name string, files map[string]File) string {
	h.T.Helper()
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		h.T.Fatalf("adaptertest: package name %q must be one path element", name)
	}
	parent := filepath.Join(h.base, "packages")
	if err := os.MkdirAll(parent, 0o700); err != nil {
		h.T.Fatalf("adaptertest: %v", err)
	}
	holder, err := os.MkdirTemp(parent, "")
	if err != nil {
		h.T.Fatalf("adaptertest: %v", err)
	}
	dir := filepath.Join(holder, name)
	mkdir := func(d string) {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			h.T.Fatalf("adaptertest: %v", err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			h.T.Fatalf("adaptertest: %v", err)
		}
	}
	mkdir(dir)
	for _, rel := range slices.Sorted(mapKeys(files)) {
		f := files[rel]
		if rel == "" || path.IsAbs(rel) || path.Clean(rel) != rel || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
			h.T.Fatalf("adaptertest: package file %q: give a clean relative slash-separated path", rel)
		}
		d := dir
		parts := strings.Split(rel, "/")
		for _, p := range parts[:len(parts)-1] {
			d = filepath.Join(d, p)
			mkdir(d)
		}
		data := f.Data
		if data == nil {
			if f.From == "" {
				h.T.Fatalf("adaptertest: package file %q has neither Data nor From", rel)
			}
			if data, err = os.ReadFile(f.From); err != nil {
				h.T.Fatalf("adaptertest: package file %q: %v", rel, err)
			}
		}
		mode := os.FileMode(0o644)
		if f.Exec {
			mode = 0o755
		}
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.WriteFile(p, data, mode); err != nil {
			h.T.Fatalf("adaptertest: %v", err)
		}
		if err := os.Chmod(p, mode); err != nil {
			h.T.Fatalf("adaptertest: %v", err)
		}
	}
	return dir
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// EntrypointPackage lays out the usual package of a compiled adapter: the
// manifest read from manifestPath as firstmate-extension.json and the
// executable entrypoint (a binary you built, or the test binary itself, see
// below) at the manifest's entrypoint path, mode 0755. The manifest must
// validate (wire.DecodeManifest). The directory is named after the
// manifest's id. It returns the package directory, as Package does.
//
// A test can bind its own test binary as the entrypoint, so that nothing is
// built: copy os.Executable() and have TestMain serve when it is run under
// the entrypoint's name, as the host runs it with argv
// [<package>/bin/firstmate-extension, verb]:
//
//	func TestMain(m *testing.M) {
//		if filepath.Base(os.Args[0]) == "firstmate-extension" {
//			adapter.Serve(myadapter.New())
//			return
//		}
//		os.Exit(m.Run())
//	}
//
//	exe, _ := os.Executable()
//	pkg := h.EntrypointPackage("firstmate-extension.json", exe)
func (h *Home) EntrypointPackage(manifestPath, entrypoint string) string {
	h.T.Helper()
	data, err := os.ReadFile(manifestPath)
	if err != nil {
		h.T.Fatalf("adaptertest: %v", err)
	}
	m, err := wire.DecodeManifest(data)
	if err != nil {
		h.T.Fatalf("adaptertest: %s: %v", manifestPath, err)
	}
	return h.Package(m.ID, map[string]File{
		wire.ManifestFile: {Data: data},
		m.Entrypoint:      {From: entrypoint, Exec: true},
	})
}

// Binding is what `fm extension bind` printed.
type Binding struct {
	ExtensionID      string
	ExtensionVersion string
	// Path is the binding file, <home>/config/extensions.d/<id>.json.
	Path string
	// Digest is the binding digest: retire-binding needs it.
	Digest string
	// PackageRoot is the installed copy in the home's store, the directory
	// the entrypoint runs in.
	PackageRoot   string
	PackageDigest string
	// Capability is the verified capability, "process-event-adapter/1".
	Capability string
	// Adapters are the enabled adapter names, as fm listed them.
	Adapters []string
}

// Bind runs `fm extension bind <pkgDir> --adapter <a>... --trust-same-user-code
// --consent <c>... <extra>...` and returns the six lines it prints (bound,
// binding, binding-digest, package, package-digest, verified). Bind copies
// the package into the store, revalidates it and runs a live handshake with
// the copy, so a package that binds answers handshakes under the real host.
// extra may add options, such as "--timeout-ms", "30000" (the default
// invocation timeout is 300,000 ms).
//
// One binding per extension id: to bind another version in the same home,
// retire the binding first (`fm extension retire-binding <id>
// --if-binding-digest <Digest>` through Run), or use a new Home.
func (h *Home) Bind(pkgDir string, adapters, consents []string, extra ...string) Binding {
	h.T.Helper()
	args := []string{"extension", "bind", pkgDir}
	for _, a := range adapters {
		args = append(args, "--adapter", a)
	}
	args = append(args, "--trust-same-user-code")
	for _, c := range consents {
		args = append(args, "--consent", c)
	}
	args = append(args, extra...)
	stdout := h.must(args...)
	ls, ok := lines(stdout)
	if !ok || len(ls) != 6 {
		h.fail(args, stdout, "want the six bind lines")
	}
	keys := []string{"bound", "binding", "binding-digest", "package", "package-digest", "verified"}
	vals := make([]string, 6)
	for i, k := range keys {
		v, ok := strings.CutPrefix(ls[i], k+": ")
		if !ok || v == "" {
			h.fail(args, stdout, "line %d is not %q", i+1, k+": …")
		}
		vals[i] = v
	}
	var b Binding
	var idOK bool
	b.ExtensionID, b.ExtensionVersion, idOK = strings.Cut(vals[0], "@")
	if !idOK || !wire.ValidExtensionID(b.ExtensionID) || !wire.ValidVersion(b.ExtensionVersion) {
		h.fail(args, stdout, "bound: %q is not <extension-id>@<version>", vals[0])
	}
	b.Path, b.Digest, b.PackageRoot, b.PackageDigest = vals[1], vals[2], vals[3], vals[4]
	if !filepath.IsAbs(b.Path) || !filepath.IsAbs(b.PackageRoot) || !wire.ValidRequestID(b.Digest) || !wire.ValidRequestID(b.PackageDigest) {
		h.fail(args, stdout, "want absolute paths and sha256:<64 hex> digests")
	}
	capab, list, ok := strings.Cut(vals[5], " (")
	list, closed := strings.CutSuffix(list, ")")
	if !ok || !closed || capab == "" || list == "" {
		h.fail(args, stdout, "verified: %q is not <capability>/<version> (<adapters>)", vals[5])
	}
	b.Capability = capab
	b.Adapters = strings.Split(list, ",")
	for _, a := range b.Adapters {
		if !wire.ValidAdapterName(a) {
			h.fail(args, stdout, "verified: adapter name %q is invalid", a)
		}
	}
	return b
}

// Register runs `fm procevent register-extension <adapter> <sourceID>
// --config-ref <configRef>` and returns the owner token it prints (the only
// way to retire that registration, see Retire). The home's one binding that
// enables adapter serves the source.
func (h *Home) Register(adapterName, sourceID, configRef string) (token string) {
	h.T.Helper()
	args := []string{"procevent", "register-extension", adapterName, sourceID, "--config-ref", configRef}
	stdout := h.must(args...)
	ls, ok := lines(stdout)
	if !ok || len(ls) != 3 {
		h.fail(args, stdout, "want the three lines registered, owner-token, retire")
	}
	head := "registered: " + sourceID + " (" + adapterName + " from "
	owner, ok := strings.CutPrefix(ls[0], head)
	if !ok || !strings.HasSuffix(owner, ")") || !strings.Contains(owner, "@") {
		h.fail(args, stdout, "line 1 is not %q", head+"<id>@<version>)")
	}
	token, ok = strings.CutPrefix(ls[1], "owner-token: ")
	if !ok || !wire.ValidRequestID(token) {
		h.fail(args, stdout, "line 2 is not \"owner-token: sha256:<64 hex>\"")
	}
	if !strings.HasPrefix(ls[2], "retire: ") || !strings.HasSuffix(ls[2], " retire "+sourceID+" --if-owner "+token) {
		h.fail(args, stdout, "line 3 is not the retire command for %s", sourceID)
	}
	return token
}

// Retire runs `fm procevent retire <sourceID> --if-owner <token>`: it stops
// the source's running poll, if any, and removes its registration. A
// registration that is already gone succeeds too.
func (h *Home) Retire(sourceID, token string) {
	h.T.Helper()
	args := []string{"procevent", "retire", sourceID, "--if-owner", token}
	if stdout := h.must(args...); stdout != "retired: "+sourceID+"\n" {
		h.fail(args, stdout, "want %q", "retired: "+sourceID)
	}
}

// StartStatus is how one attached poll ended.
type StartStatus string

// The outcomes of `fm procevent start`.
const (
	// Captured: a result was captured, the poll's output or, when the poll
	// failed, evidence of the failure (see Evidence).
	Captured StartStatus = "captured"
	// NoResult: the adapter answered no-result.
	NoResult StartStatus = "no-result"
	// AlreadyOwned: another runner (a serve, another start) holds the source.
	AlreadyOwned StartStatus = "already-owned"
)

// StartResult is what `fm procevent start` printed.
type StartResult struct {
	Status StartStatus
	// Path is the captured result file (Status Captured), absolute:
	// <home>/state/procevent-inbox/<source-id>.<seq>.result.
	Path string
	// Evidence is the error code of a failed poll whose evidence was
	// captured (fm printed "captured: <path> (evidence: <code>)"); "" for
	// an output.
	Evidence string
	// Silenced reports the line "silenced: <source-id> <seq>": the
	// adapter's silent verdict marked the result handled, so it was not
	// announced.
	Silenced bool
	// Retired reports the line "retired: <source-id> (terminal)": the
	// adapter's terminal verdict retired the registration.
	Retired bool
}

// Start runs `fm procevent start <sourceID>`: one attached poll of the
// source, then the capture, the announcement (a check wake) and the silent
// and terminal verdicts. It returns when the poll has ended, so it waits as
// long as the adapter's Poll does (bounded by the binding's timeout). A poll
// that fails (an error answer, a timeout, a broken answer) is not an fm
// failure: its evidence is Captured; read it with Evidence.
func (h *Home) Start(sourceID string) StartResult {
	h.T.Helper()
	args := []string{"procevent", "start", sourceID}
	stdout := h.must(args...)
	ls, ok := lines(stdout)
	if ok && len(ls) == 1 {
		switch ls[0] {
		case "no-result: " + sourceID:
			return StartResult{Status: NoResult}
		case "already owned: " + sourceID:
			return StartResult{Status: AlreadyOwned}
		}
	}
	if !ok || len(ls) > 3 {
		h.fail(args, stdout, "want captured:, no-result: or already owned:")
	}
	p, ok := strings.CutPrefix(ls[0], "captured: ")
	if p, code, found := strings.Cut(p, " (evidence: "); found {
		code, closed := strings.CutSuffix(code, ")")
		if !closed || code == "" {
			h.fail(args, stdout, "want captured: <absolute path> (evidence: <code>)")
		}
		return h.startTail(args, stdout, sourceID, StartResult{Status: Captured, Path: p, Evidence: code}, ls[1:])
	}
	if !ok || !filepath.IsAbs(p) {
		h.fail(args, stdout, "want captured: <absolute path>, no-result: %s or already owned: %s", sourceID, sourceID)
	}
	return h.startTail(args, stdout, sourceID, StartResult{Status: Captured, Path: p}, ls[1:])
}

// startTail reads the lines after start's captured line: "silenced: <id>
// <seq>" (not after evidence), then "retired: <id> (terminal)", each at most
// once, in that order.
func (h *Home) startTail(args []string, stdout, sourceID string, r StartResult, rest []string) StartResult {
	h.T.Helper()
	if !filepath.IsAbs(r.Path) {
		h.fail(args, stdout, "want captured: <absolute path>")
	}
	if len(rest) > 0 && r.Evidence == "" && strings.HasPrefix(rest[0], "silenced: ") {
		if !strings.HasPrefix(rest[0], "silenced: "+sourceID+" ") || !strings.HasSuffix(r.Path, "/"+sourceID+"."+strings.TrimPrefix(rest[0], "silenced: "+sourceID+" ")+".result") {
			h.fail(args, stdout, "want silenced: %s <seq of %s>", sourceID, r.Path)
		}
		r.Silenced, rest = true, rest[1:]
	}
	if len(rest) > 0 {
		if rest[0] != "retired: "+sourceID+" (terminal)" {
			h.fail(args, stdout, "line %q is not %q", rest[0], "retired: "+sourceID+" (terminal)")
		}
		r.Retired, rest = true, rest[1:]
	}
	if len(rest) > 0 {
		h.fail(args, stdout, "unexpected line %q", rest[0])
	}
	return r
}

// Classify runs `fm procevent classify <resultPath>`: the captured result's
// own binding classifies it (result.classify). It returns the token.
func (h *Home) Classify(resultPath string) string {
	h.T.Helper()
	args := []string{"procevent", "classify", resultPath}
	stdout := h.must(args...)
	c, ok := strings.CutSuffix(stdout, "\n")
	if !ok || !wire.ValidClassification(c) {
		h.fail(args, stdout, "want one classification token")
	}
	return c
}

// Handled runs `fm procevent handled <sourceID> <seq>`, marking a captured
// result handled. It reports whether it already was (fm printed
// already-handled).
func (h *Home) Handled(sourceID string, seq int64) (already bool) {
	h.T.Helper()
	args := []string{"procevent", "handled", sourceID, strconv.FormatInt(seq, 10)}
	stdout := h.must(args...)
	tail := ": " + sourceID + " " + strconv.FormatInt(seq, 10) + "\n"
	switch stdout {
	case "handled" + tail:
		return false
	case "already-handled" + tail:
		return true
	}
	h.fail(args, stdout, "want handled:%s or already-handled:%s", tail[1:len(tail)-1], tail[1:len(tail)-1])
	return false
}

// Inbox runs `fm procevent inbox --json` and returns every captured result
// of the home, in source-id and sequence order. The document is parsed
// strictly: one JSON document, no duplicate, unknown or missing member, no
// null, integers where integers are due.
func (h *Home) Inbox() []fmjson.Result {
	h.T.Helper()
	var doc fmjson.Inbox
	args := []string{"procevent", "inbox", "--json"}
	h.decode(args, &doc)
	for _, r := range doc.Results {
		ext := r.ExtensionID != "" && r.ExtensionVersion != "" && r.CapabilityVersion > 0 && r.PackageDigest != "" && r.BindingDigest != ""
		none := r.ExtensionID == "" && r.ExtensionVersion == "" && r.CapabilityVersion == 0 && r.PackageDigest == "" && r.BindingDigest == ""
		if !(r.Kind == "extension" && ext) && !(r.Kind == "builtin" && none) {
			h.T.Fatalf("adaptertest: %s: result %s.%d of kind %q does not have exactly the owner fields of its kind", h.command(args), r.SourceID, r.Sequence, r.Kind)
		}
	}
	return doc.Results
}

// Wakes runs `fm wake list --json` and returns the whole wake queue, parsed
// strictly as Inbox does.
func (h *Home) Wakes() []fmjson.Wake {
	h.T.Helper()
	var doc fmjson.Wakes
	h.decode([]string{"wake", "list", "--json"}, &doc)
	return doc.Wakes
}

// Extensions runs `fm extension list --json` (which runs no package code)
// and returns the enabled bindings, parsed strictly as Inbox does.
func (h *Home) Extensions() []fmjson.Binding {
	h.T.Helper()
	var doc fmjson.Bindings
	h.decode([]string{"extension", "list", "--json"}, &doc)
	return doc.Bindings
}

// Sources runs `fm procevent list --json` and returns the registered
// sources, parsed strictly as Inbox does.
func (h *Home) Sources() []fmjson.Source {
	h.T.Helper()
	var doc fmjson.Sources
	h.decode([]string{"procevent", "list", "--json"}, &doc)
	return doc.Sources
}

// Evidence reads the captured result at resultPath, which must be the
// evidence of a failed poll (an InboxEntry with Evidence true), and returns
// it parsed strictly.
func (h *Home) Evidence(resultPath string) wire.Evidence {
	h.T.Helper()
	data, err := os.ReadFile(resultPath)
	if err != nil {
		h.T.Fatalf("adaptertest: %v", err)
	}
	var e wire.Evidence
	if err := decodeStrict(data, &e); err != nil || e.Schema != wire.EvidenceSchema || e.Code == "" {
		h.T.Fatalf("adaptertest: %s is not a %s document (%v): %q", resultPath, wire.EvidenceSchema, err, data)
	}
	return e
}

// ExtensionState returns the private state directory fm gives the package
// extensionID as FIRSTMATE_EXTENSION_STATE (adapter.Env.StateDir) in this
// home: <home>/state/extensions/<id>. fm creates it at the first invocation.
func (h *Home) ExtensionState(extensionID string) string {
	return filepath.Join(h.Dir, "state", "extensions", extensionID)
}

// decode runs fm and strictly parses its stdout into v.
func (h *Home) decode(args []string, v any) {
	h.T.Helper()
	stdout := h.must(args...)
	if err := decodeStrict([]byte(stdout), v); err != nil {
		h.fail(args, stdout, "%v", err)
	}
}

// maxDocument bounds what fm prints for one --json or evidence document
// that decode and Evidence read.
const maxDocument = 16 << 20

// decodeStrict parses data strictly into v, a pointer to a struct, by the
// rules of every protocol document (wire.Decode): exactly one JSON value, no
// duplicate, unknown or missing member (but those tagged omitzero), no
// invalid UTF-8, no null, integers where integers are due.
func decodeStrict(data []byte, v any) error {
	return wire.Decode(data, maxDocument, "document", v)
}
