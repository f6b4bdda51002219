package host_test

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// cwdAdapter answers a poll with the contents of lib/answer, read relative to
// its working directory, as a shell adapter sourcing ./lib/*.sh would.
const cwdAdapter = `#!/bin/sh
req=$(cat)
rid=$(printf '%s' "$req" | sed -n 's/.*"request_id":"\(sha256:[0-9a-f]*\)".*/\1/p')
if [ "$1" = handshake ]; then
	printf '{"adapter_names":["a"],"capability":"process-event-adapter","capability_version":1,"extension_id":"%s","extension_version":"%s","host_protocol":1,"request_id":"%s","schema":"firstmate.extension-handshake-response.v1"}' "$FIRSTMATE_EXTENSION_ID" "$FIRSTMATE_EXTENSION_VERSION" "$rid"
	exit 0
fi
printf '{"error":null,"ok":true,"request_id":"%s","result":{"output":"%s","status":"result"},"schema":"firstmate.extension-response.v1"}' "$rid" "$(cat ./lib/answer)"
`

// [INV-1] hostile review: another process keeps renaming the store
// directory above the package root (store/<id>/<version>) away and a forged
// copy of the tree in its place, and back. The package root's inode and every
// entry stay untouched, so the after-call rescan cannot see it: the working
// directory of the package must be the very root directory that was verified,
// never a name looked up again when its process is started. No call may
// answer with the forged copy's lib/answer.
func TestAncestorSwapNeverServesForgedTree(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testpkg.Unlock(dir) })
	hd := filepath.Join(dir, "home")
	os.Mkdir(hd, 0o700)
	h := &home.Home{Root: dir, Dir: hd, State: filepath.Join(hd, "state")}
	pkg := filepath.Join(dir, "pkg")
	files := map[string]string{
		"firstmate-extension.json": `{"schema":"firstmate.extension-manifest.v1","id":"org.example.cwd","version":"1.0.0","host_protocols":[1],"entrypoint":"bin/ep","capabilities":[{"name":"process-event-adapter","versions":[1],"adapter_names":["a"]}],"required_consents":[]}`,
		"bin/ep":                   cwdAdapter,
		"lib/answer":               "verified",
	}
	for rel, data := range files {
		p := filepath.Join(pkg, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if rel == "bin/ep" {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	b, err := host.Bind(context.Background(), h, host.BindOptions{Dir: pkg, Adapters: []string{"a"}, Trust: true, TimeoutMS: 20000})
	if err != nil {
		t.Fatalf("bind: %v", err)
	}
	// The forged tree: the same layout (store/<id>/<version>/<digest>), the
	// verified entrypoint, another lib/answer.
	version := filepath.Dir(b.PackageRoot)
	scratch := filepath.Join(dir, "scratch")
	forged := filepath.Join(scratch, "forged")
	aside := filepath.Join(scratch, "aside")
	if err := os.MkdirAll(forged, 0o700); err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(forged, filepath.Base(b.PackageRoot))
	if out, err := exec.Command("cp", "-a", b.PackageRoot, fake).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	if err := testpkg.WithWritableDir(filepath.Join(fake, "lib"), func() error {
		os.Remove(filepath.Join(fake, "lib", "answer"))
		return os.WriteFile(filepath.Join(fake, "lib", "answer"), []byte("forged"), 0o444)
	}); err != nil {
		t.Fatal(err)
	}
	parent := filepath.Dir(version)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var swapErr error
	var swaps int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			swapErr = testpkg.WithWritableDir(parent, func() error {
				for _, r := range [][2]string{{version, aside}, {forged, version}} {
					if err := os.Rename(r[0], r[1]); err != nil {
						return err
					}
				}
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				for _, r := range [][2]string{{version, forged}, {aside, version}} {
					if err := os.Rename(r[0], r[1]); err != nil {
						return err
					}
				}
				return nil
			})
			if swapErr != nil {
				return
			}
			swaps++
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		}
	}()
	n := testpkg.HostileCalls(t, 200)
	ty := tally{}
	for range n {
		res, err := host.Invoke(context.Background(), h, b, host.Poll,
			wire.PollInput{SourceID: "src", ConfigRef: "main"}, host.Call{Adapter: "a"})
		if err == nil {
			if out := res.Output; out != "verified" {
				ty["forged"]++
				continue
			}
			ty["ok"]++
			continue
		}
		ty[string(errcode.Of(err))]++
	}
	close(stop)
	wg.Wait()
	if swapErr != nil {
		t.Fatal(swapErr)
	}
	t.Logf("uid %d: %d calls, %d swaps: %s", os.Geteuid(), n, swaps, ty)
	if ty["forged"] != 0 {
		t.Fatalf("%d calls answered from the forged tree", ty["forged"])
	}
	assertNoRecords(t, h)
}
