package testpkg_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/testpkg"
)

// ReturnsAny sees every form of a result of type any in an exported
// function or method (any, interface{}, a local alias, a named result), and
// nothing else: not an unexported function, not a non-empty interface.
func TestReturnsAny(t *testing.T) {
	dir := t.TempDir()
	src := "package p\n\ntype Loose = interface{}\n\n" +
		"func A() (any, error) { return nil, nil }\n" +
		"func B() interface{} { return nil }\n" +
		"func C() (x int, y Loose) { return }\n" +
		"func d() any { return nil }\n" +
		"type T struct{}\n\nfunc (T) E() any { return nil }\n" +
		"func F() interface{ M() } { return nil }\n" +
		"func G[V any]() *V { return nil }\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p_test.go"), []byte("package p\n\nfunc H() any { return nil }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	found, err := testpkg.ReturnsAny(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(found, "; "); got != "p.go:5: A; p.go:6: B; p.go:7: C; p.go:11: E" {
		t.Fatalf("the checker found %q", got)
	}
}

// [PROTO-2] Every operation has its typed result: no exported function of
// the host or procevent packages returns any (issue 11), so no caller
// asserts the type of an answer. TestReturnsAny proves the checker sees the
// forms of any.
func TestNoExportedFunctionReturnsAny(t *testing.T) {
	for _, dir := range []string{"../host", "../procevent"} {
		found, err := testpkg.ReturnsAny(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(found) > 0 {
			t.Errorf("%s: exported functions return any: %s", dir, strings.Join(found, "; "))
		}
	}
}
