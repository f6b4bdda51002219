// Package storegc removes store copies that nothing references, fm
// extension gc ([GC-1] to [GC-3]).
//
// A store copy is data/extensions/packages/<id>/<version>/<tree-hex>/, made
// by a bind and never changed after. It is referenced by the package_root
// of a binding record: an enabled binding (config/extensions.d), a retired
// one (data/extensions/retired-bindings/<id>/<hex>.json), or one kept in a
// transfer unit (binding.json in data/extensions/staging or
// retired-staging). Retired records are restorable by moving them back, so
// their copies are kept unless the operator asks (IncludeRetired). A copy
// whose binding an invocation record pins is always kept, and an invocation
// record that pins a binding digest no record has refuses the whole gc: the
// copy it runs cannot be told. Every binding record is read (an unreadable
// one refuses, naming the file), and all of it happens under the lifecycle
// lock, so no bind installs or publishes meanwhile.
package storegc

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/lifecycle"
	"firstmate.dev/fm/internal/pkgtree"
	"firstmate.dev/fm/internal/strictjson"
)

// Options are gc's choices.
type Options struct {
	DryRun         bool // list what would be removed; remove nothing
	IncludeRetired bool // retired bindings and transfers do not keep their copies
}

// Report is what gc found: the copies removed (or, dry, to remove) and those
// kept, in path order.
type Report struct {
	Removed, Kept []string
}

// Run removes every unreferenced store copy of h ([GC-1]).
func Run(ctx context.Context, h *home.Home, o Options) (*Report, error) {
	if _, err := os.Lstat(h.Packages()); os.IsNotExist(err) {
		return &Report{}, nil // no store: nothing created [HOME-5]
	}
	lock, err := lifecycle.Acquire(ctx, h)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	host.SweepTemps(h)
	keep, err := referenced(h, o.IncludeRetired)
	if err != nil {
		return nil, err
	}
	copies, err := storeCopies(h)
	if err != nil {
		return nil, err
	}
	rep := &Report{}
	for _, c := range copies {
		if keep[c] {
			rep.Kept = append(rep.Kept, c)
			continue
		}
		if !o.DryRun {
			if err := remove(c); err != nil {
				return rep, err
			}
		}
		rep.Removed = append(rep.Removed, c)
	}
	return rep, nil
}

// referenced is the set of store copies to keep.
func referenced(h *home.Home, includeRetired bool) (map[string]bool, error) {
	keep := map[string]bool{}
	enabled, err := binding.Load(h)
	if err != nil {
		return nil, err
	}
	roots := map[string]string{} // binding digest -> package root
	for _, b := range enabled {
		keep[b.PackageRoot] = true
		roots[b.Digest] = b.PackageRoot
	}
	retired, err := retiredRecords(h)
	if err != nil {
		return nil, err
	}
	for digest, root := range retired {
		roots[digest] = root
		if !includeRetired {
			keep[root] = true
		}
	}
	recs, err := launch.List(h.Invocations())
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		root, ok := roots[r.BindingDigest]
		if !ok {
			return nil, errcode.New(errcode.BindingInUse, "invocation record %s pins binding %s, which no binding record names: the store copy it runs cannot be told; nothing was removed: run fm extension cleanup-invocations once it has ended", r.Path, r.BindingDigest)
		}
		keep[root] = true
	}
	return keep, nil
}

// retiredRecords reads every binding record kept outside the registry
// (retired bindings, transfer units) and returns its package root by its
// digest.
func retiredRecords(h *home.Home) (map[string]string, error) {
	var files []string
	for _, pattern := range []string{
		filepath.Join(h.RetiredBindings(), "*", "*.json"),
		filepath.Join(h.Staging(), "*", "*", "*", "binding.json"),
		filepath.Join(h.RetiredStaging(), "*", "*", "*", "binding.json"),
	} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			return nil, errcode.Wrap(errcode.Internal, err, "list %s", pattern)
		}
		files = append(files, m...)
	}
	out := map[string]string{}
	for _, f := range files {
		data, err := fsutil.ReadPrivateFile(f, binding.MaxBytes)
		if err != nil {
			return nil, errcode.Wrap(errcode.Of(err), err, "binding record %s cannot be read, so the store copy it names cannot be told; nothing was removed", f)
		}
		var rec binding.Record
		if err := strictjson.Decode(data, binding.MaxBytes, "binding record "+f, &rec); err != nil {
			return nil, err
		}
		out[binding.Digest(data)] = filepath.Clean(rec.PackageRoot)
	}
	return out, nil
}

// storeCopies lists the store copies packages/<id>/<version>/<hex>, in path
// order. Names starting with a dot (a bind's temporary copies) are not
// copies.
func storeCopies(h *home.Home) ([]string, error) {
	var out []string
	level := []string{h.Packages()}
	for range 3 {
		var next []string
		for _, dir := range level {
			ents, err := os.ReadDir(dir)
			if err != nil {
				return nil, errcode.Wrap(errcode.Internal, err, "read store directory %s", dir)
			}
			for _, e := range ents {
				if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
					next = append(next, filepath.Join(dir, e.Name()))
				}
			}
		}
		level = next
	}
	out = append(out, level...)
	slices.Sort(out)
	return out, nil
}

// remove removes the store copy c (its directories are 0555: see
// pkgtree.RemoveInstalled), then its version and id directories when they
// are left empty.
func remove(c string) error {
	if err := pkgtree.RemoveInstalled(c); err != nil {
		return err
	}
	version := filepath.Dir(c)
	for _, d := range []string{version, filepath.Dir(version)} {
		if err := os.Remove(d); err != nil {
			break // not empty (or gone): kept
		}
	}
	return fsutil.SyncDir(filepath.Dir(filepath.Dir(version)))
}
