// Package testpkg builds fake extension packages for tests.
//
// A fake package's entrypoint (fake-entrypoint.sh) plays every part a test
// needs, chosen per verb by the file <package state dir>/mode-<verb>, so one
// installed package (one digest) can be good, hang, flood, crash, leak a child
// or lie about its request id. It logs each request to <state>/requests and
// its environment to <state>/env-<verb>. See the script for the modes.
package testpkg

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"firstmate.dev/fm/internal/home"
)

//go:embed fake-entrypoint.sh
var entrypoint []byte

// Make writes a package at dir with id, version 1.0.0, the given adapter
// names and required consents (JSON arrays), the fake entrypoint at
// bin/firstmate-extension (0755) and the manifest (0644).
func Make(dir, id, adapters, consents string) error {
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return err
	}
	manifest := fmt.Sprintf(`{"schema":"firstmate.extension-manifest.v1","id":%q,"version":"1.0.0","host_protocols":[1],"entrypoint":"bin/firstmate-extension","capabilities":[{"name":"process-event-adapter","versions":[1],"adapter_names":%s}],"required_consents":%s}`, id, adapters, consents)
	files := map[string][]byte{"firstmate-extension.json": []byte(manifest), "bin/firstmate-extension": entrypoint}
	for rel, data := range files {
		if err := os.WriteFile(filepath.Join(dir, rel), data, 0o644); err != nil {
			return err
		}
	}
	for p, mode := range map[string]os.FileMode{dir: 0o755, filepath.Join(dir, "bin"): 0o755, filepath.Join(dir, "bin", "firstmate-extension"): 0o755, filepath.Join(dir, "firstmate-extension.json"): 0o644} {
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
	}
	return nil
}

// SetMode chooses the fake's behaviour for verb in the package state dir.
func SetMode(stateDir, verb, mode string) error {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(stateDir, "mode-"+verb), []byte(mode), 0o600)
}

// Unlock restores owner write bits under dir so a test's temp dir can be
// removed after a store was built in it (0555 directories).
func Unlock(dir string) {
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() && fi.Mode()&os.ModeSymlink == 0 {
			os.Chmod(p, fi.Mode().Perm()|0o700)
		}
		return nil
	})
}

// Home makes a throwaway home for a test: a canonical temp directory dir
// (symlinks resolved, so the home's paths are canonical as fm requires)
// holding home/ (0700) and a fake package at dir/pkg enabling adapter
// "fake" (Make). The sealed store is made removable again at cleanup.
func Home(t testing.TB) (h *home.Home, pkg string) {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unlock(dir) })
	hd := filepath.Join(dir, "home")
	if err := os.Mkdir(hd, 0o700); err != nil {
		t.Fatal(err)
	}
	pkg = filepath.Join(dir, "pkg")
	if err := Make(pkg, "org.example.fake", `["fake"]`, `[]`); err != nil {
		t.Fatal(err)
	}
	return &home.Home{Root: dir, Dir: hd, State: filepath.Join(hd, "state")}, pkg
}

// WriteFile writes data to path with exactly mode (whatever the umask),
// creating missing parent directories with parentMode, or fails the test.
func WriteFile(t testing.TB, path, data string, parentMode, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), parentMode); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}
