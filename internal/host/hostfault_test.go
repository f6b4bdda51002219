package host

import (
	"context"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/testpkg"
)

// [OP-3] [CLI-3] [INV-1] a revalidation after package code ran that fails
// because the host is out of descriptors is host-resource and says so: it
// neither calls the package tampered with nor claims the binding stays
// refused, and the very same tree verifies once descriptors are back.
func TestRecheckOutOfFilesIsNotTamper(t *testing.T) {
	h, pkg := testpkg.Home(t)
	b, err := Bind(context.Background(), h, BindOptions{Dir: pkg, Adapters: []string{"fake"}, Trust: true, TimeoutMS: 20000})
	if err != nil {
		t.Fatal(err)
	}
	v, err := verify(&b.Record, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.close()
	for spare := range 3 {
		restore := testpkg.StarveFiles(t, spare)
		err := v.recheck(&b.Record, "invoke")
		restore()
		if errcode.Of(err) != errcode.HostResource {
			t.Fatalf("spare %d: got %v, want host-resource", spare, err)
		}
		if msg := err.Error(); strings.Contains(msg, "tamper") || strings.Contains(msg, "stays refused") {
			t.Fatalf("spare %d: a host fault is described as tampering: %v", spare, err)
		}
	}
	if err := v.recheck(&b.Record, "invoke"); err != nil {
		t.Fatalf("with descriptors back: %v", err)
	}
}
