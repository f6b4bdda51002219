package transfer

import (
	"context"
	"encoding/hex"
	"errors"
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
//     version and transfer digest in staging (already received) or in
//     retired-staging (retired or failed) is transfer-exists; a concurrent
//     receive of the same envelope waits for the lock and then finds it;
//  2. rebuilds the package in a private temp directory inside
//     data/extensions/staging, scans it with the rules of bind and checks it
//     entry by entry and by tree digest against the manifest, writes
//     receipt.json, and renames the directory to its unit path without
//     replacing anything (a refused rebuild removes the temp directory);
//  3. binds the staged package/ (host.Bind with Staged), so the binding's
//     source.path is that directory;
//  4. when the bind fails, moves that exact unit to retired-staging and
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
	lock, err := lifecycle.Acquire(h)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	existing, err := binding.Load(h)
	if err != nil {
		return nil, err
	}
	if err := host.CheckRegistry(existing, p.Ext.ID, opts.Adapters); err != nil {
		return nil, err
	}
	unit, err := stage(h, p)
	if err != nil {
		return nil, err
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

// stage builds and publishes the unit of p and returns its path. The caller
// holds the lifecycle lock.
func stage(h *home.Home, p *Package) (string, error) {
	staging := h.Staging()
	if err := home.EnsurePrivate(staging, false); err != nil {
		return "", err
	}
	if err := sweep(staging); err != nil {
		return "", err
	}
	final := unitPath(staging, &p.Manifest, p.Digest)
	for _, u := range []string{final, unitPath(h.RetiredStaging(), &p.Manifest, p.Digest)} {
		if _, err := os.Lstat(u); err == nil {
			return "", errcode.New(errcode.TransferExists, "transfer %s of %s@%s was already received: %s exists", p.Digest, p.Manifest.ExtensionID, p.Manifest.ExtensionVersion, u)
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", errcode.Wrap(errcode.Internal, err, "stat %s", u)
		}
	}
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
		return "", err
	}
	if _, err := checkTree(pkg, &p.Manifest); err != nil {
		return "", err
	}
	receipt, err := encodeReceipt(&p.Manifest, p.Digest)
	if err != nil {
		return "", err
	}
	if err := fsutil.PublishNoReplace(tmp, filepath.Join(tmp, ReceiptFile), receipt, 0o600); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
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
// size and SHA-256, and the manifest's package digest.
func checkTree(dir string, m *Manifest) (*pkgtree.Tree, error) {
	tree, err := pkgtree.Scan(dir, pkgtree.Source)
	if err != nil {
		return nil, err
	}
	want := make(map[string]*Entry, len(m.Entries))
	for i := range m.Entries {
		want[m.Entries[i].Path] = &m.Entries[i]
	}
	if len(tree.Entries) != len(want) {
		return nil, errcode.New(errcode.IntegrityMismatch, "staged package %s holds %d entries; its transfer manifest lists %d", dir, len(tree.Entries), len(want))
	}
	for _, e := range tree.Entries {
		w := want[e.Path]
		same := w != nil && (w.Type == TypeDirectory) == e.Dir
		if same && !e.Dir {
			same = w.Size == e.Size && (w.Mode == ModeExec) == e.Exec && *w.SHA256 == "sha256:"+hex.EncodeToString(e.SHA256[:])
		}
		if !same {
			return nil, errcode.New(errcode.IntegrityMismatch, "staged package %s: %q does not match its transfer manifest", dir, e.Path)
		}
	}
	if tree.Digest != m.PackageDigest {
		return nil, errcode.New(errcode.IntegrityMismatch, "staged package %s has tree digest %s; its transfer manifest says %s", dir, tree.Digest, m.PackageDigest)
	}
	return tree, nil
}

// moveUnit moves the unit directory src to dst (creating dst's parents 0700)
// without replacing anything, durably.
func moveUnit(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
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
	if err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
			return errcode.New(errcode.TransferExists, "%s already exists", dst)
		}
		return errcode.Wrap(errcode.Internal, err, "move %s to %s", src, dst)
	}
	if err := fsutil.SyncDir(filepath.Dir(dst)); err != nil {
		return err
	}
	return fsutil.SyncDir(filepath.Dir(src))
}
