package fsutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// privateDir makes a fresh directory of exactly mode 0700.
func privateDir(t *testing.T) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "d")
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

func pinDir(t *testing.T, p string, r DirRule) *os.File {
	t.Helper()
	d, err := OpenDir(p, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// names lists p, sorted.
func names(t *testing.T, p string) []string {
	t.Helper()
	ents, err := os.ReadDir(p)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out
}

// otherUID is a uid that is not the test's: 65534 for root, root otherwise.
func otherUID() int {
	if os.Geteuid() == 0 {
		return 65534
	}
	return 0
}

// [HOME-3] [HOME-4] [CAP-6] The one private-directory rule, on real
// directories: a symlink, a file, a missing name, a foreign owner, group-
// and world-writable modes and a symlinked path component are each refused
// with their code, under each permission rule, whether checked by path
// (CheckDir) or on the opened handle (OpenDir). A foreign owner is made with
// chown as root; unprivileged, a root-owned directory stands in for it.
func TestDirRuleRefuses(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ok := mk("ok", 0o700)
	link := filepath.Join(base, "link")
	if err := os.Symlink(ok, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	foreign := "/" // owned by root: foreign to uid 65534
	if os.Geteuid() == 0 {
		foreign = mk("foreign", 0o700)
		if err := os.Chown(foreign, otherUID(), otherUID()); err != nil {
			t.Fatal(err)
		}
	}
	below := filepath.Join(link, "sub") // canonical test: a symlinked component
	if err := os.Mkdir(filepath.Join(ok, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path string
		rule DirRule
		want errcode.Code
	}{
		{ok, DirRule{Perm: Exact0700, Canonical: true}, ""},
		{link, DirRule{}, errcode.LinkUnsafe},
		{file, DirRule{}, errcode.PathUnsafe},
		{filepath.Join(base, "absent"), DirRule{}, errcode.PathUnsafe},
		{foreign, DirRule{Perm: AnyPerm}, errcode.OwnerMismatch},
		{mk("gw", 0o770), DirRule{}, errcode.ModeUnsafe},
		{mk("ww", 0o703), DirRule{}, errcode.ModeUnsafe},
		{mk("gr", 0o750), DirRule{}, ""},
		{filepath.Join(base, "gr"), DirRule{Perm: OwnerOnly}, errcode.ModeUnsafe},
		{filepath.Join(base, "gr"), DirRule{Perm: Exact0700}, errcode.ModeUnsafe},
		{mk("x", 0o711), DirRule{Perm: OwnerOnly}, errcode.ModeUnsafe},
		{mk("o", 0o701), DirRule{Perm: OwnerOnly}, errcode.ModeUnsafe},
		{filepath.Join(base, "o"), DirRule{}, ""},
		{mk("open", 0o777), DirRule{Perm: AnyPerm}, ""},
		{below, DirRule{}, ""},
		{below, DirRule{Canonical: true}, errcode.PathUnsafe},
	}
	for _, c := range cases {
		for _, how := range []string{"OpenDir", "CheckDir"} {
			var err error
			if how == "OpenDir" {
				var d *os.File
				if d, err = OpenDir(c.path, c.rule); err == nil {
					d.Close()
				}
			} else {
				err = CheckDir(c.path, c.rule)
			}
			got := errcode.Code("")
			if err != nil {
				got = errcode.Of(err)
			}
			if got != c.want {
				t.Errorf("%s(%s, %+v): %v (%s), want %q", how, c.path, c.rule, err, got, c.want)
			}
		}
	}
	if _, err := OpenDir(filepath.Join(base, "absent"), DirRule{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing directory: %v, want it to wrap os.ErrNotExist", err)
	}
}

// [CAP-6] A pinned directory swapped for a symlink (and then for another
// directory) after it was opened: every operation by handle still lands in
// the directory that was opened and checked, the symlink's target is never
// written, and Recheck refuses the swapped path before a write that matters.
func TestPinnedDirSwapped(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "d")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	d := pinDir(t, dir, DirRule{Perm: Exact0700})
	if err := Recheck(d, DirRule{Perm: Exact0700}); err != nil {
		t.Fatalf("recheck of an unchanged directory: %v", err)
	}
	moved := filepath.Join(base, "moved")
	target := filepath.Join(base, "target")
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, dir); err != nil {
		t.Fatal(err)
	}
	if err := Recheck(d, DirRule{Perm: Exact0700}); errcode.Of(err) != errcode.LinkUnsafe {
		t.Errorf("recheck after the swap for a symlink: %v, want link-unsafe", err)
	}
	if err := CreateAt(d, "created", []byte("c")); err != nil {
		t.Fatal(err)
	}
	if err := ReplaceAt(d, "replaced", []byte("r")); err != nil {
		t.Fatal(err)
	}
	if err := ReplaceAt(d, "replaced", []byte("r2")); err != nil {
		t.Fatal(err)
	}
	if got := names(t, moved); !slices.Equal(got, []string{"created", "replaced"}) {
		t.Errorf("the pinned directory holds %q, want exactly created and replaced", got)
	}
	if got := names(t, target); len(got) != 0 {
		t.Errorf("the symlink's target was written: %q", got)
	}
	if got, err := NamesAt(d); err != nil || !slices.Equal(slices.Sorted(slices.Values(got)), []string{"created", "replaced"}) {
		t.Errorf("NamesAt after the swap: %q, %v", got, err)
	}
	if data, err := ReadPrivateAt(d, "replaced", 16); err != nil || string(data) != "r2" {
		t.Errorf("read back: %q, %v", data, err)
	}
	if err := RemoveAt(d, "created"); err != nil || ExistsAt(d, "created") {
		t.Errorf("remove by handle: %v", err)
	}
	if err := RemoveAt(d, "created"); err != nil {
		t.Errorf("remove of an absent name: %v", err)
	}
	if removed, err := UnlinkAt(d, "replaced"); !removed || err != nil || ExistsAt(d, "replaced") {
		t.Errorf("unlink by handle: %v, %v", removed, err)
	}
	if removed, err := UnlinkAt(d, "replaced"); removed || err != nil {
		t.Errorf("unlink of an absent name: %v, %v", removed, err)
	}
	os.Mkdir(filepath.Join(moved, "sub"), 0o700)
	if _, err := UnlinkAt(d, "sub"); err == nil || !ExistsAt(d, "sub") {
		t.Errorf("unlink of a directory: %v", err)
	}
	os.Remove(filepath.Join(moved, "sub"))
	os.Remove(dir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Recheck(d, DirRule{Perm: Exact0700}); errcode.Of(err) != errcode.PathUnsafe {
		t.Errorf("recheck after the swap for another directory: %v, want path-unsafe", err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	child := pinDir(t, sub, DirRule{})
	if err := SameEntry(d, "sub", child); err == nil {
		t.Error("SameEntry accepted a child that is not an entry of the pinned parent")
	}
	parent := pinDir(t, dir, DirRule{})
	if err := SameEntry(parent, "sub", child); err != nil {
		t.Errorf("SameEntry of the real child: %v", err)
	}
}

// [BND-4] Create-no-replace never replaces: a name that exists (a file, a
// symlink, a directory) is ErrExists, the existing entry and a symlink's
// target are unchanged, and nothing is left behind (no temp). Replace
// replaces a symlink at the name itself, never its target.
func TestCreateNoReplace(t *testing.T) {
	dir := privateDir(t)
	d := pinDir(t, dir, DirRule{Perm: Exact0700})
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("outside"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "file"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"file", "link", "sub"} {
		if err := CreateAt(d, n, []byte("new")); !errors.Is(err, ErrExists) {
			t.Errorf("create over %s: %v, want ErrExists", n, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "file")); string(b) != "old" {
		t.Errorf("the existing file now holds %q", b)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"file", "link", "sub"}) {
		t.Errorf("left %q", got)
	}
	// The named-temp path: RENAME_NOREPLACE, the temp removed on refusal.
	p, err := NewAt(d, NewOptions{Temp: TempName()})
	if err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("new"))
	if err := p.Create("file"); !errors.Is(err, os.ErrExist) {
		t.Errorf("named create over a file: %v, want EEXIST", err)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"file", "link", "sub"}) {
		t.Errorf("a refused named create left %q", got)
	}
	if err := ReplaceAt(d, "link", []byte("replaced")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "outside" {
		t.Errorf("replace over a symlink wrote its target: %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "link")); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Errorf("replace over a symlink: %v %v, want a regular 0600 file", fi.Mode(), err)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"file", "link", "sub"}) {
		t.Errorf("replace left %q", got)
	}
}

// [HOME-4] A pending file: its mode is exact whatever the umask; Abort
// leaves nothing; a named temp that exists is refused unless Stale (a fixed
// temp name a killed writer left), which removes it first; Exchange swaps
// the old file out and leaves no temp, or renames where there is nothing to
// swap; Final publishes into another pinned directory and leaves no temp in
// either; SetModTime keeps the time to the nanosecond.
func TestPending(t *testing.T) {
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })
	dir := privateDir(t)
	d := pinDir(t, dir, DirRule{Perm: Exact0700})

	p, err := NewAt(d, NewOptions{Mode: 0o640})
	if err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("x"))
	p.Abort()
	p, err = NewAt(d, NewOptions{Temp: "fixed"})
	if err != nil {
		t.Fatal(err)
	}
	p.Abort()
	if got := names(t, dir); len(got) != 0 {
		t.Errorf("aborted files left %q", got)
	}

	if err := os.WriteFile(filepath.Join(dir, "fixed"), []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewAt(d, NewOptions{Temp: "fixed"}); !errors.Is(err, os.ErrExist) {
		t.Errorf("a temp name that exists: %v, want EEXIST", err)
	}
	p, err = NewAt(d, NewOptions{Temp: "fixed", Stale: true, Mode: 0o640})
	if err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("v1"))
	when := time.Date(2001, 2, 3, 4, 5, 6, 789, time.UTC)
	if err := p.SetModTime(when); err != nil {
		t.Fatal(err)
	}
	if err := p.Exchange("final"); err != nil { // nothing to swap: a rename
		t.Fatal(err)
	}
	fi, err := os.Lstat(filepath.Join(dir, "final"))
	if err != nil || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(when) {
		t.Errorf("published: %v %v %v, want mode 0640 and time %v", fi.Mode(), fi.ModTime(), err, when)
	}
	var before unix.Stat_t
	unix.Lstat(filepath.Join(dir, "final"), &before)
	p, err = NewAt(d, NewOptions{Temp: "t2", NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("v2"))
	if err := p.Exchange("final"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "final")); string(b) != "v2" {
		t.Errorf("after the exchange: %q", b)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"final"}) {
		t.Errorf("the exchange left %q", got)
	}
	if before.Nlink != 1 {
		t.Errorf("the first file had %d links", before.Nlink)
	}

	other := privateDir(t)
	o := pinDir(t, other, DirRule{Perm: Exact0700})
	p, err = NewAt(d, NewOptions{Temp: TempName(), Final: o})
	if err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("moved"))
	if err := p.Replace("there"); err != nil {
		t.Fatal(err)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"final"}) {
		t.Errorf("Final left %q in the temp's directory", got)
	}
	if b, err := os.ReadFile(filepath.Join(other, "there")); err != nil || string(b) != "moved" {
		t.Errorf("Final: %q, %v", b, err)
	}
}

// [BND-4] [OP-3] Reading a private file by handle refuses, for real: a
// symlink, a FIFO (without blocking), a hard link, a group-readable file, a
// file over its bound (and a file that grew past it), and, as root, a file
// of another owner; an absent file wraps os.ErrNotExist.
func TestReadPrivateAtRefuses(t *testing.T) {
	dir := privateDir(t)
	d := pinDir(t, dir, DirRule{Perm: Exact0700})
	put := func(name, data string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	put("ok", "1234", 0o600)
	if err := os.Symlink(filepath.Join(dir, "ok"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(put("linked", "x", 0o600), filepath.Join(dir, "second")); err != nil {
		t.Fatal(err)
	}
	put("readable", "x", 0o640)
	put("big", "12345", 0o600)
	cases := map[string]errcode.Code{
		"ok": "", "link": errcode.LinkUnsafe, "fifo": errcode.LinkUnsafe, "linked": errcode.LinkUnsafe,
		"readable": errcode.ModeUnsafe, "big": errcode.JSONOversized,
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(put("foreign", "x", 0o600), otherUID(), otherUID()); err != nil {
			t.Fatal(err)
		}
		cases["foreign"] = errcode.OwnerMismatch
	}
	for name, want := range cases {
		done := make(chan error, 1)
		go func() { _, err := ReadPrivateAt(d, name, 4); done <- err }()
		var err error
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("reading %s blocked", name)
		}
		got := errcode.Code("")
		if err != nil {
			got = errcode.Of(err)
		}
		if got != want {
			t.Errorf("read %s: %v (%s), want %q", name, err, got, want)
		}
	}
	if _, err := ReadPrivateAt(d, "absent", 4); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent: %v, want os.ErrNotExist", err)
	}
}

// [BND-4] Racing writers, for real: 32 goroutines create the same name and
// exactly one wins (the others get ErrExists and leave nothing); 32 replace
// one name while a reader reads it by handle the whole time, and the reader
// only ever sees one writer's whole content, never a torn or empty file;
// afterwards no temp is left.
func TestRacingWriters(t *testing.T) {
	dir := privateDir(t)
	d := pinDir(t, dir, DirRule{Perm: Exact0700})
	const n = 32
	content := func(i int) []byte { return []byte(strings.Repeat(strconv.Itoa(i%10), 4096+i)) }
	wins := make(chan int, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch err := CreateAt(d, "one", content(i)); {
			case err == nil:
				wins <- i
			case !errors.Is(err, ErrExists):
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(wins)
	close(errs)
	for err := range errs {
		t.Errorf("create: %v", err)
	}
	var won []int
	for i := range wins {
		won = append(won, i)
	}
	if len(won) != 1 {
		t.Fatalf("%d creates won, want exactly 1", len(won))
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "one")); string(b) != string(content(won[0])) {
		t.Errorf("the created file does not hold its winner's content")
	}

	if err := ReplaceAt(d, "many", content(0)); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	bad := make(chan string, 1)
	reads := 0
	go func() {
		defer close(bad)
		for {
			select {
			case <-stop:
				return
			default:
			}
			b, err := ReadPrivateAt(d, "many", 1<<20)
			reads++
			ok := err == nil && len(b) >= 4096
			if ok {
				i := len(b) - 4096
				ok = string(b) == string(content(i))
			}
			if !ok {
				bad <- fmt.Sprintf("a reader saw %d bytes, %v", len(b), err)
				return
			}
		}
	}()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ReplaceAt(d, "many", content(i)); err != nil {
				t.Errorf("replace: %v", err)
			}
		}()
	}
	wg.Wait()
	close(stop)
	if msg, ok := <-bad; ok {
		t.Error(msg)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"many", "one"}) {
		t.Errorf("left %q", got)
	}
	t.Logf("%d reads during %d replaces", reads, n)
}

// [HOME-3] CheckDir's words when the path cannot be looked up are those of
// the home's check before the layer ("directory <path>: <errno>"): it does
// not open anything, so it must not say "open".
func TestCheckDirLookupError(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(file, "extensions.d")
	err := CheckDir(p, DirRule{})
	if want := fmt.Sprintf("directory %q: not a directory", p); err == nil || err.Error() != want || errcode.Of(err) != errcode.PathUnsafe {
		t.Fatalf("CheckDir under a file: %v, want path-unsafe, exactly %q", err, want)
	}
}
