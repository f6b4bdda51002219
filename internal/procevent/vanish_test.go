package procevent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
)

// [RUN-3] [REG-2] The registration reader under churn: a registration
// retired between the listing and its read is not there, and one replaced
// by a new generation (a rename over its name) is read as that generation;
// neither fails the listing. Both are injected between the listing and the
// reads.
func TestSourcesVanished(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h := &home.Home{Root: filepath.Join(base, "root"), Dir: filepath.Join(base, "home")}
	h.State = filepath.Join(h.Dir, "state")
	script := host.BuiltinScript(h, "x")
	if err := os.MkdirAll(filepath.Dir(script), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(h.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var regs []*Registration
	for _, id := range []string{"s1", "s2", "s3"} {
		r, err := Register(h, "x", id, []string{"/bin/true"})
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, r)
	}
	// A new generation of s2: its record with another owner token.
	newer := filepath.Join(h.Dir, "s2.newer")
	s2, err := os.ReadFile(filepath.Join(h.Registrations(), "s2.source"))
	if err != nil {
		t.Fatal(err)
	}
	gen := strings.Replace(string(s2), regs[1].Token, regs[2].Token, 1)
	if err := os.WriteFile(newer, []byte(gen), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { afterSourceList = nil })
	afterSourceList = func([]string) {
		if err := os.Remove(filepath.Join(h.Registrations(), "s1.source")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(newer, filepath.Join(h.Registrations(), "s2.source")); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Sources(h)
	if err != nil {
		t.Fatalf("a listing with one registration retired and one replaced: %v", err)
	}
	if len(got) != 2 || got[0].SourceID != "s2" || got[0].Token != regs[2].Token || got[1].SourceID != "s3" {
		t.Fatalf("got %+v; want s2 (its new generation) and s3", got)
	}
}
