package transfer

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/lifecycle"
	"firstmate.dev/fm/internal/pkgtree"
	"firstmate.dev/fm/internal/strictjson"
)

// The staged unit ([HOME-4], [XFER-3]):
//
//	data/extensions/staging/<id>/<version>/<transfer-hex>/   0700
//	    package/        the rebuilt package (dirs 0755, files 0644/0755)
//	    receipt.json    the receipt (pretty JSON, 0600)
//	    binding.json    only while being retired: the moved binding (0600)
//
// retired-staging/<id>/<version>/<transfer-hex>/ holds retired and failed
// units in the same shape.
const (
	PackageDir  = "package"
	ReceiptFile = "receipt.json"
	BindingFile = "binding.json"
)

// ReceiptSchema is the schema of receipt.json.
const ReceiptSchema = "firstmate.extension-transfer-receipt.v1"

// maxReceipt bounds receipt.json: the manifest of an envelope, pretty printed.
const maxReceipt = 2 * MaxEnvelope

// tmpPrefix names the private temp directories in which units are built.
// Extension ids start with a letter or digit, so no unit can collide with
// one.
const tmpPrefix = ".receiving-"

// Receipt records what a unit holds. Every field is derived from the
// transfer manifest, so its exact bytes are a function of the transfer
// digest: retire-transfer rebuilds it and refuses any edit, even one that
// keeps the identity fields. (The receive time is the unit directory's
// mtime.)
type Receipt struct {
	Schema           string   `json:"schema"`
	TransferDigest   string   `json:"transfer_digest"`
	ExtensionID      string   `json:"extension_id"`
	ExtensionVersion string   `json:"extension_version"`
	PackageDigest    string   `json:"package_digest"`
	Manifest         Manifest `json:"manifest"`
}

// encodeReceipt returns the exact receipt.json bytes of a transfer.
func encodeReceipt(m *Manifest, digest string) ([]byte, error) {
	return strictjson.Pretty(&Receipt{
		Schema:           ReceiptSchema,
		TransferDigest:   digest,
		ExtensionID:      m.ExtensionID,
		ExtensionVersion: m.ExtensionVersion,
		PackageDigest:    m.PackageDigest,
		Manifest:         *m,
	})
}

// Received is the outcome of a successful Receive.
type Received struct {
	Binding        *binding.Binding
	TransferDigest string
	Unit           string // the staged unit directory
}

// Receive reads one envelope (at most MaxEnvelope bytes) from r, validates
// it in memory (Open), and checks the bind options against the package's
// manifest and the registry, so that a refused call stages nothing. Then,
// under the lifecycle lock for the whole mutation, it
//
//  1. refuses a duplicate transfer identity: a unit with the same id,
//     version and transfer digest in retired-staging (retired or failed),
//     or in staging and bound or being retired, is transfer-exists; a
//     concurrent receive of the same envelope waits for the lock and then
//     finds it. This comes before the registry check, so sending an
//     envelope again while its binding is still enabled says
//     transfer-exists, not binding-exists. A staged unit that nothing binds
//     (a receive killed between steps 3 and 4) is resumed: revalidated as
//     exactly this envelope's unit, it goes straight to step 4 (checkNew);
//  2. refuses options the registry cannot take (host.CheckRegistry);
//  3. rebuilds the package in a private temp directory inside
//     data/extensions/staging, scans it with the rules of bind and checks it
//     entry by entry and by tree digest against the manifest, writes
//     receipt.json, and renames the directory to its unit path without
//     replacing anything (a refused rebuild removes the temp directory and
//     its error names the transfer digest and the unit path it would have
//     had, never the removed temp directory);
//  4. binds the staged package/ (host.Bind with Staged), so the binding's
//     source.path is that directory;
//  5. when the bind fails, moves that exact unit to retired-staging and
//     returns the bind's error, so the transfer is never enabled.
//
// Temp directories left by a receive that died are removed at the next
// receive: only the lock holder builds one, so any found under the lock is
// dead.
func Receive(ctx context.Context, h *home.Home, r io.Reader, opts host.BindOptions) (*Received, error) {
	data, err := strictjson.Read(r, MaxEnvelope, "transfer envelope")
	if err != nil {
		return nil, err
	}
	p, err := Open(data)
	if err != nil {
		return nil, err
	}
	if _, _, err := host.CheckOptions(h, p.Ext, opts); err != nil {
		return nil, err
	}
	lock, err := lifecycle.Acquire(ctx, h)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	existing, err := binding.Load(h)
	if err != nil {
		return nil, err
	}
	unit, err := checkNew(h, p, existing)
	if err != nil {
		return nil, err
	}
	if err := host.CheckRegistry(existing, p.Ext.ID, opts.Adapters); err != nil {
		return nil, err
	}
	if unit == "" {
		if unit, err = stage(h, p); err != nil {
			return nil, err
		}
		if afterStaged != nil {
			afterStaged()
		}
	}
	opts.Dir, opts.Staged, opts.Lock = filepath.Join(unit, PackageDir), true, lock
	b, err := host.Bind(ctx, h, opts)
	if err != nil {
		dst := unitPath(h.RetiredStaging(), &p.Manifest, p.Digest)
		if merr := moveUnit(unit, dst); merr != nil {
			return nil, errcode.Wrap(errcode.RetirementPartial, merr, "bind of transfer %s failed (%v) and its unit %s could not be retired", p.Digest, err, unit)
		}
		return nil, &errcode.Error{Code: errcode.Of(err), Msg: err.Error() + "; transfer " + p.Digest + " was retired to " + dst, Err: err}
	}
	return &Received{Binding: b, TransferDigest: p.Digest, Unit: unit}, nil
}

// unitPath is the unit of a transfer below area (staging or retired-staging).
func unitPath(area string, m *Manifest, digest string) string {
	return filepath.Join(area, m.ExtensionID, m.ExtensionVersion, binding.Hex(digest))
}

// checkNew refuses a transfer identity that this home already holds
// ([XFER-2]): retired or failed (a unit in retired-staging), bound (a staged
// unit that an enabled binding's source.path names), or being retired (a
// staged unit holding binding.json) is transfer-exists. A staged unit that
// no binding names is the state of a receive killed between publishing the
// unit and publishing its binding: when it is still exactly what this
// envelope builds (loadUnit: private, only its names, the receipt byte for
// byte, the tree entry by entry and by digest) its path is returned and the
// resend completes the bind with it; anything else is refused with the
// reason. "" means the identity is new. The caller holds the lifecycle lock,
// so no receive or retire of it is under way.
func checkNew(h *home.Home, p *Package, existing []*binding.Binding) (string, error) {
	retired := unitPath(h.RetiredStaging(), &p.Manifest, p.Digest)
	if _, err := os.Lstat(retired); err == nil {
		return "", errcode.New(errcode.TransferExists, "transfer %s of %s@%s was already received: %s exists", p.Digest, p.Manifest.ExtensionID, p.Manifest.ExtensionVersion, retired)
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", errcode.Wrap(errcode.Internal, err, "stat %s", retired)
	}
	unit := unitPath(h.Staging(), &p.Manifest, p.Digest)
	if _, err := os.Lstat(unit); errors.Is(err, os.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "stat %s", unit)
	}
	exists := func(why string) error {
		return errcode.New(errcode.TransferExists, "transfer %s of %s@%s was already received: %s exists (%s)", p.Digest, p.Manifest.ExtensionID, p.Manifest.ExtensionVersion, unit, why)
	}
	for _, b := range existing {
		if b.Source.Path == filepath.Join(unit, PackageDir) {
			return "", exists("bound as " + b.Digest)
		}
	}
	if _, err := os.Lstat(filepath.Join(unit, BindingFile)); err == nil {
		return "", exists("a retire-transfer of it is under way: run it again")
	}
	if _, err := loadUnit(unit, p.Manifest.ExtensionID, p.Digest); err != nil {
		return "", errcode.Wrap(errcode.Of(err), err, "transfer %s is staged at %s but not bound, and the staged unit cannot be completed; move it to %s", p.Digest, unit, unitPath(h.RetiredStaging(), &p.Manifest, p.Digest))
	}
	return unit, nil
}

// stage builds and publishes the unit of p and returns its path. The caller
// holds the lifecycle lock and has checked that the identity is new
// (checkNew).
func stage(h *home.Home, p *Package) (string, error) {
	staging := h.Staging()
	if err := home.EnsurePrivate(staging, false); err != nil {
		return "", err
	}
	if err := sweep(staging); err != nil {
		return "", err
	}
	final := unitPath(staging, &p.Manifest, p.Digest)
	tmp, err := os.MkdirTemp(staging, tmpPrefix)
	if err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "create a temp directory in %s", staging)
	}
	published := false
	defer func() {
		if !published {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o700); err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "chmod %s", tmp)
	}
	pkg := filepath.Join(tmp, PackageDir)
	if err := build(pkg, p); err != nil {
		return "", rebuildFailed(err, pkg, p, final)
	}
	if _, err := checkTree(pkg, "the rebuilt package", &p.Manifest); err != nil {
		return "", rebuildFailed(err, pkg, p, final)
	}
	receipt, err := encodeReceipt(&p.Manifest, p.Digest)
	if err != nil {
		return "", err
	}
	if err := publishReceipt(tmp, receipt); err != nil {
		return "", err
	}
	if err := fsutil.MkdirAllSync(filepath.Dir(final), 0o700); err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "create %s", filepath.Dir(final))
	}
	if err := home.CheckPrivate(filepath.Dir(final), false); err != nil {
		return "", err
	}
	if err := rename(tmp, final); err != nil {
		return "", err
	}
	published = true
	return final, nil
}

// publishReceipt durably creates the receipt in the unit directory unit,
// which stage has just made 0700.
func publishReceipt(unit string, receipt []byte) error {
	d, err := fsutil.OpenDir(unit, fsutil.DirRule{Perm: fsutil.Exact0700})
	if err != nil {
		return err
	}
	defer d.Close()
	return fsutil.CreateAt(d, ReceiptFile, receipt)
}

// afterStaged, when set, runs once the unit is staged and before it is
// bound: the window in which the crash tests kill a receive (see
// TestReceiveKilledAfterStaging). Nil in fm.
var afterStaged func()

// rebuildFailed restates a failure to rebuild or check the package of p in
// the temp directory pkg: the temp directory is removed before the operator
// reads the error, so the message names the transfer digest and the unit the
// transfer would have had, and paths inside the rebuilt package relative to
// its root. The code is kept.
func rebuildFailed(err error, pkg string, p *Package, final string) error {
	msg := strings.ReplaceAll(err.Error(), pkg+string(filepath.Separator), "")
	msg = strings.ReplaceAll(msg, pkg, "the rebuilt package")
	return &errcode.Error{
		Code: errcode.Of(err),
		Msg:  fmt.Sprintf("transfer %s of %s@%s: %s; nothing was staged at %s", p.Digest, p.Manifest.ExtensionID, p.Manifest.ExtensionVersion, msg, final),
		Err:  err,
	}
}

// sweep removes the temp directories of receives that died.
func sweep(staging string) error {
	ents, err := os.ReadDir(staging)
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "read %s", staging)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			if err := os.RemoveAll(filepath.Join(staging, e.Name())); err != nil {
				return errcode.Wrap(errcode.Internal, err, "remove the abandoned %s", filepath.Join(staging, e.Name()))
			}
		}
	}
	return nil
}

// build writes the entries of p below the new directory dir, with exactly
// the manifest's modes, through an os.Root so that no name can leave dir.
// Every file and directory is fsynced.
func build(dir string, p *Package) error {
	fail := func(err error, what string) error {
		return errcode.Wrap(errcode.Internal, err, "rebuild %s in %s", what, dir)
	}
	if err := os.Mkdir(dir, ModeDirectory); err != nil {
		return fail(err, "the package directory")
	}
	if err := os.Chmod(dir, ModeDirectory); err != nil {
		return fail(err, "the package directory")
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fail(err, "the package directory")
	}
	defer root.Close()
	dirs := []string{dir}
	for i, e := range p.Manifest.Entries {
		name := filepath.FromSlash(e.Path)
		if e.Type == TypeDirectory {
			if err := root.Mkdir(name, ModeDirectory); err != nil {
				return fail(err, e.Path)
			}
			if err := root.Chmod(name, ModeDirectory); err != nil {
				return fail(err, e.Path)
			}
			dirs = append(dirs, filepath.Join(dir, name))
			continue
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fail(err, e.Path)
		}
		_, err = f.Write(p.Data[i])
		if err == nil {
			err = f.Chmod(os.FileMode(e.Mode))
		}
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fail(err, e.Path)
		}
	}
	for _, d := range dirs {
		if err := fsutil.SyncDir(d); err != nil {
			return err
		}
	}
	return nil
}

// checkTree scans the staged package at dir under the rules of bind
// (ownership, no links, no group/other write) and checks it against the
// transfer manifest: the same entries, each of the same type, execute bit,
// size and SHA-256, and the manifest's package digest. what names dir in
// errors.
func checkTree(dir, what string, m *Manifest) (*pkgtree.Tree, error) {
	tree, err := pkgtree.Scan(dir, pkgtree.Source)
	if err != nil {
		return nil, err
	}
	want := make(map[string]*Entry, len(m.Entries))
	for i := range m.Entries {
		want[m.Entries[i].Path] = &m.Entries[i]
	}
	if len(tree.Entries) != len(want) {
		return nil, errcode.New(errcode.IntegrityMismatch, "%s holds %d entries; its transfer manifest lists %d", what, len(tree.Entries), len(want))
	}
	for _, e := range tree.Entries {
		w := want[e.Path]
		same := w != nil && (w.Type == TypeDirectory) == e.Dir
		if same && !e.Dir {
			same = w.Size == e.Size && (w.Mode == ModeExec) == e.Exec && *w.SHA256 == "sha256:"+hex.EncodeToString(e.SHA256[:])
		}
		if !same {
			return nil, errcode.New(errcode.IntegrityMismatch, "%s: %q does not match its transfer manifest", what, e.Path)
		}
	}
	if tree.Digest != m.PackageDigest {
		return nil, errcode.New(errcode.IntegrityMismatch, "%s has tree digest %s; its transfer manifest says %s", what, tree.Digest, m.PackageDigest)
	}
	return tree, nil
}

// moveUnit moves the unit directory src to dst (creating dst's parents 0700,
// durably: fsutil.MkdirAllSync) without replacing anything, durably.
func moveUnit(src, dst string) error {
	if err := fsutil.MkdirAllSync(filepath.Dir(dst), 0o700); err != nil {
		return errcode.Wrap(errcode.Internal, err, "create %s", filepath.Dir(dst))
	}
	if err := home.CheckPrivate(filepath.Dir(dst), false); err != nil {
		return err
	}
	return rename(src, dst)
}

// rename moves src to dst without replacing an existing dst, then fsyncs
// both parent directories.
func rename(src, dst string) error {
	switch err := fsutil.MoveNoReplace(src, dst); {
	case errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY):
		return errcode.New(errcode.TransferExists, "%s already exists", dst)
	case errors.As(err, new(unix.Errno)):
		return errcode.Wrap(errcode.Internal, err, "move %s to %s", src, dst)
	default:
		return err
	}
}
