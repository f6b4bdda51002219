// Package binding holds the enabled-binding record and the registry
// config/extensions.d that holds them (CONTRACT §5).
//
// Registry rules, checked by every reader: the directory is canonical, owned
// and exactly 0700; it holds at most MaxRecords entries, counted before any is
// parsed; every entry is <extension_id>.json (no dot files, no other names);
// every file is one regular file with one link, owned, exactly 0600 and at
// most 65,536 bytes; every record passes Validate; no adapter is enabled by
// two records. One bad record refuses the whole registry: a reader never
// selects around it, because a half-trusted registry is how the wrong package
// gets run.
//
// Publication never replaces a file: a concurrent bind of the same id loses
// cleanly (renameat2 RENAME_NOREPLACE from a temp file outside the registry,
// so readers never see a temp name or a second link).
package binding

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// Schema is the binding record schema.
const Schema = "firstmate.extension-binding.v1"

// MaxRecords bounds the registry.
const MaxRecords = 128

// MaxBytes bounds one record file.
const MaxBytes = 65536

// Timeout bounds, in milliseconds ([BIND-1]).
const (
	MinTimeoutMS     = 100
	MaxTimeoutMS     = 3600000
	DefaultTimeoutMS = 300000
)

// Record is the binding document, field for field ([BND-1]).
type Record struct {
	Schema           string       `json:"schema"`
	ExtensionID      string       `json:"extension_id"`
	ExtensionVersion string       `json:"extension_version"`
	Source           Source       `json:"source"`
	PackageRoot      string       `json:"package_root"`
	ManifestSHA256   string       `json:"manifest_sha256"`
	PackageDigest    string       `json:"package_digest"`
	Entrypoint       string       `json:"entrypoint"`
	EntrypointSHA256 string       `json:"entrypoint_sha256"`
	HostProtocol     int64        `json:"host_protocol"`
	Capabilities     []Capability `json:"capabilities"`
	Consents         Consents     `json:"consents"`
	TimeoutMS        int64        `json:"timeout_ms"`
}

// Source records where the package was bound from, for inspection or reinstall.
type Source struct {
	Kind string `json:"kind"`
	Path string `json:"path"`
}

// SourceKind is the only source kind.
const SourceKind = "local-directory"

// Capability is the enabled capability: one version and the enabled subset of
// adapter names.
type Capability struct {
	Name         string   `json:"name"`
	Version      int64    `json:"version"`
	AdapterNames []string `json:"adapter_names"`
}

// Consents records each supported consent fact as an explicit boolean.
type Consents struct {
	TrustedSameUserCode bool `json:"trusted_same_user_code"`
	Network             bool `json:"network"`
	CredentialStore     bool `json:"credential_store"`
	TaskMetadata        bool `json:"task_metadata"`
	ArtifactReferences  bool `json:"artifact_references"`
}

// Set records fact (a manifest consent name) as given.
func (c *Consents) Set(fact string) {
	switch fact {
	case "network":
		c.Network = true
	case "credential-store":
		c.CredentialStore = true
	case "task-metadata":
		c.TaskMetadata = true
	case "artifact-references":
		c.ArtifactReferences = true
	}
}

// Has reports whether fact (a manifest consent name) was given.
func (c Consents) Has(fact string) bool {
	switch fact {
	case "network":
		return c.Network
	case "credential-store":
		return c.CredentialStore
	case "task-metadata":
		return c.TaskMetadata
	case "artifact-references":
		return c.ArtifactReferences
	}
	return false
}

// Binding is one validated record as found in a registry.
type Binding struct {
	Record
	Path   string // the record file
	Digest string // sha256:<hex> of the file's exact bytes
}

// Adapters returns the enabled adapter names.
func (b *Binding) Adapters() []string { return b.Capabilities[0].AdapterNames }

// Enables reports whether the binding enables adapter.
func (b *Binding) Enables(adapter string) bool { return slices.Contains(b.Adapters(), adapter) }

// Encode returns the record's exact file bytes ([BND-2]).
func (r *Record) Encode() ([]byte, error) { return strictjson.Pretty(r) }

// Digest returns the binding digest of file bytes.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// CheckDigest reports whether d is sha256:<64 lowercase hex>: the form of
// a request id, checked by the one rule for it (wire.ValidRequestID).
func CheckDigest(d string) bool { return wire.ValidRequestID(d) }

// Hex returns the hex part of a sha256:<hex> digest.
func Hex(d string) string { return strings.TrimPrefix(d, "sha256:") }

// Validate applies every record rule; h gives the home the record must live in.
func (r *Record) Validate(h *home.Home, what string) error {
	bad := func(format string, args ...any) error {
		return errcode.New(errcode.SchemaInvalid, "%s: %s", what, fmt.Sprintf(format, args...))
	}
	if r.Schema != Schema {
		return bad("schema must be %q", Schema)
	}
	if err := wire.CheckID(r.ExtensionID); err != nil {
		return bad("extension_%v", err)
	}
	if err := wire.CheckVersion(r.ExtensionVersion); err != nil {
		return bad("extension_%v", err)
	}
	if r.Source.Kind != SourceKind || !filepath.IsAbs(r.Source.Path) || filepath.Clean(r.Source.Path) != r.Source.Path {
		return bad("source must be a %s with a canonical absolute path", SourceKind)
	}
	for name, d := range map[string]string{"manifest_sha256": r.ManifestSHA256, "package_digest": r.PackageDigest, "entrypoint_sha256": r.EntrypointSHA256} {
		if !CheckDigest(d) {
			return bad("%s must be sha256:<64 lowercase hex>", name)
		}
	}
	if want := h.PackageRoot(r.ExtensionID, r.ExtensionVersion, Hex(r.PackageDigest)); r.PackageRoot != want {
		return bad("package_root must be %q", want)
	}
	if err := wire.CheckEntrypoint(r.Entrypoint); err != nil {
		return bad("%v", err)
	}
	if !slices.Contains(protocol.HostProtocols, r.HostProtocol) {
		return errcode.New(errcode.ProtocolIncompatible, "%s: host_protocol %d is not supported by this host (supported: 1); rebind with this host", what, r.HostProtocol)
	}
	if len(r.Capabilities) != 1 || r.Capabilities[0].Name != wire.CapabilityName {
		return bad("capabilities must hold exactly one %s capability", wire.CapabilityName)
	}
	c := r.Capabilities[0]
	if !slices.Contains(protocol.CapabilityVersions, c.Version) {
		return errcode.New(errcode.ProtocolIncompatible, "%s: %s version %d is not supported by this host (supported: 1)", what, c.Name, c.Version)
	}
	if err := wire.CheckAdapterNames(c.AdapterNames); err != nil {
		return bad("capabilities[0].%v", err)
	}
	if !r.Consents.TrustedSameUserCode {
		return bad("consents.trusted_same_user_code must be true")
	}
	if r.TimeoutMS < MinTimeoutMS || r.TimeoutMS > MaxTimeoutMS {
		return bad("timeout_ms must be %d..%d", MinTimeoutMS, MaxTimeoutMS)
	}
	return nil
}

// Load reads and validates the whole registry of h ([BND-4]). An absent
// registry directory is not an error: it returns nil and creates nothing
// ([HOME-5]). Bindings come back in id order. Any malformed record refuses
// the whole registry, and so do two bindings that enable one adapter
// (adapter-conflict, naming both and the command that retires either).
//
// Others publish into and retire from the registry while it is read: a name
// listed and then gone when it is read was retired meanwhile, which is not a
// malformed registry. The registry is then listed again, at most
// relistBound times; the last listing treats a name gone by its read as not
// there. A record replaced by a rename over its name is read as its new
// content (fsutil.ReadPrivateFile opens it again). Every real refusal stays.
func Load(h *home.Home) ([]*Binding, error) { return loadAll(h, "") }

// LoadForRetire is Load for the retirement of the binding of id, with the one
// exception to [BND-4]'s whole-registry refusal: an adapter that id's binding
// enables and another binding enables too is not refused, so that an
// operator can always undo such a conflict with fm itself (a hand-made copy
// of a record, or bindings published by a lock-file race before fm proved
// lock identity). That holds however many bindings enable the adapter: with
// three, the retirement of any one of them proceeds though the other two
// still conflict on it, so each retirement undoes part of the conflict.
// Every other malformation still refuses, and so does a conflict on an
// adapter id's binding does not enable.
func LoadForRetire(h *home.Home, id string) ([]*Binding, error) { return loadAll(h, id) }

// loadAll is Load, tolerating adapter conflicts that involve the binding of
// retiring (none when empty).
func loadAll(h *home.Home, retiring string) ([]*Binding, error) {
	dir := h.Bindings()
	if _, err := os.Lstat(dir); os.IsNotExist(err) {
		return nil, nil
	}
	if err := home.CheckPrivate(dir, true); err != nil {
		return nil, err
	}
	// config/ too: a mount over it carries extensions.d along unseen.
	if err := fsutil.OnParentMount(filepath.Dir(dir), -1, "config directory"); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		out, err := load(h, dir, attempt == relistBound, retiring)
		if err != errVanished {
			return out, err
		}
	}
}

// relistBound bounds how often Load lists the registry again after a name
// vanished between its listing and its read.
const relistBound = 8

// errVanished is load's answer when a listed record was gone by its read.
var errVanished = errors.New("a listed record vanished before it was read")

// afterList, when set (by tests only), runs between load's listing and its
// reads, to inject a concurrent retirement deterministically.
var afterList func(names []string)

// load is one listing and read of the registry dir; skipVanished treats a
// name gone by its read as not there instead of answering errVanished, and
// an adapter conflict involving retiring is tolerated (LoadForRetire).
func load(h *home.Home, dir string, skipVanished bool, retiring string) ([]*Binding, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, errcode.Wrap(errcode.RegistryInvalid, err, "registry %q", dir)
	}
	names, err := f.Readdirnames(MaxRecords + 1)
	f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, errcode.Wrap(errcode.RegistryInvalid, err, "registry %q", dir)
	}
	if len(names) > MaxRecords {
		return nil, errcode.New(errcode.RegistryOversized, "registry %q holds more than %d entries; retire bindings you no longer use", dir, MaxRecords)
	}
	sort.Strings(names)
	if afterList != nil {
		afterList(names)
	}
	var out []*Binding
	undone := map[string]bool{} // the adapters of the binding being retired
	for _, name := range names {
		b, err := read(h, filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			if skipVanished {
				continue
			}
			return nil, errVanished
		}
		if err != nil {
			return nil, err
		}
		out = append(out, b)
		if b.ExtensionID == retiring {
			for _, a := range b.Adapters() {
				undone[a] = true
			}
		}
	}
	owner := map[string]*Binding{}
	for _, b := range out {
		for _, a := range b.Adapters() {
			if undone[a] {
				continue // its conflicts are what the retirement undoes
			}
			if other, dup := owner[a]; dup {
				return nil, errcode.New(errcode.AdapterConflict, "registry %q: adapter %q is enabled by both %s (binding %s) and %s (binding %s); retire one of them: fm extension retire-binding %s --if-binding-digest %s, or fm extension retire-binding %s --if-binding-digest %s", dir, a, other.ExtensionID, other.Digest, b.ExtensionID, b.Digest, other.ExtensionID, other.Digest, b.ExtensionID, b.Digest)
			}
			owner[a] = b
		}
	}
	return out, nil
}

func read(h *home.Home, path string) (*Binding, error) {
	name := filepath.Base(path)
	id, ok := strings.CutSuffix(name, ".json")
	if strings.HasPrefix(name, ".") || !ok || wire.CheckID(id) != nil {
		return nil, errcode.New(errcode.RegistryInvalid, "registry entry %q is not <extension-id>.json; remove it", path)
	}
	data, err := fsutil.ReadPrivateFile(path, MaxBytes)
	if err != nil {
		return nil, err
	}
	var r Record
	if err := strictjson.Decode(data, MaxBytes, "binding "+path, &r); err != nil {
		return nil, err
	}
	if err := r.Validate(h, "binding "+path); err != nil {
		return nil, err
	}
	if r.ExtensionID != id {
		return nil, errcode.New(errcode.RegistryInvalid, "binding %q holds extension_id %q, not %q", path, r.ExtensionID, id)
	}
	return &Binding{Record: r, Path: path, Digest: Digest(data)}, nil
}

// Find returns the binding with id from bs, or binding-missing.
func Find(bs []*Binding, id string) (*Binding, error) {
	for _, b := range bs {
		if b.ExtensionID == id {
			return b, nil
		}
	}
	return nil, errcode.New(errcode.BindingMissing, "no binding for extension %q; see fm extension list", id)
}

// ForAdapter returns the single binding that enables adapter, or adapter-unbound.
func ForAdapter(bs []*Binding, adapter string) (*Binding, error) {
	for _, b := range bs {
		if b.Enables(adapter) {
			return b, nil
		}
	}
	return nil, errcode.New(errcode.AdapterUnbound, "no binding enables adapter %q; bind a package that provides it", adapter)
}

// Publish writes r as <registry>/<id>.json without replacing any file, and
// returns the published binding. The registry directory is created 0700 if
// absent. A record for the same id that already exists is binding-exists.
func Publish(h *home.Home, r *Record) (*Binding, error) {
	data, err := r.Encode()
	if err != nil {
		return nil, err
	}
	dir := h.Bindings()
	if err := home.EnsurePrivate(filepath.Dir(dir), false); err != nil {
		return nil, err
	}
	if err := home.EnsurePrivate(dir, true); err != nil {
		return nil, err
	}
	final := filepath.Join(dir, r.ExtensionID+".json")
	reg, err := home.OpenPrivate(dir, true)
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	err = fsutil.CreateAt(reg, r.ExtensionID+".json", data)
	if errors.Is(err, fsutil.ErrExists) {
		return nil, errcode.New(errcode.BindingExists, "a binding for %s already exists at %q; to bind another version or other settings run fm extension upgrade %s <package-dir> --trust-same-user-code (or retire it first: fm extension retire-binding)", r.ExtensionID, final, r.ExtensionID)
	}
	if err != nil {
		return nil, err
	}
	return &Binding{Record: *r, Path: final, Digest: Digest(data)}, nil
}
