package transfer

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/testpkg"
)

// [BND-4] [XFER-6] [LIFE-2] An adapter conflict between a received binding
// and another binding (here made by hand: the received record moved aside
// while another package was bound for its adapter, then moved back) refuses
// every reader of the registry, but retire-transfer of the received one
// still works, as retire-binding does for a bound one: the operator can
// always undo the conflict with fm itself.
func TestRetireTransferUndoesConflict(t *testing.T) {
	h, r := receive(t)
	aside := filepath.Join(tempDir(t), "aside.json")
	if err := os.Rename(r.Binding.Path, aside); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(tempDir(t), "other")
	if err := testpkg.Make(other, "org.example.other", `["file-signal"]`, `[]`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testpkg.Unlock(filepath.Dir(other)) })
	opts := exampleOptions
	opts.Dir, opts.Consents = other, nil
	b, err := host.Bind(context.Background(), h, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(aside, r.Binding.Path); err != nil {
		t.Fatal(err)
	}
	_, err = binding.Load(h)
	wantCode(t, err, errcode.AdapterConflict)
	if !strings.Contains(err.Error(), "retire-binding "+exampleID+" --if-binding-digest "+r.Binding.Digest) || !strings.Contains(err.Error(), "retire-binding org.example.other --if-binding-digest "+b.Digest) {
		t.Fatalf("the conflict does not name both bindings and their retire commands: %v", err)
	}
	if _, err := Retire(context.Background(), h, exampleID, r.TransferDigest, r.Binding.Digest); err != nil {
		t.Fatalf("retire-transfer of one of two conflicting bindings: %v", err)
	}
	bs, err := binding.Load(h)
	if err != nil || len(bs) != 1 || bs[0].ExtensionID != "org.example.other" {
		t.Fatalf("after retire-transfer: %v %v", bs, err)
	}
}
