package testpkg

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// builtFM is the fm binary built once per test binary when FM_TEST_BIN is
// not set; RemoveBuiltFM removes it.
var builtFM struct {
	once sync.Once
	dir  string // temp directory holding bin/fm
	path string
	skip string // why fm cannot be built here
	err  error
}

// FM returns the fm binary to test against: $FM_TEST_BIN when set (as
// scripts/test-unprivileged.sh does), else fm built once from this module
// with the Go toolchain in PATH (`go test` puts its own first), else it
// skips the test. A TestMain that lets a test call it calls RemoveBuiltFM
// after m.Run.
func FM(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("FM_TEST_BIN"); p != "" {
		return p
	}
	builtFM.once.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			builtFM.skip = "no FM_TEST_BIN and no Go toolchain in PATH to build fm"
			return
		}
		dir, err := os.MkdirTemp("", "fm-bin-")
		if err != nil {
			builtFM.err = err
			return
		}
		builtFM.dir = dir
		builtFM.path = filepath.Join(dir, "bin", "fm")
		if err := os.Mkdir(filepath.Dir(builtFM.path), 0o755); err != nil {
			builtFM.err = err
			return
		}
		out, err := exec.Command(goTool, "build", "-o", builtFM.path, "firstmate.dev/fm/cmd/fm").CombinedOutput()
		if err != nil {
			builtFM.err = fmt.Errorf("go build firstmate.dev/fm/cmd/fm: %v\n%s", err, out)
		}
	})
	if builtFM.skip != "" {
		t.Skip(builtFM.skip)
	}
	if builtFM.err != nil {
		t.Fatal(builtFM.err)
	}
	return builtFM.path
}

// RemoveBuiltFM removes the fm that FM built, if any.
func RemoveBuiltFM() {
	if builtFM.dir != "" {
		os.RemoveAll(builtFM.dir)
	}
}
