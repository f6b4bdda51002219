// Package home resolves the code root, the effective home and the state root,
// and checks the private directories fm keeps state in.
//
// Rules (CONTRACT §1):
//   - code root: FM_ROOT_OVERRIDE, else the parent of the directory holding the
//     running executable, symlinks resolved. Built-in adapters live in its bin/.
//   - effective home: FM_HOME, else FM_ROOT_OVERRIDE, else the code root. It must
//     be an existing directory owned by the user; it is used canonically.
//   - state root: FM_STATE_OVERRIDE, else <home>/state. Where it exists it must
//     be private: canonical, not a link, owned by the user, no group/other write.
//   - every one of the three variables, when set, must be an absolute path: a
//     relative one would name another home in each working directory, so it is
//     refused (home-invalid, naming the variable), never resolved against the
//     current directory ([CLI-5]).
//
// No other environment variable is read, and nothing in a home is named by the
// environment: packages, bindings and registrations are found only at the
// fixed paths below.
package home

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/shown"
)

// Home is one resolved Firstmate home. All paths are absolute and canonical.
type Home struct {
	Root  string // code root
	Dir   string // effective home
	State string // state root (may not exist yet)
}

// Resolve reads FM_ROOT_OVERRIDE, FM_HOME and FM_STATE_OVERRIDE and checks the
// result. It creates nothing.
func Resolve() (*Home, error) {
	for _, v := range []string{"FM_ROOT_OVERRIDE", "FM_HOME", "FM_STATE_OVERRIDE"} {
		if p := os.Getenv(v); p != "" && !filepath.IsAbs(p) {
			return nil, errcode.New(errcode.HomeInvalid, "%s=%q is relative; it must be an absolute path, since fm never resolves a home against the current directory", v, p)
		}
	}
	root := os.Getenv("FM_ROOT_OVERRIDE")
	if root == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, errcode.Wrap(errcode.HomeInvalid, err, "cannot locate the running fm (set FM_ROOT_OVERRIDE to the code root)")
		}
		exe, err = filepath.EvalSymlinks(exe)
		if err != nil {
			return nil, errcode.Wrap(errcode.HomeInvalid, err, "cannot resolve the running fm (set FM_ROOT_OVERRIDE to the code root)")
		}
		root = filepath.Dir(filepath.Dir(exe))
	}
	dir := os.Getenv("FM_HOME")
	if dir == "" {
		dir = root
	}
	var err error
	if root, err = canonicalDir(root, "code root"); err != nil {
		return nil, err
	}
	if dir, err = canonicalDir(dir, "home"); err != nil {
		return nil, err
	}
	if err := checkOwned(dir, "home"); err != nil {
		return nil, err
	}
	state := os.Getenv("FM_STATE_OVERRIDE")
	if state == "" {
		state = filepath.Join(dir, "state")
	}
	h := &Home{Root: root, Dir: dir, State: filepath.Clean(state)}
	for _, p := range []struct{ path, what string }{{h.Root, "code root"}, {h.Dir, "home"}, {h.State, "state root"}} {
		if !shown.Plain(p.path) {
			return nil, errcode.New(errcode.HomeInvalid, "%s %s holds a control or formatting character, a line break or invalid UTF-8; fm prints its paths on lines of their own, so it refuses one that could end or forge a line: use a path without them", p.what, shown.Path(p.path))
		}
	}
	if _, err := os.Lstat(h.State); err == nil {
		if err := CheckPrivate(h.State, false); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// canonicalDir resolves the absolute p to the canonical directory it names.
func canonicalDir(p, what string) (string, error) {
	c, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", errcode.New(errcode.HomeInvalid, "%s %q does not exist; create it or fix FM_HOME/FM_ROOT_OVERRIDE", what, p)
	}
	fi, err := os.Stat(c)
	if err != nil || !fi.IsDir() {
		return "", errcode.New(errcode.HomeInvalid, "%s %q is not a directory; point FM_HOME/FM_ROOT_OVERRIDE at a directory", what, p)
	}
	return c, nil
}

func checkOwned(p, what string) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return errcode.Wrap(errcode.HomeInvalid, err, "%s %q", what, p)
	}
	if int(st.Uid) != os.Geteuid() {
		return errcode.New(errcode.HomeInvalid, "%s %q is owned by uid %d, not by you (uid %d); use a home of your own (FM_HOME)", what, p, st.Uid, os.Geteuid())
	}
	return nil
}

// The fixed layout of a home (CONTRACT [HOME-4]).

// Bindings is config/extensions.d, the enabled-binding registry.
func (h *Home) Bindings() string { return filepath.Join(h.Dir, "config", "extensions.d") }

// Extensions is data/extensions, the parent of the store and retired state.
func (h *Home) Extensions() string { return filepath.Join(h.Dir, "data", "extensions") }

// Packages is the content-addressed package store.
func (h *Home) Packages() string { return filepath.Join(h.Extensions(), "packages") }

// PackageRoot is where a package identity is installed.
func (h *Home) PackageRoot(id, version, treeHex string) string {
	return filepath.Join(h.Packages(), id, version, treeHex)
}

// RetiredBindings holds retired, restorable binding files.
func (h *Home) RetiredBindings() string { return filepath.Join(h.Extensions(), "retired-bindings") }

// Staging holds received transfers.
func (h *Home) Staging() string { return filepath.Join(h.Extensions(), "staging") }

// RetiredStaging holds retired or failed transfers.
func (h *Home) RetiredStaging() string { return filepath.Join(h.Extensions(), "retired-staging") }

// Secondmates is the route file of `fm on`.
func (h *Home) Secondmates() string { return filepath.Join(h.Dir, "data", "secondmates.json") }

// ExtensionState is the package's own state directory.
func (h *Home) ExtensionState(id string) string { return filepath.Join(h.State, "extensions", id) }

// ExtensionTemp is the package's private temporary directory, announced as
// TMPDIR ([INV-3]): beside its state directory, not in it, so no name of the
// package's own state is taken.
func (h *Home) ExtensionTemp(id string) string {
	return filepath.Join(h.State, "extension-tmp", id)
}

// Config is the home's config directory (bindings, the confinement setting).
func (h *Home) Config() string { return filepath.Join(h.Dir, "config") }

// Invocations holds live-invocation cleanup records.
func (h *Home) Invocations() string { return filepath.Join(h.State, "extension-invocations") }

// Registrations holds process-event source registrations.
func (h *Home) Registrations() string { return filepath.Join(h.State, "procevent") }

// Inbox holds captured process-event results.
func (h *Home) Inbox() string { return filepath.Join(h.State, "procevent-inbox") }

// WakeQueue is the durable wake queue.
func (h *Home) WakeQueue() string { return filepath.Join(h.State, ".wake-queue") }

// PrivateRule is the private-directory rule of a home's directories
// (fsutil.DirRule): not a link, canonical, owned by the user, without
// group/other write bits, and on the mount of its parent (not a mount point:
// fsutil.OnParentMount) [HOME-3]; with exact, its permission bits must be
// exactly 0700 [CAP-6].
func PrivateRule(exact bool) fsutil.DirRule {
	r := fsutil.DirRule{Perm: fsutil.NoGroupWrite, Canonical: true, SameMount: true}
	if exact {
		r.Perm = fsutil.Exact0700
	}
	return r
}

// CheckPrivate checks that p is a private directory (PrivateRule).
func CheckPrivate(p string, exact bool) error { return fsutil.CheckDir(p, PrivateRule(exact)) }

// EnsurePrivate creates p and any missing parents below h.Dir or h.State with
// mode 0700, durably (fsutil.MkdirAllSync: each new directory's parent is
// fsynced), then checks p as CheckPrivate(p, exact). Existing parents are not
// changed.
func EnsurePrivate(p string, exact bool) error {
	if err := fsutil.MkdirAllSync(p, 0o700); err != nil {
		return errcode.Wrap(errcode.PathUnsafe, err, "create directory %q", p)
	}
	return CheckPrivate(p, exact)
}

// OpenPrivate opens the private directory p as a pinned handle
// (fsutil.OpenDir under PrivateRule).
func OpenPrivate(p string, exact bool) (*os.File, error) {
	return fsutil.OpenDir(p, PrivateRule(exact))
}
