package transfer

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/lifecycle"
	"firstmate.dev/fm/internal/pkgtree"
	"firstmate.dev/fm/internal/retire"
	"firstmate.dev/fm/internal/shown"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// Retired is the outcome of a successful Retire.
type Retired struct {
	ID, Version    string
	TransferDigest string
	BindingDigest  string
	At             string // the unit in retired-staging
}

// Retire retires the transferred binding of extension id received as
// transferDigest and enabled as bindingDigest ([XFER-6]), under the
// lifecycle lock for the whole mutation.
//
// It first revalidates everything as one identity and refuses anything else:
// exactly one unit staging/<id>/<version>/<transfer-hex> (none is
// transfer-missing, more than one is ambiguous), holding only package/,
// receipt.json and possibly binding.json; a receipt whose bytes are exactly
// the ones receive wrote for that transfer digest, whose manifest hashes to
// it, and whose version is the version directory's name; a staged package
// whose tree matches that manifest entry by entry and by tree digest; then
// the binding (below). Then it makes two moves: the enabled binding file into
// the unit as binding.json (retire.Enabled, the one retirement sequence of a
// binding; the binding is disabled from here on), and the unit into
// retired-staging/<id>/<version>/<transfer-hex>. Both are renames that
// replace nothing, so moving them back restores the binding.
//
// The binding is either
//
//   - enabled, with no binding.json in the unit (nothing moved yet): it is
//     retired by retire.Enabled, as retire-binding retires: its digest must
//     be bindingDigest (else owner-mismatch), it must be this transfer's
//     binding (source.path is the unit's package/, same version, package
//     digest and manifest digest), its installed package must revalidate,
//     and nothing may depend on it (the process-event preflight, then the
//     invocation records: binding-in-use);
//   - or not enabled, with binding.json in the unit: the state of a retire
//     interrupted between its two moves. It resumes (only the second move is
//     left) only when that file's digest is exactly bindingDigest and it is
//     this transfer's binding; anything else is retirement-partial.
//
// Enabled and moved at once, or a unit both staged and retired, is
// retirement-partial: the pieces no longer form one identity and are left
// for the operator. Neither is binding-missing.
func Retire(ctx context.Context, h *home.Home, id, transferDigest, bindingDigest string) (*Retired, error) {
	if err := wire.CheckID(id); err != nil {
		return nil, errcode.New(errcode.Usage, "extension %v", err)
	}
	if !binding.CheckDigest(transferDigest) {
		return nil, errcode.New(errcode.Usage, "--if-transfer-digest %q must be sha256:<64 lowercase hex>", transferDigest)
	}
	if !binding.CheckDigest(bindingDigest) {
		return nil, errcode.New(errcode.Usage, "--if-binding-digest %q must be sha256:<64 lowercase hex>", bindingDigest)
	}
	lock, err := lifecycle.Acquire(ctx, h)
	if err != nil {
		return nil, err
	}
	defer lock.Release()

	hexd := binding.Hex(transferDigest)
	staged, err := findUnits(h.Staging(), id, hexd)
	if err != nil {
		return nil, err
	}
	retired, err := findUnits(h.RetiredStaging(), id, hexd)
	if err != nil {
		return nil, err
	}
	switch {
	case len(staged) == 0 && len(retired) > 0:
		return nil, errcode.New(errcode.TransferMissing, "transfer %s of %s is already retired: %s", transferDigest, id, retired[0])
	case len(staged) == 0:
		return nil, errcode.New(errcode.TransferMissing, "no staged transfer %s of %s in %s", transferDigest, id, h.Staging())
	case len(staged) > 1:
		return nil, errcode.New(errcode.IntegrityMismatch, "transfer %s of %s is staged more than once (%s and %s); the unit is ambiguous, remove the one that is not its receipt's version", transferDigest, id, staged[0], staged[1])
	case len(retired) > 0:
		return nil, errcode.New(errcode.RetirementPartial, "transfer %s of %s is both staged at %s and retired at %s; resolve it by hand", transferDigest, id, staged[0], retired[0])
	}
	u, err := loadUnit(staged[0], id, transferDigest)
	if err != nil {
		return nil, err
	}

	bs, err := binding.LoadForRetire(h, id) // as retire-binding: a conflict with id's binding does not refuse
	if err != nil {
		return nil, err
	}
	enabled, _ := binding.Find(bs, id)
	kept := filepath.Join(u.dir, BindingFile)
	_, err = os.Lstat(kept)
	moved := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, errcode.Wrap(errcode.Internal, err, "stat %s", kept)
	}
	switch {
	case enabled != nil && moved:
		return nil, errcode.New(errcode.RetirementPartial, "binding %s of %s is enabled at %s and also retained at %s; resolve it by hand", enabled.Digest, id, enabled.Path, kept)
	case enabled != nil:
		owns := func(b *binding.Binding) error { return u.owns(&b.Record, b.Path) }
		if err := retire.Enabled(h, enabled, bindingDigest, owns, kept, false); err != nil {
			return nil, err
		}
	case moved:
		if err := u.resumable(h, kept, bindingDigest); err != nil {
			return nil, err
		}
	default:
		return nil, errcode.New(errcode.BindingMissing, "no binding for %s is enabled or retained in %s; nothing to retire with this transfer", id, u.dir)
	}
	dst := filepath.Join(h.RetiredStaging(), id, u.version, hexd)
	if err := moveUnit(u.dir, dst); err != nil {
		return nil, err
	}
	return &Retired{ID: id, Version: u.version, TransferDigest: transferDigest, BindingDigest: bindingDigest, At: dst}, nil
}

// findUnits returns every <area>/<id>/<version>/<hexd> that exists.
func findUnits(area, id, hexd string) ([]string, error) {
	dir := filepath.Join(area, id)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read %s", dir)
	}
	var out []string
	for _, e := range ents {
		p := filepath.Join(dir, e.Name(), hexd)
		if _, err := os.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// unit is a staged unit validated by loadUnit.
type unit struct {
	dir            string
	id, version    string
	packageDigest  string
	manifestSHA256 string // of the staged firstmate-extension.json
}

// loadUnit validates the staged unit dir of extension id and transfer
// digest: a private 0700 directory holding only the unit's names, a receipt
// that is byte for byte the one receive writes for that digest, a version
// directory named by it, and a staged package matching its manifest.
func loadUnit(dir, id, digest string) (*unit, error) {
	if err := home.CheckPrivate(dir, true); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read %s", dir)
	}
	for _, e := range ents {
		switch e.Name() {
		case PackageDir, ReceiptFile, BindingFile:
		default:
			return nil, errcode.New(errcode.IntegrityMismatch, "staged transfer %s holds an unrelated entry %q; remove it", dir, e.Name())
		}
	}
	path := filepath.Join(dir, ReceiptFile)
	data, err := fsutil.ReadPrivateFile(path, maxReceipt)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errcode.New(errcode.IntegrityMismatch, "staged transfer %s has no %s", dir, ReceiptFile)
	}
	if err != nil {
		return nil, err
	}
	if IsLegacyReceipt(data) {
		return nil, errcode.New(errcode.HomeImportNeeded, "receipt %s is of the earlier Firstmate implementation; stop it, then run fm home import", path)
	}
	var r Receipt
	if err := strictjson.Decode(data, maxReceipt, "receipt "+path, &r); err != nil {
		return nil, err
	}
	m := &r.Manifest
	if d, err := Digest(m); err != nil {
		return nil, err
	} else if d != digest {
		return nil, errcode.New(errcode.IntegrityMismatch, "receipt %s: its manifest hashes to %s, not %s", path, d, digest)
	}
	if want, err := encodeReceipt(m, digest); err != nil {
		return nil, err
	} else if !bytes.Equal(want, data) {
		return nil, errcode.New(errcode.IntegrityMismatch, "receipt %s was edited after the transfer was received", path)
	}
	version := filepath.Base(filepath.Dir(dir))
	if m.ExtensionID != id || m.ExtensionVersion != version {
		return nil, errcode.New(errcode.IntegrityMismatch, "staged transfer %s holds %s@%s; its directory says %s@%s", dir, m.ExtensionID, m.ExtensionVersion, id, version)
	}
	tree, err := checkTree(filepath.Join(dir, PackageDir), "staged package "+filepath.Join(dir, PackageDir), m)
	if err != nil {
		return nil, err
	}
	ms, ok := pkgtree.FileSHA256(tree, wire.ManifestFile)
	if !ok {
		return nil, errcode.New(errcode.ManifestMissing, "staged package %s has no %s", filepath.Join(dir, PackageDir), wire.ManifestFile)
	}
	return &unit{dir: dir, id: id, version: version, packageDigest: m.PackageDigest, manifestSHA256: ms}, nil
}

// owns checks that rec (found at path) is the binding this unit's receive
// made: same id and version, source.path its package/, and the staged
// package's digest and manifest digest.
func (u *unit) owns(rec *binding.Record, path string) error {
	if rec.ExtensionID != u.id || rec.ExtensionVersion != u.version ||
		rec.Source.Kind != binding.SourceKind || rec.Source.Path != filepath.Join(u.dir, PackageDir) ||
		rec.PackageDigest != u.packageDigest || rec.ManifestSHA256 != u.manifestSHA256 {
		return errcode.New(errcode.IntegrityMismatch, "binding %s is not the binding of the transfer staged at %s (source %s, package %s)", path, u.dir, shown.Path(rec.Source.Path), rec.PackageDigest)
	}
	return nil
}

// resumable checks the binding retained at kept by an interrupted retire:
// exactly digest, a valid record of this home, and this unit's binding.
func (u *unit) resumable(h *home.Home, kept, digest string) error {
	data, err := fsutil.ReadPrivateFile(kept, binding.MaxBytes)
	if err != nil {
		return errcode.Wrap(errcode.RetirementPartial, err, "the binding retained at %s cannot be read", kept)
	}
	if d := binding.Digest(data); d != digest {
		return errcode.New(errcode.RetirementPartial, "the binding retained at %s has digest %s, not %s; the interrupted retirement cannot resume", kept, d, digest)
	}
	var rec binding.Record
	if err := strictjson.Decode(data, binding.MaxBytes, "binding "+kept, &rec); err != nil {
		return err
	}
	if err := rec.Validate(h, "binding "+kept); err != nil {
		return err
	}
	return u.owns(&rec, kept)
}
