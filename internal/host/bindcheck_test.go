package host_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/testpkg"
)

// [BIND-6] [INV-1] a bind's handshake that damages the store copy it runs
// in, as a hostile or careless package would (new files, directories and
// FIFOs, chmod 0000, symlinks and hard links out of and into the copy, the
// copy swapped for a symlink): the bind is refused, nothing is published,
// the copy this bind created is gone, and nothing outside it (what the links
// name) is touched. Run as root and as uid 65534, where the package owns the
// copy and can chmod it.
//
// The home's confinement is off: what is tested is what fm finds after
// package code damaged its copy, which confinement mostly prevents (a hard
// link out of the copy is refused by the kernel; see TestConfinement*).
func TestBindRemovesCopyDamagedByHandshake(t *testing.T) {
	h, pkg := testpkg.Home(t)
	if err := confine.WriteMode(h.Config(), confine.Off); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(h.Root, "outside")
	if err := os.MkdirAll(filepath.Join(out, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"keep", "hard"} {
		if err := os.WriteFile(filepath.Join(out, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(out, 0o555); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, out)
	state := h.ExtensionState("org.example.fake")
	if err := testpkg.SetMode(state, "handshake", "script"); err != nil {
		t.Fatal(err)
	}
	q := func(s string) string { return "'" + s + "'" }
	attacks := []struct{ name, script string }{
		{"files, a sealed directory, a FIFO", `chmod u+w . && mkdir d && : >d/f && chmod 0 d && mkfifo ff && : >new`},
		{"chmod 0000 of a directory", `chmod 0 bin`},
		{"chmod 0000 of the copy", `chmod 0 .`},
		{"chmod of the copy only", `chmod 0755 .`},
		{"symlinks out", `chmod u+w . && ln -s ` + q(out) + ` out && ln -s ` + q(filepath.Join(out, "keep")) + ` keep && ln -s .. up && chmod 0555 .`},
		{"a hard link in", `chmod u+w . && ln ` + q(filepath.Join(out, "hard")) + ` hard && chmod 0555 .`},
		{"a hard link out", `ln bin/firstmate-extension "$FIRSTMATE_EXTENSION_STATE/hl"`},
		{"the copy's version directory removed", `cd ../.. && chmod -R u+w 1.0.0 && rm -rf 1.0.0`},
		{"the copy swapped for a symlink", `h=$(basename "$PWD") && cd .. && chmod u+w . && mv "$h" "$h.old" && ln -s ` + q(out) + ` "$h"`},
	}
	for _, a := range attacks {
		if err := os.WriteFile(filepath.Join(state, "script"), []byte(a.script+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := host.Bind(context.Background(), h, host.BindOptions{Dir: pkg, Adapters: []string{"fake"}, Trust: true})
		if err == nil || !strings.Contains(err.Error(), "this bind had created it, and removed it again") {
			t.Fatalf("%s: bind gave %v (%s), want a refusal that removed the copy", a.name, err, errcode.Of(err))
		}
		if bs, err := binding.Load(h); err != nil || len(bs) != 0 {
			t.Fatalf("%s: bindings %v, %v; want none published", a.name, bs, err)
		}
		versions := filepath.Join(h.Dir, "data", "extensions", "packages", "org.example.fake", "1.0.0")
		names, _ := os.ReadDir(versions)
		for _, n := range names {
			if !strings.HasSuffix(n.Name(), ".old") {
				t.Fatalf("%s: %s is still in the store", a.name, n.Name())
			}
		}
		if got := snapshot(t, out); got != before {
			t.Fatalf("%s: outside changed:\n%s\nwant\n%s", a.name, got, before)
		}
		os.Remove(filepath.Join(state, "hl"))
	}
}

// snapshot lists every entry under dir with its mode and, for a file, its
// content and link count.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %v", p, fi.Mode())
		if fi.Mode().IsRegular() {
			data, _ := os.ReadFile(p)
			line += fmt.Sprintf(" %q %d links", data, fi.Sys().(*syscall.Stat_t).Nlink)
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
