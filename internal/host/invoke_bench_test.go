package host_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// floorFlags build testdata/floor.c as small as an entrypoint can be: on
// x86_64 without libc or dynamic loader (about 1.5 KB); elsewhere static
// with libc, or as a last resort dynamic.
func floorFlags() [][]string {
	var fs [][]string
	if runtime.GOARCH == "amd64" {
		fs = append(fs, []string{"-Os", "-static", "-nostdlib", "-ffreestanding", "-fno-stack-protector", "-fno-pie", "-no-pie",
			"-fno-tree-loop-distribute-patterns", "-fno-asynchronous-unwind-tables", "-DFLOOR_NOLIBC",
			"-Wl,--build-id=none,-z,noseparate-code", "-s"})
	}
	return append(fs, []string{"-Os", "-static", "-s"}, []string{"-Os", "-s"})
}

// buildFloor compiles the trivial entrypoint testdata/floor.c into dir, or
// skips the benchmark when gcc is absent.
func buildFloor(tb testing.TB, dir string) string {
	tb.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		tb.Skip("gcc is not installed: the trivial compiled entrypoint (testdata/floor.c) cannot be built")
	}
	src, err := filepath.Abs(filepath.Join("testdata", "floor.c"))
	if err != nil {
		tb.Fatal(err)
	}
	out := filepath.Join(dir, "floor")
	var msgs []byte
	for _, flags := range floorFlags() {
		msg, err := exec.Command(gcc, append(flags, "-o", out, src)...).CombinedOutput()
		if err == nil {
			return out
		}
		msgs = append(msgs, msg...)
	}
	tb.Skipf("gcc cannot build testdata/floor.c: %s", msgs)
	return ""
}

// floorPackage writes package org.example.floor@1.0.0 (adapter "floor")
// with the compiled floor entrypoint, binds it into a fresh home and returns
// the home and the binding.
func floorPackage(b *testing.B) (*home.Home, *binding.Binding) {
	dir, err := filepath.EvalSymlinks(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unlockAll(dir) })
	pkg := filepath.Join(dir, "pkg")
	if err := os.MkdirAll(filepath.Join(pkg, "bin"), 0o755); err != nil {
		b.Fatal(err)
	}
	floor := buildFloor(b, dir)
	if err := os.Rename(floor, filepath.Join(pkg, "bin", "floor")); err != nil {
		b.Fatal(err)
	}
	manifest := `{"schema":"firstmate.extension-manifest.v1","id":"org.example.floor","version":"1.0.0","host_protocols":[1],"entrypoint":"bin/floor","capabilities":[{"name":"process-event-adapter","versions":[1],"adapter_names":["floor"]}],"required_consents":[]}`
	if err := os.WriteFile(filepath.Join(pkg, "firstmate-extension.json"), []byte(manifest), 0o644); err != nil {
		b.Fatal(err)
	}
	hd := filepath.Join(dir, "home")
	if err := os.Mkdir(hd, 0o700); err != nil {
		b.Fatal(err)
	}
	h := &home.Home{Root: dir, Dir: hd, State: filepath.Join(hd, "state")}
	bd, err := host.Bind(context.Background(), h, host.BindOptions{Dir: pkg, Adapters: []string{"floor"}, Trust: true})
	if err != nil {
		b.Fatal(err)
	}
	return h, bd
}

func unlockAll(dir string) {
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
}

// BenchmarkInvoke measures one complete host.Invoke of source.poll on a
// trivial compiled entrypoint (re-read the binding, revalidate the installed
// tree, handshake, invoke: two launch barriers, owner records, group proofs)
// against its floor: two bare execs of the same entrypoint, handshake then
// invoke, fed the same kind of request documents, with the same working
// directory and environment. The two sides alternate in every iteration, so
// load drift hits both; it reports the median of each (fm-ns/op,
// bare2-ns/op) and their ratio (fm/bare2).
//
//	go test -run '^$' -bench Invoke ./internal/host/
func BenchmarkInvoke(b *testing.B) {
	h, bd := floorPackage(b)
	env, err := host.Environment(h, &bd.Record)
	if err != nil {
		b.Fatal(err)
	}
	entry := filepath.Join(bd.PackageRoot, filepath.FromSlash(bd.Entrypoint))
	hs, inv := floorRequests(b, bd)
	bare := func(verb, stdin string) {
		in, err := os.Open(stdin)
		if err != nil {
			b.Fatal(err)
		}
		defer in.Close()
		null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer null.Close()
		p, err := os.StartProcess(entry, []string{entry, verb}, &os.ProcAttr{Dir: bd.PackageRoot, Env: env, Files: []*os.File{in, null, null}})
		if err != nil {
			b.Fatal(err)
		}
		if st, err := p.Wait(); err != nil || !st.Success() {
			b.Fatalf("bare %s: %v %v", verb, st, err)
		}
	}
	call, in := host.Call{Adapter: "floor"}, wire.PollInput{SourceID: "bench", ConfigRef: "bench"}
	var fm, floor []time.Duration
	for b.Loop() {
		t0 := time.Now()
		res, err := host.Invoke(context.Background(), h, bd, host.Poll, in, call)
		t1 := time.Now()
		if err != nil || res.Status != "no-result" {
			b.Fatalf("invoke: %v %v", res, err)
		}
		bare("handshake", hs)
		bare("invoke", inv)
		t2 := time.Now()
		fm, floor = append(fm, t1.Sub(t0)), append(floor, t2.Sub(t1))
	}
	mf, mb := medianOf(fm), medianOf(floor)
	b.ReportMetric(float64(mf.Nanoseconds()), "fm-ns/op")
	b.ReportMetric(float64(mb.Nanoseconds()), "bare2-ns/op")
	b.ReportMetric(float64(mf)/float64(mb), "fm/bare2")
}

// BenchmarkRevalidate measures the revalidation of the floor package alone
// (the complete installed tree, its digest, manifest and entrypoint
// digests), which Invoke runs once before the handshake.
func BenchmarkRevalidate(b *testing.B) {
	_, bd := floorPackage(b)
	for b.Loop() {
		if err := host.Revalidate(&bd.Record); err != nil {
			b.Fatal(err)
		}
	}
}

// floorRequests writes a handshake and a source.poll request for bd, encoded
// as the host encodes them, and returns their paths.
func floorRequests(b *testing.B, bd *binding.Binding) (handshake, invoke string) {
	c := bd.Capabilities[0]
	hs := wire.HandshakeRequest{
		Schema: wire.HandshakeRequestSchema, RequestID: protocol.NewRequestID(), HostProtocols: protocol.HostProtocols,
		ExtensionID: bd.ExtensionID, ExtensionVersion: bd.ExtensionVersion, PackageDigest: bd.PackageDigest,
		Capability: wire.HandshakeCapability{Name: c.Name, Versions: []int64{c.Version}, AdapterNames: c.AdapterNames},
	}
	inv := wire.Request{
		Schema: wire.RequestSchema, RequestID: protocol.NewRequestID(), HostProtocol: bd.HostProtocol,
		ExtensionID: bd.ExtensionID, ExtensionVersion: bd.ExtensionVersion, PackageDigest: bd.PackageDigest,
		Capability: wire.CapabilityName, CapabilityVersion: c.Version, Adapter: "floor", Operation: wire.OpPoll,
		Input: []byte(`{"config_ref":"bench","source_id":"bench"}`),
	}
	dir := b.TempDir()
	handshake, invoke = filepath.Join(dir, "handshake.json"), filepath.Join(dir, "invoke.json")
	for path, v := range map[string]any{handshake: hs, invoke: inv} {
		data, err := strictjson.Canonical(v)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	return handshake, invoke
}

func medianOf(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
