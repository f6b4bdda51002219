package host

import (
	"os"
	"path/filepath"

	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
)

// TempDirs are the directories of the home whose writers all hold the
// lifecycle lock: config/ (where a binding is written before it is renamed
// into extensions.d) and every data/extensions/packages/<id>/<version>/
// (where a store copy is built). A temp found in one by a holder of that
// lock was left by a killed writer (fsutil.SweepTemps).
func TempDirs(h *home.Home) []string {
	dirs := []string{filepath.Dir(h.Bindings())}
	ids, _ := os.ReadDir(h.Packages())
	for _, id := range ids {
		if !id.IsDir() { // not a symlink: a sweep never leaves the store
			continue
		}
		versions, _ := os.ReadDir(filepath.Join(h.Packages(), id.Name()))
		for _, v := range versions {
			if v.IsDir() {
				dirs = append(dirs, filepath.Join(h.Packages(), id.Name(), v.Name()))
			}
		}
	}
	return dirs
}

// SweepTemps removes what killed lifecycle-lock holders left in TempDirs:
// partial store copies and unpublished bindings. The caller holds the
// lifecycle lock. It is best effort: what it cannot remove stays, and fm
// doctor reports it.
func SweepTemps(h *home.Home) {
	for _, d := range TempDirs(h) {
		fsutil.SweepTemps(d, true)
	}
}
