package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"firstmate.dev/fm/examples/go-adapter/dirsignal"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/pkg/adapter"
	"firstmate.dev/fm/pkg/adapter/adaptertest"
)

// noisyName is the entrypoint name under which the test binary serves
// noisy (testdata/noisy-extension.json names it); see TestMain.
const noisyName = "noisy-extension"

// noisy is dir-signal written by a careless author: a debug line on stdout
// in the handshake's Identity and in every Poll.
type noisy struct{ *dirsignal.Handler }

func (n noisy) Identity() adapter.Identity {
	fmt.Println("debug: identity")
	return n.Handler.Identity()
}

func (n noisy) Poll(ctx context.Context, call *adapter.Call, in adapter.PollInput) (adapter.PollResult, error) {
	fmt.Printf("debug: polling %s\n", in.SourceID)
	return n.Handler.Poll(ctx, call, in)
}

// [EX-2] [INV-4] A built adapter whose handler prints to stdout still binds
// (the handshake is one clean document) and its poll is captured byte for
// byte through the real fm: Serve keeps fd 1 off the response channel, and
// the stray lines land on the package's stderr, which fm discards.
func TestStrayStdoutUnderRealFM(t *testing.T) {
	h := adaptertest.NewHome(t, testpkg.FM(t))
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pkg := h.EntrypointPackage(filepath.Join("testdata", noisyName+".json"), exe)
	h.Bind(pkg, []string{dirsignal.AdapterName}, []string{"artifact-references"}, "--timeout-ms", "60000")
	signals := t.TempDir()
	h.Register(dirsignal.AdapterName, "noisy", "dir:"+signals)
	want := "built despite the noise\n"
	if err := os.WriteFile(filepath.Join(signals, "001"), []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	r := h.Start("noisy")
	if r.Status != adaptertest.Captured {
		t.Fatalf("start: %+v", r)
	}
	if got, err := os.ReadFile(r.Path); err != nil || string(got) != want {
		t.Fatalf("captured %q, %v; want %q (evidence instead of the output means the response broke)", got, err, want)
	}
}
