package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/testpkg"
)

// [EX-2] the SDK-built adapter binds into a real home through the real host
// (revalidation, launch barrier, handshake, strict envelopes) and a captured
// signal comes out of the generic runner, byte for byte.
func TestBindAndCaptureEndToEnd(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testpkg.Unlock(base) })
	pkg := filepath.Join(base, "pkg")
	if err := os.MkdirAll(filepath.Join(pkg, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, "firstmate-extension.json", filepath.Join(pkg, "firstmate-extension.json"), 0o644)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, exe, filepath.Join(pkg, "bin", "firstmate-extension"), 0o755)

	hd := filepath.Join(base, "home")
	if err := os.Mkdir(hd, 0o700); err != nil {
		t.Fatal(err)
	}
	h := &home.Home{Root: base, Dir: hd, State: filepath.Join(hd, "state")}
	ctx := context.Background()
	b, err := host.Bind(ctx, h, host.BindOptions{Dir: pkg, Adapters: []string{"dir-signal"}, Trust: true,
		Consents: []string{"artifact-references"}, TimeoutMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	if b.ExtensionID != "org.firstmate.example.dir-signal" {
		t.Fatalf("bound %s", b.ExtensionID)
	}

	signals := filepath.Join(base, "signals")
	if err := os.Mkdir(signals, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := procevent.RegisterExtension(ctx, h, "dir-signal", "e2e", "dir:"+signals); err != nil {
		t.Fatal(err)
	}
	want := "deploy finished: \"ok\" ✓\n"
	if err := os.WriteFile(filepath.Join(signals, "001"), []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := procevent.Start(ctx, h, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	if out.Status != procevent.Captured || out.Evidence {
		t.Fatalf("outcome %+v", out)
	}
	got, err := os.ReadFile(out.Path)
	if err != nil || string(got) != want {
		t.Fatalf("captured %q, %v; want %q", got, err, want)
	}
	class, err := procevent.Classify(ctx, h, out.Path)
	if err != nil || class != "dir-signal" {
		t.Fatalf("classify: %q %v", class, err)
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, mode); err != nil {
		t.Fatal(err)
	}
}
