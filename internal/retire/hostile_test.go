package retire_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/retire"
	"firstmate.dev/fm/internal/transfer"
)

// [LIFE-2] The binding-move step under a hostile home: a retained-bindings
// directory that is a symlink or group-writable, a retained file of other
// bytes at the destination, and a binding file swapped for a symlink or given
// a second link right before the move are each refused, the binding stays
// enabled and nothing is written through the link.
func TestMoveStepHostile(t *testing.T) {
	ctx := context.Background()
	dstDir := func(h *home.Home) string { return filepath.Join(h.RetiredBindings(), fakeID) }
	for _, c := range []struct {
		name    string
		prepare func(t *testing.T, h *home.Home, b *binding.Binding)
		code    errcode.Code
	}{
		{"retired dir is a symlink", func(t *testing.T, h *home.Home, b *binding.Binding) {
			elsewhere := filepath.Join(h.Root, "elsewhere")
			mkdir(t, elsewhere, 0o700)
			mkdir(t, h.RetiredBindings(), 0o700)
			if err := os.Symlink(elsewhere, dstDir(h)); err != nil {
				t.Fatal(err)
			}
		}, errcode.LinkUnsafe},
		{"retired dir group-writable", func(t *testing.T, h *home.Home, b *binding.Binding) {
			mkdir(t, dstDir(h), 0o700)
			if err := os.Chmod(dstDir(h), 0o770); err != nil {
				t.Fatal(err)
			}
		}, errcode.ModeUnsafe},
		{"other bytes retained at the destination", func(t *testing.T, h *home.Home, b *binding.Binding) {
			mkdir(t, dstDir(h), 0o700)
			if err := os.WriteFile(filepath.Join(dstDir(h), binding.Hex(b.Digest)+".json"), []byte("{}"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, errcode.Internal},
		{"binding swapped for a symlink before the move", func(t *testing.T, h *home.Home, b *binding.Binding) {
			retire.SetBeforeMove(t, func(got *binding.Binding) {
				copyTo := filepath.Join(h.Root, "copy.json")
				data, _ := os.ReadFile(got.Path)
				if err := os.WriteFile(copyTo, data, 0o600); err != nil {
					t.Fatal(err)
				}
				link := filepath.Join(h.Root, "link.json")
				if err := os.Symlink(copyTo, link); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(link, got.Path); err != nil {
					t.Fatal(err)
				}
			})
		}, errcode.LinkUnsafe},
		{"binding given a second link before the move", func(t *testing.T, h *home.Home, b *binding.Binding) {
			retire.SetBeforeMove(t, func(got *binding.Binding) {
				if err := os.Link(got.Path, filepath.Join(h.Root, "second.json")); err != nil {
					t.Fatal(err)
				}
			})
		}, errcode.LinkUnsafe},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, b := bound(t)
			c.prepare(t, h, b)
			_, err := retire.Binding(ctx, h, fakeID, b.Digest)
			if !errcode.Is(err, c.code) {
				t.Fatalf("%v, want error[%s]", err, c.code)
			}
			if _, err := os.Lstat(b.Path); err != nil {
				t.Fatalf("the enabled binding is gone: %v", err)
			}
			if ents, _ := os.ReadDir(filepath.Join(h.Root, "elsewhere")); len(ents) != 0 {
				t.Fatalf("a retire wrote through the link: %v", ents)
			}
		})
	}
}

// [LIFE-1] [LIFE-2] Retirements racing for one binding: exactly one of
// eight concurrent retire.Binding calls retires it; every other finds it gone
// (binding-missing), and the retained file is the enabled one.
func TestConcurrentRetire(t *testing.T) {
	h, b := bound(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = retire.Binding(context.Background(), h, fakeID, b.Digest)
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errcode.Is(err, errcode.BindingMissing):
			t.Errorf("a losing retire: %v, want binding-missing", err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d retirements succeeded, want exactly 1: %v", ok, errs)
	}
	if data, err := os.ReadFile(filepath.Join(h.RetiredBindings(), fakeID, binding.Hex(b.Digest)+".json")); err != nil || binding.Digest(data) != b.Digest {
		t.Fatalf("retained: %v", err)
	}
}

func mkdir(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(p, mode); err != nil {
		t.Fatal(err)
	}
}

// [XFER-6] retire-transfer's unit swapped for a symlink to a copy of itself
// between its validation and the binding move is refused (link-unsafe): the
// binding is never moved through the link, out of the staging area.
func TestTransferUnitSwappedBeforeMove(t *testing.T) {
	h, r := received(t)
	moved := filepath.Join(h.Root, "unit-copy")
	retire.SetBeforeMove(t, func(*binding.Binding) {
		if err := os.Rename(r.Unit, moved); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(moved, r.Unit); err != nil {
			t.Fatal(err)
		}
	})
	_, err := transfer.Retire(context.Background(), h, fakeID, r.TransferDigest, r.Binding.Digest)
	if !errcode.Is(err, errcode.LinkUnsafe) {
		t.Fatalf("%v, want link-unsafe", err)
	}
	if _, err := os.Lstat(r.Binding.Path); err != nil {
		t.Fatalf("the enabled binding is gone: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(moved, transfer.BindingFile)); !os.IsNotExist(err) {
		t.Fatalf("the binding was moved through the link: %v", err)
	}
}

// [XFER-6] retire-transfer's unit moved away between its validation and the
// binding move is refused (path-unsafe; before the one move step,
// internal): the binding stays enabled, and no unit is made up in its place
// (a unit holding only a binding.json would be retired into retired-staging
// without its package and receipt, and the operator told it was retired).
func TestTransferUnitGoneBeforeMove(t *testing.T) {
	h, r := received(t)
	moved := filepath.Join(h.Root, "unit-away")
	retire.SetBeforeMove(t, func(*binding.Binding) {
		if err := os.Rename(r.Unit, moved); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := transfer.Retire(context.Background(), h, fakeID, r.TransferDigest, r.Binding.Digest); !errcode.Is(err, errcode.PathUnsafe) {
		t.Fatalf("%v, want path-unsafe", err)
	}
	if _, err := os.Lstat(r.Binding.Path); err != nil {
		t.Fatalf("the enabled binding is gone: %v", err)
	}
	for _, p := range []string{r.Unit, h.RetiredStaging()} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Fatalf("%s was made up by the retire: %v", p, err)
		}
	}
}
