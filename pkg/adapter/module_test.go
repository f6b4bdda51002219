package adapter_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"firstmate.dev/fm/pkg/adapter"
	"firstmate.dev/fm/pkg/adapter/adaptertest"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// outsideMain is the smallest adapter an author outside this repository
// writes: one main package importing the SDK.
const outsideMain = `package main

import (
	"context"

	"firstmate.dev/fm/pkg/adapter"
)

type tick struct{}

func (tick) Identity() adapter.Identity {
	return adapter.Identity{ExtensionID: "org.example.tick", ExtensionVersion: "1.0.0", AdapterNames: []string{"tick"}}
}

func (tick) Poll(context.Context, *adapter.Call, adapter.PollInput) (adapter.PollResult, error) {
	return adapter.Output("tick"), nil
}

func (tick) Classify(context.Context, *adapter.Call, adapter.ResultInput) (adapter.ClassifyResult, error) {
	return adapter.ClassifyResult{Classification: "tick"}, nil
}

func (tick) Terminal(context.Context, *adapter.Call, adapter.ResultInput) (adapter.BoolResult, error) {
	return adapter.BoolResult{}, nil
}

func (tick) Silent(context.Context, *adapter.Call, adapter.ResultInput) (adapter.BoolResult, error) {
	return adapter.BoolResult{}, nil
}

func main() { adapter.Serve(tick{}) }
`

// [EX-2] What the package documentation tells a Go author outside this
// repository works, offline: a module of their own that requires
// firstmate.dev/fm, replaces it with a checkout, and starts from the
// checkout's go.sum builds with GOFLAGS=-mod=mod GOPROXY=off (the SDK's
// dependencies come from the module cache), and the binary answers a
// handshake. Skipped under -short, and where the module cache does not hold
// the SDK's dependencies (a user without Go caches cannot build offline).
func TestOutsideModuleBuildsOffline(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module (-short)")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go in PATH")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !bytes.HasPrefix(gomod, []byte("module firstmate.dev/fm\n")) {
		t.Fatalf("%s is not the fm module: %v", root, err)
	}
	out, err := exec.Command(goTool, "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	cache := strings.TrimSpace(string(out))
	for _, m := range regexp.MustCompile(`(?m)^\t(github\.com/go-json-experiment/json|golang\.org/x/sys) (v\S+)`).FindAllStringSubmatch(string(gomod), -1) {
		zip := filepath.Join(cache, "cache", "download", m[1], "@v", m[2]+".zip")
		if _, err := os.Stat(zip); err != nil {
			t.Skipf("the module cache has no %s@%s, so no offline build can work here: %v", m[1], m[2], err)
		}
	}

	dir := t.TempDir()
	files := map[string]string{
		"go.mod":  "module example.com/tick\n\ngo 1.26\n\nrequire firstmate.dev/fm v0.0.0\n\nreplace firstmate.dev/fm => " + root + "\n",
		"main.go": outsideMain,
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	files["go.sum"] = string(sum)
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command(goTool, "build", "-o", "tick", ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod -buildvcs=false", "GOPROXY=off", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build outside the repository: %v\n%s", err, out)
	}

	h := adaptertest.New(t, quietTick{})
	req := h.HandshakeRequest()
	data, err := wire.Canonical(req)
	if err != nil {
		t.Fatal(err)
	}
	run := exec.Command(filepath.Join(dir, "tick"), "handshake")
	run.Stdin = bytes.NewReader(data)
	stdout, err := run.Output()
	if err != nil {
		t.Fatalf("tick handshake: %v", err)
	}
	_, err = adaptertest.DecodeHandshakeResponse(req, stdout)
	if err != nil {
		t.Fatal(err)
	}
}

// quietTick has the identity of outsideMain's adapter, for building requests.
type quietTick struct{ noisy }

func (quietTick) Identity() adapter.Identity {
	return adapter.Identity{ExtensionID: "org.example.tick", ExtensionVersion: "1.0.0", AdapterNames: []string{"tick"}}
}
