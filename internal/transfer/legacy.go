package transfer

import (
	"path/filepath"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/pkgtree"
	"firstmate.dev/fm/internal/strictjson"
)

// legacyReceipt is the receipt.json of a unit that the earlier Firstmate
// implementation received: exactly these five members, its schema the
// transfer manifest's. It does not embed the manifest, so retire-transfer
// cannot check it; `fm home import` converts it (ConvertReceipt) and
// loadUnit refuses it with home-import-needed until then.
type legacyReceipt struct {
	ExtensionID      string `json:"extension_id"`
	ExtensionVersion string `json:"extension_version"`
	PackageDigest    string `json:"package_digest"`
	Schema           string `json:"schema"`
	TransferDigest   string `json:"transfer_digest"`
}

func decodeLegacy(data []byte, what string) (*legacyReceipt, error) {
	var r legacyReceipt
	if err := strictjson.Decode(data, maxReceipt, what, &r); err != nil {
		return nil, err
	}
	if r.Schema != ManifestSchema {
		return nil, errcode.New(errcode.SchemaInvalid, "%s: schema must be %q", what, ManifestSchema)
	}
	return &r, nil
}

// IsLegacyReceipt reports whether data is a receipt of the earlier
// implementation.
func IsLegacyReceipt(data []byte) bool {
	_, err := decodeLegacy(data, "receipt")
	return err == nil
}

// ConvertReceipt returns fm's receipt.json for the staged unit dir
// (staging/<id>/<version>/<transfer hex>) whose receipt holds data, a
// receipt of the earlier implementation. The transfer manifest fm's receipt
// embeds is rebuilt from the staged package/ under the rules of bind, and
// must give exactly the receipt's package digest and transfer digest, and
// the receipt must name the unit's id, version and transfer hex:
// integrity-mismatch naming the unit otherwise, for the operator to resolve
// (the unit is then not this transfer's, or was changed after receipt).
func ConvertReceipt(dir string, data []byte) ([]byte, error) {
	path := filepath.Join(dir, ReceiptFile)
	r, err := decodeLegacy(data, "receipt "+path)
	if err != nil {
		return nil, err
	}
	if !binding.CheckDigest(r.TransferDigest) || !binding.CheckDigest(r.PackageDigest) {
		return nil, errcode.New(errcode.SchemaInvalid, "receipt %s: transfer_digest and package_digest must be sha256:<64 lowercase hex>", path)
	}
	version := filepath.Dir(dir)
	id := filepath.Base(filepath.Dir(version))
	if r.ExtensionID != id || r.ExtensionVersion != filepath.Base(version) || binding.Hex(r.TransferDigest) != filepath.Base(dir) {
		return nil, errcode.New(errcode.IntegrityMismatch, "receipt %s names %s@%s transfer %s; its unit directory says otherwise", path, r.ExtensionID, r.ExtensionVersion, r.TransferDigest)
	}
	pkg := filepath.Join(dir, PackageDir)
	tree, err := pkgtree.Scan(pkg, pkgtree.Source)
	if err != nil {
		return nil, err
	}
	m, _ := manifestOf(tree)
	m.ExtensionID, m.ExtensionVersion = r.ExtensionID, r.ExtensionVersion
	if tree.Digest != r.PackageDigest {
		return nil, errcode.New(errcode.IntegrityMismatch, "staged package %s has tree digest %s; its receipt says %s: the unit cannot be imported", pkg, tree.Digest, r.PackageDigest)
	}
	d, err := Digest(&m)
	if err != nil {
		return nil, err
	}
	if d != r.TransferDigest {
		return nil, errcode.New(errcode.IntegrityMismatch, "staged package %s gives transfer digest %s; its receipt says %s: the unit cannot be imported", pkg, d, r.TransferDigest)
	}
	return encodeReceipt(&m, d)
}
