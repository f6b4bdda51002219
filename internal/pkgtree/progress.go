package pkgtree

import "sync"

// Progress receives the advance of ScanWith and InstallWith, for an
// operator's progress display. stage says what is being done to the tree's
// files: "hashing" (a scan of a source tree), "verifying" (a scan of an
// installed tree) or "copying" (the build of a store copy). files and bytes
// count what is done of the tree's totalFiles files and totalBytes bytes of
// content.
//
// It is called once per stage with nothing done, once the walk has counted
// the tree and before any file is read, then after every file; a
// verification that proves the files without reading them (Install's proof
// of its own copy) reports its end right after its start. Calls never
// overlap (the hashing workers take turns), so it must return quickly and
// must not call into pkgtree.
type Progress func(stage string, files, totalFiles int, bytes, totalBytes int64)

// Options are the optional hooks of ScanWith and InstallWith. The zero
// value is Scan and Install.
type Options struct {
	// Progress, when set, receives the advance of every stage.
	Progress Progress
	// Keep, when set, is the relative path of a file of the tree whose
	// descriptor ScanWith keeps open in Tree.Kept: the very open file whose
	// bytes it hashed, so a caller can use exactly the inode that was
	// validated (the host executes the entrypoint through it, [INV-1]).
	// With Keep the scan also keeps its open root directory in
	// Tree.Root.
	Keep string
}

// Stages reported to Progress.
const (
	StageHashing   = "hashing"
	StageVerifying = "verifying"
	StageCopying   = "copying"
)

// stage names what a scan under policy p does.
func (p Policy) stage() string {
	if p == Installed {
		return StageVerifying
	}
	return StageHashing
}

// metered wraps fn, the per-file work of eachFile over the walked tree w,
// so that o.Progress sees stage advance; without a Progress it returns fn
// unchanged.
func (o Options) metered(w *walker, stage string, fn func(wk *worker, i int) error) func(wk *worker, i int) error {
	if o.Progress == nil {
		return fn
	}
	var (
		mu    sync.Mutex
		files int
		bytes int64
	)
	o.Progress(stage, 0, len(w.files), 0, w.bytes)
	return func(wk *worker, i int) error {
		if err := fn(wk, i); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		files++
		bytes += w.entries[i].Size
		o.Progress(stage, files, len(w.files), bytes, w.bytes)
		return nil
	}
}
