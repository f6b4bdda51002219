package procevent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/lifecycle"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// RegistrationSchema is the schema of <state>/procevent/<source-id>.source.
const RegistrationSchema = "firstmate.procevent-source.v1"

// Registration kinds.
const (
	KindBuiltin   = "builtin"
	KindExtension = "extension"
)

// Bounds of a registration.
const (
	maxRegistration = 65536
	maxArgs         = 256
	maxArg          = 4096
)

const sourceSuffix = ".source"

// Registration is one source registration: one generation of a source id,
// identified by its random Token. A built-in registration holds the argv its
// runner executes; an extension registration pins the exact binding and
// package identity it was resolved to, so a later change of the binding
// refuses its polls (as captured evidence) instead of silently using other
// code. The token of a built-in generation is never printed; it only lets a
// terminal verdict retire exactly that generation.
type Registration struct {
	Schema   string   `json:"schema"`
	Kind     string   `json:"kind"`
	Adapter  string   `json:"adapter"`
	SourceID string   `json:"source_id"`
	Token    string   `json:"owner_token"`
	Argv     []string `json:"argv,omitzero"`

	ExtensionID       string `json:"extension_id,omitzero"`
	ExtensionVersion  string `json:"extension_version,omitzero"`
	CapabilityVersion int64  `json:"capability_version,omitzero"`
	PackageDigest     string `json:"package_digest,omitzero"`
	BindingDigest     string `json:"binding_digest,omitzero"`
	ConfigRef         string `json:"config_ref,omitzero"`
}

// External reports whether the registration is served by an extension.
func (r *Registration) External() bool { return r.Kind == KindExtension }

// Owner is "<extension id>@<version>" or "built-in".
func (r *Registration) Owner() string {
	if r.External() {
		return r.ExtensionID + "@" + r.ExtensionVersion
	}
	return "built-in"
}

// owner is the identity part a registration shares with the meta of each
// result it captures.
type owner struct {
	kind, adapter, sourceID       string
	extensionID, extensionVersion string
	capabilityVersion             int64
	packageDigest, bindingDigest  string
}

func (r *Registration) owner() owner {
	return owner{r.Kind, r.Adapter, r.SourceID, r.ExtensionID, r.ExtensionVersion, r.CapabilityVersion, r.PackageDigest, r.BindingDigest}
}

// check applies the identity rules: a valid adapter and source id; for a
// built-in no extension identity at all, for an extension all of it.
func (o owner) check(what string) error {
	bad := func(format string, args ...any) error {
		return errcode.New(errcode.SchemaInvalid, "%s: "+format, append([]any{what}, args...)...)
	}
	if wire.CheckAdapter(o.adapter) != nil {
		return bad("adapter %q is not an adapter name", o.adapter)
	}
	if protocol.CheckSourceID(o.sourceID) != nil {
		return bad("source_id %q is not a source id", o.sourceID)
	}
	switch o.kind {
	case KindBuiltin:
		if o != (owner{kind: o.kind, adapter: o.adapter, sourceID: o.sourceID}) {
			return bad("a built-in owner holds no extension identity")
		}
	case KindExtension:
		switch {
		case wire.CheckID(o.extensionID) != nil || wire.CheckVersion(o.extensionVersion) != nil:
			return bad("extension_id and extension_version must name an extension")
		case !slices.Contains(protocol.CapabilityVersions, o.capabilityVersion):
			return errcode.New(errcode.ProtocolIncompatible, "%s: capability_version %d is not supported by this host", what, o.capabilityVersion)
		case !binding.CheckDigest(o.packageDigest) || !binding.CheckDigest(o.bindingDigest):
			return bad("package_digest and binding_digest must be sha256:<64 lowercase hex>")
		}
	default:
		return bad("kind must be %q or %q", KindBuiltin, KindExtension)
	}
	return nil
}

// validate applies the record rules; what names the record in errors.
func (r *Registration) validate(what string) error {
	bad := func(format string, args ...any) error {
		return errcode.New(errcode.SchemaInvalid, "%s: "+format, append([]any{what}, args...)...)
	}
	if r.Schema != RegistrationSchema {
		return bad("schema must be %q", RegistrationSchema)
	}
	if !binding.CheckDigest(r.Token) {
		return bad("owner_token must be sha256:<64 lowercase hex>")
	}
	if err := r.owner().check(what); err != nil {
		return err
	}
	if r.External() {
		if r.Argv != nil || protocol.CheckConfigRef(r.ConfigRef) != nil {
			return bad("an extension registration holds no argv and a config_ref of one line of 1..%d bytes", wire.MaxConfigRefBytes)
		}
	} else if err := checkArgv(r.Argv); err != nil || r.ConfigRef != "" {
		return bad("a built-in registration holds a valid argv and no config_ref")
	}
	return nil
}

// checkArgv applies the built-in argv rule: 1..256 arguments of at most 4096
// bytes, no NUL, and a program that is absolute or a bare name looked up in
// PATH, because the runner's working directory is not meaningful and nothing
// is ever read from the current directory ([CLI-5]).
func checkArgv(argv []string) error {
	if len(argv) == 0 || len(argv) > maxArgs {
		return errcode.New(errcode.Usage, "argv must hold 1..%d arguments (after --)", maxArgs)
	}
	for _, a := range argv {
		if len(a) > maxArg || strings.ContainsRune(a, 0) {
			return errcode.New(errcode.Usage, "argv arguments must be at most %d bytes without NUL", maxArg)
		}
	}
	if p := argv[0]; p == "" || (strings.ContainsRune(p, '/') && !filepath.IsAbs(p)) {
		return errcode.New(errcode.Usage, "program %q must be an absolute path or a bare command name", p)
	}
	return nil
}

// readRegistration reads the registration of id through the pinned registry.
// A missing one is source-missing.
func readRegistration(reg *os.File, id string) (*Registration, error) {
	data, err := fsutil.ReadPrivateAt(reg, id+sourceSuffix, maxRegistration)
	if os.IsNotExist(err) {
		return nil, errcode.New(errcode.SourceMissing, "no source %q is registered; see fm procevent list", id)
	}
	if err != nil {
		return nil, err
	}
	if LegacyRegistration(data) {
		return nil, ImportNeeded("registration %s is in the earlier text format", filepath.Join(reg.Name(), id+sourceSuffix))
	}
	var r Registration
	what := "registration " + filepath.Join(reg.Name(), id+sourceSuffix)
	if err := strictjson.Decode(data, maxRegistration, what, &r); err != nil {
		return nil, err
	}
	if err := r.validate(what); err != nil {
		return nil, err
	}
	if r.SourceID != id {
		return nil, errcode.New(errcode.SchemaInvalid, "%s: holds source_id %q", what, r.SourceID)
	}
	return &r, nil
}

// sourceIDs lists the registered source ids in order.
func sourceIDs(reg *os.File) ([]string, error) {
	names, err := fsutil.NamesAt(reg)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, n := range names {
		if id, ok := strings.CutSuffix(n, sourceSuffix); ok && protocol.CheckSourceID(id) == nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// Sources reads every registration of h, in source-id order. An absent
// registry has none and is not created.
func Sources(h *home.Home) ([]*Registration, error) {
	d, err := openDirs(h, false, false)
	if err == errAbsent {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.close()
	return d.sources()
}

// sources reads every registration of the pinned registry. Others register
// and retire while it reads: a registration retired between the listing and
// its read is not there (never a malformed registry), and one replaced by a
// new generation meanwhile is read as that generation (fsutil.ReadPrivateAt
// opens it again when the file it opened lost its last link).
func (d *dirs) sources() ([]*Registration, error) {
	if d.reg == nil {
		return nil, nil
	}
	ids, err := sourceIDs(d.reg)
	if err != nil {
		return nil, err
	}
	if afterSourceList != nil {
		afterSourceList(ids)
	}
	var out []*Registration
	for _, id := range ids {
		r, err := readRegistration(d.reg, id)
		if errcode.Is(err, errcode.SourceMissing) {
			continue // retired since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// afterSourceList, when set (by tests only), runs between the listing of
// sources and its reads, to inject a concurrent retirement deterministically.
var afterSourceList func(ids []string)

// Register publishes a built-in registration ([REG-1]): the adapter script
// <code root>/bin/fm-procevent-<adapter>.sh must exist, and argv is stored
// exactly, to be run later directly, without a shell.
func Register(h *home.Home, adapter, sourceID string, argv []string) (*Registration, error) {
	if err := checkNames(adapter, sourceID); err != nil {
		return nil, err
	}
	if err := checkArgv(argv); err != nil {
		return nil, err
	}
	script := host.BuiltinScript(h, adapter)
	if fi, err := os.Stat(script); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return nil, errcode.New(errcode.AdapterUnbound, "no built-in adapter %q: %q is missing or not executable", adapter, script)
	}
	r := &Registration{Schema: RegistrationSchema, Kind: KindBuiltin, Adapter: adapter, SourceID: sourceID, Token: protocol.NewRequestID(), Argv: argv}
	return r, publish(h, r)
}

// RegisterExtension publishes an extension registration ([REG-2]). Under the
// lifecycle lock it resolves the single binding enabling adapter,
// revalidates it and handshakes, then publishes a new generation with a fresh
// random token, so retire-binding can never interleave between the
// resolution and the publication [LIFE-1]. The binding is resolved once
// before the lock as well, read-only, so a home where nothing enables the
// adapter (a fresh one above all) is refused with nothing created, not even
// the lock file [HOME-5]. The wait for the lock ends with ctx.
func RegisterExtension(ctx context.Context, h *home.Home, adapter, sourceID, configRef string) (*Registration, error) {
	if err := checkNames(adapter, sourceID); err != nil {
		return nil, err
	}
	if err := protocol.CheckConfigRef(configRef); err != nil {
		return nil, err
	}
	if _, err := host.Resolve(h, adapter); err != nil {
		return nil, err
	}
	lock, err := lifecycle.Acquire(ctx, h)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	b, err := host.Resolve(h, adapter)
	if err != nil {
		return nil, err
	}
	return RegisterWith(ctx, h, b, adapter, sourceID, configRef)
}

// RegisterWith is RegisterExtension for a caller that holds the lifecycle
// lock and has resolved b, the binding enabling adapter (fm extension
// upgrade, [UPG-1]): it handshakes b and publishes a new generation of
// sourceID with a fresh token.
func RegisterWith(ctx context.Context, h *home.Home, b *binding.Binding, adapter, sourceID, configRef string) (*Registration, error) {
	if err := checkNames(adapter, sourceID); err != nil {
		return nil, err
	}
	if err := protocol.CheckConfigRef(configRef); err != nil {
		return nil, err
	}
	if !b.Enables(adapter) {
		return nil, errcode.New(errcode.AdapterUnbound, "binding %s does not enable adapter %q", b.ExtensionID, adapter)
	}
	if err := host.Handshake(ctx, h, &b.Record, b.Digest); err != nil {
		return nil, err
	}
	r := &Registration{
		Schema: RegistrationSchema, Kind: KindExtension, Adapter: adapter, SourceID: sourceID,
		Token:       protocol.NewRequestID(),
		ExtensionID: b.ExtensionID, ExtensionVersion: b.ExtensionVersion,
		CapabilityVersion: b.Capabilities[0].Version,
		PackageDigest:     b.PackageDigest, BindingDigest: b.Digest, ConfigRef: configRef,
	}
	return r, publish(h, r)
}

func checkNames(adapter, sourceID string) error {
	if err := wire.CheckAdapter(adapter); err != nil {
		return errcode.New(errcode.Usage, "%v", err)
	}
	return protocol.CheckSourceID(sourceID)
}

// publish writes r as the current generation of its source. It takes the
// source's claim without waiting, so a re-registration is refused while a
// prior runner is active ([REG-3]), and no runner can start between the
// claim and the publication. A runner that died mid-poll counts as active
// until the group it left is proved gone (launch.Cleanup), and so does a poll
// whose group its live host could not prove gone, so a new generation never
// starts beside an old poll. It creates the registry and the inbox (0700) so
// the boundary a later external poll checks exists from the start; a
// publication that fails for a source that was not registered leaves no
// claim file behind.
func publish(h *home.Home, r *Registration) error {
	d, err := openDirs(h, r.External(), true)
	if err != nil {
		return err
	}
	defer d.close()
	if err := d.openInbox(true); err != nil {
		return err
	}
	c, err := d.claim(r.SourceID)
	if err != nil {
		return err
	}
	if c == nil {
		return errcode.New(errcode.SourceActive, "source %q: prior runner remains active; stop it (or wait for its poll to end), then register again", r.SourceID)
	}
	defer c.release()
	err = d.publishClaimed(r)
	if err != nil && !fsutil.ExistsAt(d.reg, r.SourceID+sourceSuffix) {
		d.removeLocks(r.SourceID)
	}
	return err
}

// publishClaimed is publish once the claim is held.
func (d *dirs) publishClaimed(r *Registration) error {
	if err := settleSource(d.h, r.SourceID); err != nil {
		return err
	}
	data, err := strictjson.Canonical(r)
	if err != nil {
		return err
	}
	if err := d.recheck(); err != nil {
		return err
	}
	return fsutil.ReplaceAt(d.reg, r.SourceID+sourceSuffix, data)
}
