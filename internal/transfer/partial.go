package transfer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/shown"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// Partial is a transfer unit left half-way by an interrupted multi-step
// operation, for `fm doctor`: what it is and the command that finishes it.
type Partial struct {
	Unit    string // the staged unit
	Failing bool   // a binding is disabled or the unit is ambiguous (else it only waits)
	What    string // what was found
	Fix     string // the exact command that finishes it, or what to do by hand
}

// Partials finds every staged unit an interrupted operation left ([XFER-3],
// [XFER-6]), reading only (bs: the enabled bindings, nil when the registry
// could not be read):
//   - a unit holding binding.json while no binding of its id is enabled:
//     retire-transfer stopped between its two moves; the binding is
//     disabled, and the same retire-transfer finishes it;
//   - a unit holding binding.json while a binding of its id is enabled, or a
//     unit both staged and retired: the pieces no longer form one identity
//     and retire-transfer refuses them (retirement-partial); the operator
//     resolves them by hand;
//   - a unit that no enabled binding names and that holds no binding.json:
//     receive-transfer-bind stopped between staging the unit and publishing
//     its binding; sending the same envelope again finishes it. Only with bs.
//
// Directory names that are not an extension id, a version and a transfer
// digest's hex are not units fm made and are left out.
func Partials(h *home.Home, bs []*binding.Binding, registryOK bool) ([]Partial, error) {
	var out []Partial
	err := eachUnit(h.Staging(), func(id, version, hexd, unit string) error {
		digest := "sha256:" + hexd
		enabled, _ := binding.Find(bs, id)
		kept := filepath.Join(unit, BindingFile)
		retired := filepath.Join(h.RetiredStaging(), id, version, hexd)
		_, kerr := os.Lstat(kept)
		_, rerr := os.Lstat(retired)
		switch {
		case rerr == nil:
			// The copy an enabled binding names is the one to keep.
			keep, drop := retired, unit
			if namedBy(bs, filepath.Join(unit, PackageDir)) {
				keep, drop = unit, retired
			}
			out = append(out, Partial{unit, true,
				fmt.Sprintf("transfer %s of %s@%s is both staged at %s and retired at %s (retirement-partial): retire-transfer refuses it", digest, id, version, shown.Path(unit), shown.Path(retired)),
				fmt.Sprintf("compare them (diff -r %s %s); keep %s (an enabled binding names it, or none names either) and remove the other: rm -r %s, after moving any binding.json in it back to %s if that binding must stay enabled", shown.Path(unit), shown.Path(retired), shown.Path(keep), shown.Path(drop), shown.Path(filepath.Join(h.Bindings(), id+".json")))})
		case kerr == nil && enabled != nil:
			out = append(out, Partial{unit, true,
				fmt.Sprintf("binding of %s is enabled at %s and also retained at %s (retirement-partial): retire-transfer refuses it", id, shown.Path(enabled.Path), shown.Path(kept)),
				fmt.Sprintf("compare them (cmp %s %s); if they are the same, rm %s, then retire again if you mean to", shown.Path(enabled.Path), shown.Path(kept), shown.Path(kept))})
		case kerr == nil:
			data, err := fsutil.ReadPrivateFile(kept, binding.MaxBytes)
			fix := fmt.Sprintf("fm extension retire-transfer %s --if-transfer-digest %s --if-binding-digest %s", id, digest, binding.Digest(data))
			if err != nil {
				fix = fmt.Sprintf("the retained binding cannot be read (%v): move it back to %s to re-enable it, or move the unit to %s by hand", errcode.Of(err), shown.Path(filepath.Join(h.Bindings(), id+".json")), shown.Path(retired))
			}
			out = append(out, Partial{unit, true,
				fmt.Sprintf("transfer %s of %s@%s holds its binding at %s: a retire-transfer stopped between its two moves, and the binding is disabled", digest, id, version, shown.Path(kept)), fix})
		case registryOK && !namedBy(bs, filepath.Join(unit, PackageDir)):
			out = append(out, Partial{unit, false,
				fmt.Sprintf("transfer %s of %s@%s is staged at %s but no binding names it: a receive-transfer-bind stopped between staging it and binding it", digest, id, version, shown.Path(unit)),
				fmt.Sprintf("send the same envelope again: fm extension receive-transfer-bind --adapter <adapter> ... < <envelope> (it binds this unit); or give it up: mv %s %s", shown.Path(unit), shown.Path(retired))})
		}
		return nil
	})
	return out, err
}

// namedBy reports whether a binding of bs has source.path dir.
func namedBy(bs []*binding.Binding, dir string) bool {
	for _, b := range bs {
		if b.Source.Path == dir {
			return true
		}
	}
	return false
}

// eachUnit calls fn with every area/<id>/<version>/<hex> whose names are an
// extension id, a version and 64 lowercase hex digits.
func eachUnit(area string, fn func(id, version, hexd, unit string) error) error {
	ids, err := listDir(area)
	for _, id := range ids {
		if wire.CheckID(id) != nil {
			continue
		}
		versions, verr := listDir(filepath.Join(area, id))
		if verr != nil {
			return verr
		}
		for _, v := range versions {
			if wire.CheckVersion(v) != nil {
				continue
			}
			units, uerr := listDir(filepath.Join(area, id, v))
			if uerr != nil {
				return uerr
			}
			for _, hexd := range units {
				if binding.CheckDigest("sha256:" + hexd) {
					if err := fn(id, v, hexd, filepath.Join(area, id, v, hexd)); err != nil {
						return err
					}
				}
			}
		}
	}
	return err
}

// listDir lists the names in dir; none when it does not exist.
func listDir(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read %s", dir)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, nil
}
