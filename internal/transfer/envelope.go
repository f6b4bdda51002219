// Package transfer moves one extension package into another home as a
// single JSON envelope, stages it there, binds it, and retires it again
// (CONTRACT §12, [XFER-1] [XFER-2] [XFER-3] [XFER-6]).
//
// # The envelope ([XFER-1])
//
// Pack reads a package directory under exactly the rules of bind
// (pkgtree.CheckLocation and pkgtree.Scan with policy Source) and writes one
// canonical JSON document, keys sorted bytewise and no insignificant
// whitespace, without a trailing newline:
//
//	{"manifest":{...},"manifest_sha256":"sha256:<hex>","payloads":[...],
//	 "schema":"firstmate.extension-package-transfer.v1"}
//
// The manifest names the extension id and version, the package tree digest
// of [PKG-5], entry_count, total_bytes and every entry, sorted bytewise by
// its full '/'-separated path. An entry is exactly {path, type, mode, size,
// sha256}: a directory is type "directory", mode 493 (0755), size 0 and
// sha256 null; a file is type "file", mode 420 (0644) or 493 (0755, any
// execute bit), its size and "sha256:<hex>" of its bytes. manifest_sha256 is
// "sha256:" + SHA-256 of the manifest's canonical JSON; it is the transfer
// digest, the identity of the transfer in every home. payloads holds one
// value per entry in entry order: the file's bytes as standard padded base64,
// or null for a directory.
//
// Full-path order, not the tree digest's depth-first order, is what the
// receiver checks, so Pack sorts: any package that binds locally transfers.
// Pack refuses what a receiver would refuse, by running the receiver's own
// validation (Open) on the envelope it built, so the two can never disagree.
//
// # The receiver's rules ([XFER-2])
//
// Open validates an envelope in memory before anything touches the disk:
//
//   - at most MaxEnvelope serialized bytes (json-oversized); strict JSON
//     (json-invalid: malformed, truncated, duplicate keys; schema-invalid:
//     unknown or missing keys, wrong types); exactly the canonical
//     serialization, so one transfer has one byte encoding (json-invalid);
//   - at most MaxEntries entries, MaxFileBytes per file and MaxPackageBytes
//     in all (package-oversized);
//   - paths relative and normalized: no leading '/', and every component a
//     name bind accepts (pkgtree.CheckName: no empty, "." or ".." component,
//     none over 255 bytes, valid UTF-8 without control characters, no
//     ".git") (path-unsafe); strictly sorted (schema-invalid); no
//     duplicate path and no entry whose parent is missing or is a file
//     (package-invalid: a file/directory collision);
//   - types only directory and file (pkgtree.CheckType: a symlink is
//     link-unsafe, any other type package-invalid); modes only 493 for
//     directories and 420/493 for files (mode-unsafe; a group- or
//     world-writable mode is refused by pkgtree.CheckPerm, as bind would);
//   - entry_count, total_bytes, the number of payloads, every payload's size
//     and SHA-256, and manifest_sha256 must all match (integrity-mismatch);
//     a payload must be canonical standard padded base64 (schema-invalid);
//   - the package's own firstmate-extension.json must be a file of the
//     envelope (manifest-missing), parse under the manifest rules, and name
//     the envelope's extension id and version (integrity-mismatch); its
//     entrypoint must be a file entry of mode 493 (entrypoint-missing,
//     entrypoint-invalid).
//
// Receive and Retire (receive.go, retire.go) build on this.
package transfer

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/manifest"
	"firstmate.dev/fm/internal/pkgtree"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// Schemas of the envelope and of its manifest.
const (
	Schema         = "firstmate.extension-package-transfer.v1"
	ManifestSchema = "firstmate.extension-package-transfer-manifest.v1"
)

// Receiver limits ([XFER-2]). Exactly at a limit is accepted.
const (
	MaxEntries      = 128
	MaxFileBytes    = 262144
	MaxPackageBytes = 524288
	MaxEnvelope     = 900000
)

// Entry types and modes of the manifest.
const (
	TypeDirectory = "directory"
	TypeFile      = "file"
	ModeDirectory = 0o755 // 493
	ModeExec      = 0o755 // 493
	ModeFile      = 0o644 // 420
)

// maxPath bounds a whole entry path. The rebuilt package lives several
// directories deep in a home, and the kernel refuses paths over PATH_MAX
// (4,096 bytes); 1,024 bytes leaves that room while no real package comes
// near it, so a deeper envelope is refused up front as path-unsafe instead of
// failing half-way through the rebuild.
const maxPath = 1024

// Envelope is the transfer document ([XFER-1]).
type Envelope struct {
	Schema         string    `json:"schema"`
	Manifest       Manifest  `json:"manifest"`
	ManifestSHA256 string    `json:"manifest_sha256"`
	Payloads       []*string `json:"payloads"`
}

// Manifest pins the identity and the complete content of a transfer; its
// canonical JSON is hashed into the transfer digest.
type Manifest struct {
	Schema           string  `json:"schema"`
	ExtensionID      string  `json:"extension_id"`
	ExtensionVersion string  `json:"extension_version"`
	PackageDigest    string  `json:"package_digest"`
	EntryCount       int64   `json:"entry_count"`
	TotalBytes       int64   `json:"total_bytes"`
	Entries          []Entry `json:"entries"`
}

// Entry is one directory or file of the package.
type Entry struct {
	Path   string  `json:"path"`
	Type   string  `json:"type"`
	Mode   int64   `json:"mode"`
	Size   int64   `json:"size"`
	SHA256 *string `json:"sha256"`
}

// Package is a validated envelope with its decoded file bytes.
type Package struct {
	Manifest Manifest
	// Digest is the transfer digest, "sha256:<hex>" (= manifest_sha256).
	Digest string
	// Data holds each entry's bytes, in entry order; nil for a directory.
	Data [][]byte
	// Ext is the package's own parsed firstmate-extension.json.
	Ext *wire.Manifest
}

// Digest returns the transfer digest of a manifest: "sha256:" + SHA-256 of
// its canonical JSON.
func Digest(m *Manifest) (string, error) {
	data, err := strictjson.Canonical(m)
	if err != nil {
		return "", err
	}
	return binding.Digest(data), nil
}

// Pack reads the package directory dir, which must lie outside the home
// homeDir exactly as for bind, and returns its canonical envelope. It refuses
// every package that a receiver would refuse; the receiver's entry and size
// bounds are checked from stat data before any file byte is read
// (checkBounds).
func Pack(dir, homeDir string) ([]byte, error) {
	if err := pkgtree.CheckLocation(dir, homeDir); err != nil {
		return nil, err
	}
	// The receiver's bounds first, from directory reads and stat data
	// alone, so an oversized package is refused before any of its bytes is
	// read: pkgtree.Scan hashes every file of a tree up to its own, far
	// larger, bounds.
	if err := checkBounds(dir); err != nil {
		return nil, err
	}
	tree, err := pkgtree.Scan(dir, pkgtree.Source)
	if err != nil {
		return nil, err
	}
	// Again on what the scan validated (the tree may have changed since).
	if err := checkCount(int64(len(tree.Entries))); err != nil {
		return nil, err
	}
	for _, e := range tree.Entries {
		if err := checkFileSize(e.Path, e.Size); err != nil {
			return nil, err
		}
	}
	if err := checkTotal(tree.Bytes); err != nil {
		return nil, err
	}
	m, entries := manifestOf(tree)
	data := make([][]byte, len(entries))
	for i, e := range entries {
		if e.Dir {
			continue
		}
		if data[i], err = readScanned(dir, e); err != nil {
			return nil, err
		}
	}
	pm, err := packageManifest(m.Entries, data)
	if err != nil {
		return nil, err
	}
	m.ExtensionID, m.ExtensionVersion = pm.ID, pm.Version
	env := Envelope{Schema: Schema, Manifest: m, Payloads: make([]*string, len(entries))}
	if env.ManifestSHA256, err = Digest(&m); err != nil {
		return nil, err
	}
	for i, d := range data {
		if d != nil {
			s := base64.StdEncoding.EncodeToString(d)
			env.Payloads[i] = &s
		}
	}
	out, err := strictjson.Canonical(&env)
	if err != nil {
		return nil, err
	}
	if _, err := Open(out); err != nil {
		return nil, err
	}
	return out, nil
}

// manifestOf returns the transfer manifest of a scanned package, without
// the extension id and version (which the package's own manifest file
// names), and the tree's entries in the manifest's order: sorted bytewise by
// full path. A file's sha256 is the one the scan computed.
func manifestOf(tree *pkgtree.Tree) (Manifest, []pkgtree.Entry) {
	entries := slices.Clone(tree.Entries)
	slices.SortFunc(entries, func(a, b pkgtree.Entry) int { return strings.Compare(a.Path, b.Path) })
	m := Manifest{
		Schema:        ManifestSchema,
		PackageDigest: tree.Digest,
		EntryCount:    int64(len(entries)),
		TotalBytes:    tree.Bytes,
		Entries:       make([]Entry, len(entries)),
	}
	for i, e := range entries {
		if e.Dir {
			m.Entries[i] = Entry{Path: e.Path, Type: TypeDirectory, Mode: ModeDirectory}
			continue
		}
		sum := "sha256:" + hex.EncodeToString(e.SHA256[:])
		mode := int64(ModeFile)
		if e.Exec {
			mode = ModeExec
		}
		m.Entries[i] = Entry{Path: e.Path, Type: TypeFile, Mode: mode, Size: e.Size, SHA256: &sum}
	}
	return m, entries
}

// checkBounds refuses, as package-oversized, a package directory that holds
// more than MaxEntries entries, a regular file over MaxFileBytes or more than
// MaxPackageBytes of regular files, judging from directory reads and lstat
// alone: no file is opened, and no directory is read past the entry bound.
// It refuses nothing else: a link, a special file or a directory it cannot
// read is left for pkgtree.Scan to refuse with its own code, and Pack checks
// the bounds again on the tree Scan validated.
func checkBounds(dir string) error {
	var count, total int64
	var walk func(abs, rel string) error
	walk = func(abs, rel string) error {
		f, err := os.Open(abs)
		if err != nil {
			return nil
		}
		var ents []os.DirEntry
		for {
			chunk, err := f.ReadDir(int(MaxEntries + 1 - count - int64(len(ents))))
			ents = append(ents, chunk...)
			if count+int64(len(ents)) > MaxEntries {
				f.Close()
				return checkCount(count + int64(len(ents)))
			}
			if err != nil {
				break
			}
		}
		f.Close()
		count += int64(len(ents))
		slices.SortFunc(ents, func(a, b os.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
		for _, e := range ents {
			p := path.Join(rel, e.Name())
			switch {
			case e.Type().IsDir():
				if err := walk(filepath.Join(abs, e.Name()), p); err != nil {
					return err
				}
			case e.Type().IsRegular():
				fi, err := e.Info()
				if err != nil {
					continue
				}
				if err := checkFileSize(p, fi.Size()); err != nil {
					return err
				}
				total += fi.Size()
				if err := checkTotal(total); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(dir, "")
}

// readScanned reads the file entry e of the scanned package at dir and
// checks that its bytes are still the ones the scan hashed: the scan is the
// validation, so anything changed since is integrity-mismatch.
func readScanned(dir string, e pkgtree.Entry) ([]byte, error) {
	p := filepath.Join(dir, filepath.FromSlash(e.Path))
	f, err := fsutil.OpenNoFollow(p)
	if err != nil {
		return nil, errcode.Wrap(errcode.IntegrityMismatch, err, "package %s: %q changed while it was packed", dir, e.Path)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, e.Size+1))
	if err != nil || int64(len(data)) != e.Size || sha256.Sum256(data) != e.SHA256 {
		return nil, errcode.New(errcode.IntegrityMismatch, "package %s: %q changed while it was packed", dir, e.Path)
	}
	return data, nil
}

// Open validates an envelope under every receiver rule ([XFER-2]) without
// touching the disk, and returns it decoded.
func Open(data []byte) (*Package, error) {
	const what = "transfer envelope"
	var env Envelope
	if err := strictjson.Decode(data, MaxEnvelope, what, &env); err != nil {
		return nil, err
	}
	m := &env.Manifest
	if env.Schema != Schema {
		return nil, errcode.New(errcode.SchemaInvalid, "%s: schema must be %q", what, Schema)
	}
	if m.Schema != ManifestSchema {
		return nil, errcode.New(errcode.SchemaInvalid, "%s: manifest schema must be %q", what, ManifestSchema)
	}
	if err := wire.CheckID(m.ExtensionID); err != nil {
		return nil, errcode.New(errcode.SchemaInvalid, "%s: manifest extension_%v", what, err)
	}
	if err := wire.CheckVersion(m.ExtensionVersion); err != nil {
		return nil, errcode.New(errcode.SchemaInvalid, "%s: manifest extension_%v", what, err)
	}
	for name, d := range map[string]string{"manifest.package_digest": m.PackageDigest, "manifest_sha256": env.ManifestSHA256} {
		if !binding.CheckDigest(d) {
			return nil, errcode.New(errcode.SchemaInvalid, "%s: %s must be sha256:<64 lowercase hex>", what, name)
		}
	}
	if err := checkCount(int64(len(m.Entries))); err != nil {
		return nil, err
	}
	if m.EntryCount != int64(len(m.Entries)) {
		return nil, errcode.New(errcode.IntegrityMismatch, "%s: entry_count is %d but the manifest lists %d entries", what, m.EntryCount, len(m.Entries))
	}
	if len(env.Payloads) != len(m.Entries) {
		return nil, errcode.New(errcode.IntegrityMismatch, "%s: %d payloads for %d entries", what, len(env.Payloads), len(m.Entries))
	}
	isDir := make(map[string]bool, len(m.Entries))
	var total int64
	for i := range m.Entries {
		e := &m.Entries[i]
		if i > 0 && e.Path < m.Entries[i-1].Path {
			return nil, errcode.New(errcode.SchemaInvalid, "%s: entries are not sorted bytewise by path (%q after %q)", what, e.Path, m.Entries[i-1].Path)
		}
		if err := checkEntry(e, isDir); err != nil {
			return nil, err
		}
		isDir[e.Path] = e.Type == TypeDirectory
		total += e.Size
		if err := checkTotal(total); err != nil {
			return nil, err
		}
	}
	if m.TotalBytes != total {
		return nil, errcode.New(errcode.IntegrityMismatch, "%s: total_bytes is %d but the entries hold %d bytes", what, m.TotalBytes, total)
	}
	p := &Package{Manifest: *m, Digest: env.ManifestSHA256, Data: make([][]byte, len(m.Entries))}
	for i, e := range m.Entries {
		b, err := decodePayload(&e, env.Payloads[i])
		if err != nil {
			return nil, err
		}
		p.Data[i] = b
	}
	if d, err := Digest(m); err != nil {
		return nil, err
	} else if d != env.ManifestSHA256 {
		return nil, errcode.New(errcode.IntegrityMismatch, "%s: manifest_sha256 is %s but the manifest hashes to %s", what, env.ManifestSHA256, d)
	}
	pm, err := packageManifest(m.Entries, p.Data)
	if err != nil {
		return nil, err
	}
	if pm.ID != m.ExtensionID || pm.Version != m.ExtensionVersion {
		return nil, errcode.New(errcode.IntegrityMismatch, "%s: names %s@%s but the package's %s names %s@%s", what, m.ExtensionID, m.ExtensionVersion, wire.ManifestFile, pm.ID, pm.Version)
	}
	if err := checkEntrypoint(m.Entries, pm.Entrypoint); err != nil {
		return nil, err
	}
	p.Ext = pm
	canon, err := strictjson.Canonical(&env)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(canon, data) {
		return nil, errcode.New(errcode.JSONInvalid, "%s: not in canonical form (sorted keys, no whitespace, no trailing newline); send it exactly as pack-transfer wrote it", what)
	}
	return p, nil
}

func checkCount(n int64) error {
	if n > MaxEntries {
		return errcode.New(errcode.PackageOversized, "transfer of %d entries: a transfer carries at most %d", n, MaxEntries)
	}
	return nil
}

func checkFileSize(p string, size int64) error {
	if size > MaxFileBytes {
		return errcode.New(errcode.PackageOversized, "transfer entry %q is %d bytes: a transferred file holds at most %d", p, size, MaxFileBytes)
	}
	return nil
}

func checkTotal(total int64) error {
	if total > MaxPackageBytes {
		return errcode.New(errcode.PackageOversized, "transfer holds more than %d bytes of files", MaxPackageBytes)
	}
	return nil
}

// checkEntry applies the per-entry rules; isDir holds the entries before e.
// Entries are sorted, and a path sorts after every proper prefix of it, so
// e's parent directory, when present, is already in isDir.
func checkEntry(e *Entry, isDir map[string]bool) error {
	if err := checkPath(e.Path); err != nil {
		return err
	}
	if _, dup := isDir[e.Path]; dup {
		return errcode.New(errcode.PackageInvalid, "transfer entry %q appears twice", e.Path)
	}
	if parent := path.Dir(e.Path); parent != "." {
		d, ok := isDir[parent]
		if !ok {
			return errcode.New(errcode.PackageInvalid, "transfer entry %q: its directory %q has no entry", e.Path, parent)
		}
		if !d {
			return errcode.New(errcode.PackageInvalid, "transfer entry %q lies below %q, which is a file", e.Path, parent)
		}
	}
	if err := pkgtree.CheckType("transfer", e.Path, entryType[e.Type]); err != nil {
		return err
	}
	if err := pkgtree.CheckPerm("transfer", e.Path, uint32(e.Mode)); err != nil {
		return err
	}
	if e.Type == TypeDirectory {
		if e.Mode != ModeDirectory {
			return errcode.New(errcode.ModeUnsafe, "transfer directory %q has mode %d; directories are %d (0755)", e.Path, e.Mode, ModeDirectory)
		}
		if e.Size != 0 || e.SHA256 != nil {
			return errcode.New(errcode.SchemaInvalid, "transfer directory %q must have size 0 and sha256 null", e.Path)
		}
		return nil
	}
	if e.Mode != ModeFile && e.Mode != ModeExec {
		return errcode.New(errcode.ModeUnsafe, "transfer file %q has mode %d; files are %d (0644) or %d (0755)", e.Path, e.Mode, ModeFile, ModeExec)
	}
	if e.Size < 0 || e.SHA256 == nil || !binding.CheckDigest(*e.SHA256) {
		return errcode.New(errcode.SchemaInvalid, "transfer file %q needs a size and a sha256:<64 lowercase hex>", e.Path)
	}
	return checkFileSize(e.Path, e.Size)
}

// entryType maps the envelope's entry types to the file types of
// pkgtree.CheckType; any other type maps to 0, which it refuses as
// package-invalid.
var entryType = map[string]uint32{TypeDirectory: unix.S_IFDIR, TypeFile: unix.S_IFREG, "symlink": unix.S_IFLNK}

// checkPath applies the path rule: relative, at most maxPath bytes, and
// every '/'-separated component a name that bind accepts (pkgtree.CheckName:
// no empty, "." or ".." component, none over 255 bytes, valid UTF-8 without
// control characters, no ".git").
func checkPath(p string) error {
	shown := p
	if len(shown) > 96 {
		shown = shown[:96] + "..."
	}
	if len(p) > maxPath {
		return errcode.New(errcode.PathUnsafe, "transfer entry path %q is longer than %d bytes", shown, maxPath)
	}
	if strings.HasPrefix(p, "/") {
		return errcode.New(errcode.PathUnsafe, "transfer entry path %q is absolute", shown)
	}
	for _, c := range strings.Split(p, "/") {
		if err := pkgtree.CheckName("transfer entry path", shown, c); err != nil {
			return err
		}
	}
	return nil
}

// decodePayload checks the payload of entry e and returns its bytes (nil for
// a directory). Only the canonical standard padded base64 of the bytes is
// accepted: decoders skip newlines and ignore padding bits, so the decoded
// bytes are encoded again and must give back the exact payload.
func decodePayload(e *Entry, payload *string) ([]byte, error) {
	if e.Type == TypeDirectory {
		if payload != nil {
			return nil, errcode.New(errcode.SchemaInvalid, "transfer directory %q must have a null payload", e.Path)
		}
		return nil, nil
	}
	if payload == nil {
		return nil, errcode.New(errcode.SchemaInvalid, "transfer file %q has a null payload", e.Path)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(*payload)
	if err != nil || base64.StdEncoding.EncodeToString(b) != *payload {
		return nil, errcode.New(errcode.SchemaInvalid, "transfer file %q: payload is not canonical standard padded base64", e.Path)
	}
	if int64(len(b)) != e.Size {
		return nil, errcode.New(errcode.IntegrityMismatch, "transfer file %q: payload holds %d bytes, the manifest says %d", e.Path, len(b), e.Size)
	}
	if binding.Digest(b) != *e.SHA256 {
		return nil, errcode.New(errcode.IntegrityMismatch, "transfer file %q: payload does not hash to its manifest sha256", e.Path)
	}
	return b, nil
}

// packageManifest parses the package's own manifest file from the entries.
func packageManifest(entries []Entry, data [][]byte) (*wire.Manifest, error) {
	for i, e := range entries {
		if e.Path == wire.ManifestFile && e.Type == TypeFile {
			return manifest.Parse(data[i], "transferred "+wire.ManifestFile)
		}
	}
	return nil, errcode.New(errcode.ManifestMissing, "transfer has no %s file at the package root", wire.ManifestFile)
}

// checkEntrypoint requires the manifest's entrypoint to be an executable
// file entry ([MAN-3]).
func checkEntrypoint(entries []Entry, rel string) error {
	for _, e := range entries {
		if e.Path != rel {
			continue
		}
		if e.Type != TypeFile || e.Mode != ModeExec {
			return errcode.New(errcode.EntrypointInvalid, "transfer entrypoint %q is not an executable file (mode %d)", rel, ModeExec)
		}
		return nil
	}
	return errcode.New(errcode.EntrypointMissing, "transfer entrypoint %q is not a file of the package", rel)
}
