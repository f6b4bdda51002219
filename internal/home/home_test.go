package home

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/shown"
)

func canon(t *testing.T, p string) string {
	t.Helper()
	c, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// [HOME-1] [HOME-2] code root, effective home and their precedence.
func TestResolvePrecedence(t *testing.T) {
	root := canon(t, t.TempDir())
	hm := canon(t, t.TempDir())
	t.Setenv("FM_STATE_OVERRIDE", "")

	t.Setenv("FM_ROOT_OVERRIDE", root)
	t.Setenv("FM_HOME", "")
	h, err := Resolve()
	if err != nil || h.Root != root || h.Dir != root || h.State != filepath.Join(root, "state") {
		t.Fatalf("override only: %+v %v", h, err)
	}
	t.Setenv("FM_HOME", hm)
	h, err = Resolve()
	if err != nil || h.Root != root || h.Dir != hm {
		t.Fatalf("FM_HOME wins for the home: %+v %v", h, err)
	}
	// Without an override the code root is the parent of the executable's dir.
	t.Setenv("FM_ROOT_OVERRIDE", "")
	exe, _ := os.Executable()
	exe = canon(t, exe)
	h, err = Resolve()
	if err != nil || h.Root != filepath.Dir(filepath.Dir(exe)) {
		t.Fatalf("executable root: %+v %v", h, err)
	}
	// A symlinked home is used canonically.
	link := filepath.Join(canon(t, t.TempDir()), "link")
	os.Symlink(hm, link)
	t.Setenv("FM_HOME", link)
	if h, err = Resolve(); err != nil || h.Dir != hm {
		t.Fatalf("canonical home: %+v %v", h, err)
	}
}

// [HOME-2] a missing home or a file is home-invalid.
func TestResolveInvalidHome(t *testing.T) {
	dir := canon(t, t.TempDir())
	f := filepath.Join(dir, "file")
	os.WriteFile(f, nil, 0o600)
	for _, p := range []string{filepath.Join(dir, "missing"), f} {
		t.Setenv("FM_HOME", p)
		if _, err := Resolve(); errcode.Of(err) != errcode.HomeInvalid {
			t.Errorf("%s: %v", p, err)
		}
	}
	if os.Geteuid() == 0 {
		foreign := filepath.Join(dir, "foreign")
		os.Mkdir(foreign, 0o755)
		os.Chown(foreign, 65534, 65534)
		t.Setenv("FM_HOME", foreign)
		if _, err := Resolve(); errcode.Of(err) != errcode.HomeInvalid {
			t.Errorf("foreign-owned home: %v", err)
		}
	}
}

// [HOME-3] the state root: override, and where it exists it must be private.
func TestStateRoot(t *testing.T) {
	hm := canon(t, t.TempDir())
	t.Setenv("FM_HOME", hm)
	st := filepath.Join(canon(t, t.TempDir()), "st")
	t.Setenv("FM_STATE_OVERRIDE", st)
	h, err := Resolve()
	if err != nil || h.State != st {
		t.Fatalf("%+v %v", h, err)
	}
	if _, err := os.Lstat(st); !os.IsNotExist(err) {
		t.Fatal("Resolve created the state root")
	}
	t.Setenv("FM_STATE_OVERRIDE", "relative/state")
	if _, err := Resolve(); errcode.Of(err) != errcode.HomeInvalid {
		t.Fatalf("relative override: %v", err)
	}
	t.Setenv("FM_STATE_OVERRIDE", st)
	os.Mkdir(st, 0o770)
	os.Chmod(st, 0o770)
	if _, err := Resolve(); errcode.Of(err) != errcode.ModeUnsafe {
		t.Fatalf("group-writable state: %v", err)
	}
	os.Remove(st)
	real := st + "-real"
	os.Mkdir(real, 0o700)
	os.Symlink(real, st)
	if _, err := Resolve(); errcode.Of(err) != errcode.LinkUnsafe {
		t.Fatalf("symlinked state: %v", err)
	}
}

// [HOME-4] private directories are created 0700 and pinned handles refuse links.
func TestPrivateDirs(t *testing.T) {
	base := canon(t, t.TempDir())
	p := filepath.Join(base, "a", "b")
	if err := EnsurePrivate(p, true); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Lstat(p)
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v", fi.Mode())
	}
	f, err := OpenPrivate(p, true)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	link := filepath.Join(base, "link")
	os.Symlink(p, link)
	if _, err := OpenPrivate(link, true); errcode.Of(err) != errcode.LinkUnsafe {
		t.Fatalf("OpenPrivate followed a link: %v", err)
	}
	if err := CheckPrivate(link, true); errcode.Of(err) != errcode.LinkUnsafe {
		t.Fatalf("CheckPrivate: %v", err)
	}
	os.Chmod(p, 0o750)
	if err := CheckPrivate(p, true); errcode.Of(err) != errcode.ModeUnsafe {
		t.Fatalf("exact 0700: %v", err)
	}
	if err := CheckPrivate(p, false); err != nil {
		t.Fatalf("0750 is private enough when not exact: %v", err)
	}
}

// [HOME-4] EnsurePrivate creates every missing directory of the layout
// exactly 0700 (through fsutil.MkdirAllSync, which also fsyncs each new
// directory's parent; that durability cannot be unit-tested) whatever the
// umask, so even a umask that strips the owner's write bit leaves a usable
// private tree; a second call is a no-op.
func TestEnsurePrivateModes(t *testing.T) {
	base := canon(t, t.TempDir())
	old := syscall.Umask(0o277)
	t.Cleanup(func() { syscall.Umask(old) })
	p := filepath.Join(base, "data", "extensions", "retired-bindings", "org.example.x")
	if err := EnsurePrivate(p, true); err != nil {
		t.Fatal(err)
	}
	for d := p; d != base; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("%s has mode %v, want 0700", d, fi.Mode())
		}
	}
	if err := EnsurePrivate(p, true); err != nil {
		t.Fatalf("second call: %v", err)
	}
}

// [CLI-5] [HOME-1] [HOME-2] every root variable must be absolute: a relative
// one is refused with home-invalid naming the variable, even where it would
// resolve against the current directory to a valid home.
func TestResolveRelativeRoots(t *testing.T) {
	base := canon(t, t.TempDir())
	for _, d := range []string{"home", "root"} {
		if err := os.Mkdir(filepath.Join(base, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(base)
	abs := map[string]string{"FM_HOME": filepath.Join(base, "home"), "FM_ROOT_OVERRIDE": filepath.Join(base, "root"), "FM_STATE_OVERRIDE": ""}
	for v, rel := range map[string]string{"FM_HOME": "home", "FM_ROOT_OVERRIDE": "root", "FM_STATE_OVERRIDE": "home/state"} {
		for k, p := range abs {
			t.Setenv(k, p)
		}
		if _, err := Resolve(); err != nil {
			t.Fatalf("absolute roots: %v", err)
		}
		t.Setenv(v, rel)
		_, err := Resolve()
		if errcode.Of(err) != errcode.HomeInvalid || !strings.Contains(err.Error(), v+`="`+rel+`" is relative`) {
			t.Errorf("%s=%s: %v, want home-invalid naming %s", v, rel, err, v)
		}
	}
}

// [HOME-2] [HOME-3] A home, state root or code root whose canonical path
// holds a tab, a line break, any other control character, a formatting
// character or invalid UTF-8 is refused (home-invalid, the path shown
// escaped): fm prints these paths on lines of their own. Through a symlink
// without such characters the canonical path still holds them and is
// refused too. A path with other non-ASCII text is accepted.
func TestResolveRefusesUnprintablePaths(t *testing.T) {
	base := canon(t, t.TempDir())
	for _, name := range []string{"a\tb", "a\nb", "a\rcaptured: x", "a\x1b[2Jb", "a\x7fb", "a\u0085b", "a\u202eb", "a\u2028b", "a\xffb"} {
		dir := filepath.Join(base, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(base, "link")
		os.Remove(link)
		if err := os.Symlink(dir, link); err != nil {
			t.Fatal(err)
		}
		for _, env := range [][2]string{{"FM_HOME", dir}, {"FM_HOME", link}, {"FM_ROOT_OVERRIDE", dir}} {
			t.Setenv("FM_HOME", base)
			t.Setenv("FM_ROOT_OVERRIDE", base)
			t.Setenv("FM_STATE_OVERRIDE", "")
			t.Setenv(env[0], env[1])
			_, err := Resolve()
			if errcode.Of(err) != errcode.HomeInvalid || !strings.Contains(err.Error(), "control or formatting") || !shown.Plain(err.Error()) {
				t.Errorf("%s=%q: %v", env[0], env[1], err)
			}
		}
		t.Setenv("FM_HOME", base)
		t.Setenv("FM_STATE_OVERRIDE", filepath.Join(dir, "state"))
		if _, err := Resolve(); errcode.Of(err) != errcode.HomeInvalid {
			t.Errorf("FM_STATE_OVERRIDE under %q: %v", name, err)
		}
	}
	ok := filepath.Join(base, "état ümlaut 家")
	os.Mkdir(ok, 0o700)
	t.Setenv("FM_HOME", ok)
	t.Setenv("FM_ROOT_OVERRIDE", base)
	t.Setenv("FM_STATE_OVERRIDE", "")
	if _, err := Resolve(); err != nil {
		t.Fatalf("a printable non-ASCII home: %v", err)
	}
}
