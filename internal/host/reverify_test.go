package host

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/testpkg"
)

// [INV-1] [BIND-6] bind's revalidation before its handshake builds on the
// install's verification of the store copy instead of hashing the copy
// again, but a change of the copy in between is still caught: bytes
// changed in place (size and mode restored) refuse the bind with
// integrity-mismatch before any package code runs (the fake package logs
// every request it gets) and publish nothing; the same bytes rewritten are
// hashed again and bound. Run as root and as uid 65534, who owns the copy
// and can chmod it.
func TestBindRevalidatesCopyChangedAfterInstall(t *testing.T) {
	rewrite := func(t *testing.T, p, data string) {
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name   string
		change func(t *testing.T, root string)
		want   errcode.Code
	}{
		{"unchanged", func(*testing.T, string) {}, ""},
		{"manifest bytes changed in place", func(t *testing.T, root string) {
			p := filepath.Join(root, "firstmate-extension.json")
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			data[len(data)-2] ^= 1 // one byte, same size
			rewrite(t, p, string(data))
		}, errcode.IntegrityMismatch},
		{"manifest rewritten with the same bytes", func(t *testing.T, root string) {
			p := filepath.Join(root, "firstmate-extension.json")
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			rewrite(t, p, string(data))
		}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, pkg := testpkg.Home(t)
			changed := false
			afterInstall = func(root string) {
				changed = true
				c.change(t, root)
			}
			t.Cleanup(func() { afterInstall = nil })
			_, err := Bind(context.Background(), h, BindOptions{Dir: pkg, Adapters: []string{"fake"}, Trust: true})
			if !changed {
				t.Fatal("the bind never installed")
			}
			requests := filepath.Join(h.ExtensionState("org.example.fake"), "requests")
			if c.want == "" {
				if err != nil {
					t.Fatalf("bind: %v", err)
				}
				if _, err := os.Stat(requests); err != nil {
					t.Fatalf("the handshake never ran: %v", err)
				}
				return
			}
			if errcode.Of(err) != c.want {
				t.Fatalf("bind gave [%s] %v, want %s", errcode.Of(err), err, c.want)
			}
			if _, err := os.Stat(requests); !os.IsNotExist(err) {
				t.Fatalf("package code ran on a changed copy (%v)", err)
			}
			if bs, err := binding.Load(h); err != nil || len(bs) != 0 {
				t.Fatalf("bindings %v, %v; want none published", bs, err)
			}
		})
	}
}
