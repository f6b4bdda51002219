// Package host is the extension host: it binds a package into a home,
// resolves and revalidates bindings, and runs the handshake and invocations
// of the executable protocol (CONTRACT §4-§7).
//
// The order of every invocation is fixed: re-read the binding file and compare
// its digest; rescan the complete installed tree (canonical confinement,
// owner, 0555/0444 modes, no links) and compare the tree, manifest and
// entrypoint digests; only then run the handshake; only after a matching
// handshake run the invoke. Any drift refuses before package code runs, so a
// changed package never executes. What runs is the entrypoint the rescan
// hashed, executed through the very descriptor it was hashed from (see
// verified), and after the handshake and after the invoke the tree is
// rescanned again: any drift during a call is tamper evidence and refuses
// its answer.
package host

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/lifecycle"
	"firstmate.dev/fm/internal/manifest"
	"firstmate.dev/fm/internal/pkgtree"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// SystemPath is the fixed PATH given to every entrypoint ([INV-3]).
const SystemPath = "/usr/local/bin:/usr/bin:/bin"

// credentialVars pass through only when the binding's credential_store consent
// is true, and only where set in the caller ([INV-3]).
var credentialVars = []string{"HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "SSH_AUTH_SOCK"}

// BindOptions are the operator's choices for one bind ([BIND-1]).
type BindOptions struct {
	Dir       string   // the package directory, absolute
	Adapters  []string // the subset to enable
	Trust     bool     // --trust-same-user-code
	Consents  []string // --consent facts given
	TimeoutMS int64    // invoke timeout
	// HandshakeTimeoutMS bounds the binding's handshakes; 0 is the
	// default, binding.DefaultHandshakeTimeoutMS. It is fm's own setting,
	// stored beside the record (binding.Settings).
	HandshakeTimeoutMS int64
	// Lock, when set, is an already held lifecycle lock (a caller that
	// must publish more under the same lock); Bind then does not take one.
	Lock *lifecycle.Lock
	// Progress, when set, receives the advance of the package's scan,
	// store copy and rescans (pkgtree.Progress), for a progress display.
	Progress pkgtree.Progress
	// Stderr, when set, receives the package's stderr of the bind's
	// handshake (bind --show-stderr); it is never stored [INV-4].
	Stderr StderrFunc
	// Staged marks Dir as a transfer received into this home ([XFER-3]).
	// Such a package lies inside the home by design, so instead of
	// [PKG-2] Dir must be a canonical directory inside exactly this
	// home's data/extensions/staging; nothing else in the home qualifies.
	Staged bool
}

// Bind validates the package at opts.Dir, installs it into the store, runs a
// live handshake against the installed copy, revalidates that copy (the
// handshake ran package code in it: checkAfterHandshake) and publishes the
// binding. Nothing is published on any failure. The revalidation before the
// handshake builds on the install's own verification of the copy
// (pkgtree.Reverify): the copy is hashed again only if it changed since.
func Bind(ctx context.Context, h *home.Home, opts BindOptions) (*binding.Binding, error) {
	p, err := readPackage(h, &opts, "")
	if err != nil {
		return nil, err
	}
	if opts.Lock == nil {
		lock, err := lifecycle.Acquire(ctx, h)
		if err != nil {
			return nil, err
		}
		defer lock.Release()
	}
	rec, err := p.prepare(ctx, h, opts, "")
	if err != nil {
		return nil, err
	}
	return Publish(h, rec, opts)
}

// Publish stores the fm-owned settings of rec's binding from opts, then
// publishes rec ([BIND-4]); the caller holds the lifecycle lock.
func Publish(h *home.Home, rec *binding.Record, opts BindOptions) (*binding.Binding, error) {
	data, err := rec.Encode()
	if err != nil {
		return nil, err
	}
	if err := binding.WriteSettings(h, rec.ExtensionID, binding.Digest(data), binding.Settings{HandshakeTimeoutMS: handshakeBound(opts)}); err != nil {
		return nil, err
	}
	return binding.Publish(h, rec)
}

// handshakeBound is the handshake bound opts set, in milliseconds.
func handshakeBound(opts BindOptions) int64 {
	if opts.HandshakeTimeoutMS == 0 {
		return binding.DefaultHandshakeTimeoutMS
	}
	return opts.HandshakeTimeoutMS
}

// Prepare is Bind up to its publication, for fm extension upgrade ([UPG-1]),
// which holds the lifecycle lock (opts.Lock) and replaces the enabled
// binding of extension id, if any: the package must be of that extension,
// the registry checks ([BIND-4]) leave its binding out, and the new record
// is returned installed and handshaken but unpublished, with its digest.
// Nothing of the registry changes.
func Prepare(ctx context.Context, h *home.Home, opts BindOptions, id string) (*binding.Record, string, error) {
	if opts.Lock == nil {
		return nil, "", errcode.New(errcode.Internal, "Prepare needs the lifecycle lock")
	}
	p, err := readPackage(h, &opts, id)
	if err != nil {
		return nil, "", err
	}
	rec, err := p.prepare(ctx, h, opts, id)
	if err != nil {
		return nil, "", err
	}
	data, err := rec.Encode()
	if err != nil {
		return nil, "", err
	}
	return rec, binding.Digest(data), nil
}

// source is an operator's package directory as bind read it, before the
// lifecycle lock: its scanned tree, manifest and digests.
type source struct {
	tree                            *pkgtree.Tree
	m                               *wire.Manifest
	manifestDigest, entryDigest     string
	hostProtocol, capabilityVersion int64
}

// readPackage applies the bind rules that need no lock to opts.Dir
// (cleaning its spelling in opts) and reads the package, which must be of
// extension id unless id is "".
func readPackage(h *home.Home, opts *BindOptions, id string) (*source, error) {
	if err := checkTrust(*opts); err != nil {
		return nil, err
	}
	if opts.TimeoutMS == 0 {
		opts.TimeoutMS = binding.DefaultTimeoutMS
	}
	if err := checkLocation(h, *opts); err != nil {
		return nil, err
	}
	// The location check resolves the path as the kernel would, so a
	// trailing slash (as shell completion adds) or "x/.." passes it; from
	// here on, and in the record, the package is its clean spelling.
	opts.Dir = filepath.Clean(opts.Dir)
	tree, err := pkgtree.ScanWith(opts.Dir, pkgtree.Source, pkgtree.Options{Progress: opts.Progress})
	if err != nil {
		return nil, err
	}
	m, manifestDigest, err := readManifest(opts.Dir, tree)
	if err != nil {
		return nil, err
	}
	if id != "" && m.ID != id {
		return nil, errcode.New(errcode.Usage, "package %s is extension %s, not %s", opts.Dir, m.ID, id)
	}
	entryDigest, err := checkEntrypoint(tree, m.Entrypoint, opts.Dir)
	if err != nil {
		return nil, err
	}
	hp, cv, err := CheckOptions(h, m, *opts)
	if err != nil {
		return nil, err
	}
	return &source{tree: tree, m: m, manifestDigest: manifestDigest, entryDigest: entryDigest, hostProtocol: hp, capabilityVersion: cv}, nil
}

// prepare is the part of a bind under the lifecycle lock up to the
// publication: the registry check (leaving out the binding of replacing, an
// extension id, when not ""), the store copy, the record and the handshake
// against the copy.
func (p *source) prepare(ctx context.Context, h *home.Home, opts BindOptions, replacing string) (*binding.Record, error) {
	SweepTemps(h)
	existing, err := binding.Load(h)
	if err != nil {
		return nil, err
	}
	existing = slices.DeleteFunc(existing, func(b *binding.Binding) bool { return b.ExtensionID == replacing })
	m := p.m
	if err := CheckRegistry(existing, m.ID, opts.Adapters); err != nil {
		return nil, err
	}
	root := h.PackageRoot(m.ID, m.Version, binding.Hex(p.tree.Digest))
	_, statErr := os.Lstat(root)
	installed, err := pkgtree.InstallWith(opts.Dir, p.tree, root, pkgtree.Options{Progress: opts.Progress})
	if err != nil {
		return nil, err
	}
	if afterInstall != nil {
		afterInstall(root)
	}
	created := errors.Is(statErr, fs.ErrNotExist)
	var consents binding.Consents
	consents.TrustedSameUserCode = true
	for _, c := range opts.Consents {
		consents.Set(c)
	}
	adapters := slices.Clone(opts.Adapters)
	slices.Sort(adapters)
	rec := &binding.Record{
		Schema:           binding.Schema,
		ExtensionID:      m.ID,
		ExtensionVersion: m.Version,
		Source:           binding.Source{Kind: binding.SourceKind, Path: opts.Dir},
		PackageRoot:      root,
		ManifestSHA256:   p.manifestDigest,
		PackageDigest:    p.tree.Digest,
		Entrypoint:       m.Entrypoint,
		EntrypointSHA256: p.entryDigest,
		HostProtocol:     p.hostProtocol,
		Capabilities:     []binding.Capability{{Name: wire.CapabilityName, Version: p.capabilityVersion, AdapterNames: adapters}},
		Consents:         consents,
		TimeoutMS:        opts.TimeoutMS,
	}
	if err := rec.Validate(h, "new binding"); err != nil {
		return nil, err
	}
	// The owner record of the bind handshake already pins the digest the
	// binding will have once published: its bytes are fully determined.
	data, err := rec.Encode()
	if err != nil {
		return nil, err
	}
	damaged := func(err error) error { return damagedAtBind(rec, created, err) }
	if err := handshake(ctx, h, rec, binding.Digest(data), installed, damaged, opts.Stderr, handshakeBound(opts)); err != nil {
		return nil, err
	}
	return rec, nil
}

// afterInstall, when set (by tests only), runs between a bind's install of
// the store copy at root and the revalidation before its handshake, to
// change the copy deterministically in between.
var afterInstall func(root string)

// checkTrust requires --trust-same-user-code ([BIND-1]).
func checkTrust(opts BindOptions) error {
	if !opts.Trust {
		return errcode.New(errcode.ConsentMissing, "bind runs the package as you: pass --trust-same-user-code to confirm you trust it to that level")
	}
	return nil
}

// checkLocation applies [PKG-1] and [PKG-2] to an operator's package
// directory. A staged transfer ([XFER-3]) lies inside the home by design: it
// must instead be canonical (no symlink in any component) and strictly inside
// this home's staging area, which only receive-transfer-bind writes.
func checkLocation(h *home.Home, opts BindOptions) error {
	if !opts.Staged {
		return pkgtree.CheckLocation(opts.Dir, h.Dir)
	}
	c, err := filepath.EvalSymlinks(opts.Dir)
	if err != nil || c != opts.Dir || !strings.HasPrefix(c, h.Staging()+string(filepath.Separator)) {
		return errcode.New(errcode.PathUnsafe, "staged package %s is not a canonical directory inside %s", opts.Dir, h.Staging())
	}
	return nil
}

// CheckOptions applies the bind rules that need only the package's manifest
// and the operator's options: trust and every required consent ([BIND-1]),
// declared and non-built-in adapters ([BIND-2]) and a common version
// ([BIND-3]). It returns the negotiated host protocol and capability version.
// receive-transfer-bind runs it before staging anything, so a mistyped call
// never consumes a transfer identity.
func CheckOptions(h *home.Home, m *wire.Manifest, opts BindOptions) (hostProtocol, capabilityVersion int64, err error) {
	if err := checkTrust(opts); err != nil {
		return 0, 0, err
	}
	for _, fact := range m.RequiredConsents {
		if !slices.Contains(opts.Consents, fact) {
			return 0, 0, errcode.New(errcode.ConsentMissing, "package %s requires consent %q: pass --consent %s", m.ID, fact, fact)
		}
	}
	if len(opts.Adapters) == 0 {
		return 0, 0, errcode.New(errcode.Usage, "name at least one --adapter to enable (declared: %s)", strings.Join(m.Capabilities[0].AdapterNames, ", "))
	}
	for _, a := range opts.Adapters {
		if !slices.Contains(m.Capabilities[0].AdapterNames, a) {
			return 0, 0, errcode.New(errcode.CapabilityMismatch, "adapter %q is not declared by %s (declared: %s)", a, m.ID, strings.Join(m.Capabilities[0].AdapterNames, ", "))
		}
		if builtin := BuiltinScript(h, a); fileExists(builtin) {
			return 0, 0, errcode.New(errcode.AdapterConflict, "adapter %q is owned by the built-in %q; it cannot be bound", a, builtin)
		}
	}
	hp := manifest.Highest(m.HostProtocols, protocol.HostProtocols)
	cv := manifest.Highest(m.Capabilities[0].Versions, protocol.CapabilityVersions)
	if hp == 0 || cv == 0 {
		return 0, 0, errcode.New(errcode.ProtocolIncompatible, "package %s@%s offers host protocols %v and %s versions %v; this host supports [1] and [1]", m.ID, m.Version, m.HostProtocols, wire.CapabilityName, m.Capabilities[0].Versions)
	}
	return hp, cv, nil
}

// CheckRegistry refuses to add a binding of extension id enabling adapters to
// the registry existing ([BIND-4]): one binding per id, one binding per
// adapter, at most binding.MaxRecords records. Callers hold the lifecycle
// lock, so the answer stays true until they publish.
func CheckRegistry(existing []*binding.Binding, id string, adapters []string) error {
	if b, _ := binding.Find(existing, id); b != nil {
		return errcode.New(errcode.BindingExists, "a binding for %s already exists at %q; to bind another version or other settings run fm extension upgrade %s <package-dir> --trust-same-user-code, which moves its sources too (or retire it first: fm extension retire-binding)", id, b.Path, id)
	}
	for _, a := range adapters {
		if b, _ := binding.ForAdapter(existing, a); b != nil {
			return errcode.New(errcode.AdapterConflict, "adapter %q is already enabled by %s; retire that binding first", a, b.ExtensionID)
		}
	}
	if len(existing) >= binding.MaxRecords {
		return errcode.New(errcode.RegistryOversized, "the registry already holds %d bindings", binding.MaxRecords)
	}
	return nil
}

// BuiltinScript is the path of a built-in adapter script ([HOME-1]).
func BuiltinScript(h *home.Home, adapter string) string {
	return filepath.Join(h.Root, "bin", "fm-procevent-"+adapter+".sh")
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// readManifest reads the manifest named by the scanned tree and checks that
// its bytes are the ones the scan hashed.
func readManifest(root string, tree *pkgtree.Tree) (*wire.Manifest, string, error) {
	digest, ok := pkgtree.FileSHA256(tree, wire.ManifestFile)
	if !ok {
		return nil, "", errcode.New(errcode.ManifestMissing, "package %q has no %s at its root", root, wire.ManifestFile)
	}
	path := filepath.Join(root, wire.ManifestFile)
	f, err := fsutil.OpenNoFollow(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	data, err := strictjson.Read(f, wire.MaxManifestBytes, "manifest "+path)
	if err != nil {
		return nil, "", err
	}
	if binding.Digest(data) != digest {
		return nil, "", errcode.New(errcode.IntegrityMismatch, "manifest %q changed while it was being read", path)
	}
	m, err := manifest.Parse(data, "manifest "+path)
	if err != nil {
		return nil, "", err
	}
	return m, digest, nil
}

func checkEntrypoint(tree *pkgtree.Tree, rel, root string) (string, error) {
	for _, e := range tree.Entries {
		if e.Path != rel {
			continue
		}
		if e.Dir {
			return "", errcode.New(errcode.EntrypointInvalid, "entrypoint %q in %q is a directory", rel, root)
		}
		if !e.Exec {
			return "", errcode.New(errcode.EntrypointInvalid, "entrypoint %q in %q is not executable (chmod +x it)", rel, root)
		}
		d, _ := pkgtree.FileSHA256(tree, rel)
		return d, nil
	}
	return "", errcode.New(errcode.EntrypointMissing, "entrypoint %q is not a file in %q", rel, root)
}

// Revalidate re-checks an installed identity against its record ([INV-1]):
// the complete installed tree, its digest, the manifest digest and the
// entrypoint digest.
func Revalidate(rec *binding.Record) error {
	v, err := verify(rec, nil)
	if err != nil {
		return err
	}
	v.close()
	return nil
}

// verified is an installed package proved, by one scan, to match its
// binding ([INV-1]): the stamp of the inodes that scan validated, and the
// entrypoint open through the very descriptor whose bytes it hashed. Every
// launch of the package executes that descriptor (launch.Spec.Exec), so
// what runs is the inode whose digest was checked, never a file looked up
// by name again; see "Only what was verified runs" in docs/architecture.md.
type verified struct {
	stamp string
	entry *os.File
	root  *os.File // the package root that scan walked: every launch's working directory
	// env is the launches' environment, built (and the state and records
	// directories made sure of) by the first launchSpec: an Invoke builds
	// its handshake's and its invoke's specs back to back, before any
	// package code runs, so a second look could find nothing new.
	env []string
	// mode, when set, is the confinement of these launches instead of the
	// home's setting: an operator's explicit --confinement on a direct call.
	mode confine.Mode
	// ruleset and plan are the launches' confinement, built with env.
	ruleset *os.File
	plan    confine.Plan
}

func (v *verified) close() {
	v.entry.Close()
	v.root.Close()
	if v.ruleset != nil {
		v.ruleset.Close()
	}
}

// verify scans rec's installed tree and checks it against rec, keeping the
// entrypoint open. With since, a verification of that tree moments ago
// (bind's install), the scan is pkgtree.Reverify: a walk that reads no
// byte when every inode is as since found it, a full scan otherwise.
func verify(rec *binding.Record, since *pkgtree.Tree) (*verified, error) {
	opts := pkgtree.Options{Keep: rec.Entrypoint}
	var tree *pkgtree.Tree
	var err error
	if since != nil {
		tree, err = pkgtree.Reverify(rec.PackageRoot, since, opts)
	} else {
		tree, err = pkgtree.ScanWith(rec.PackageRoot, pkgtree.Installed, opts)
	}
	if err != nil {
		// An absent root is the scan's first refusal; only then is it
		// looked at again, for the operator's words.
		if errcode.Is(err, errcode.PackageMissing) {
			if _, lerr := os.Lstat(rec.PackageRoot); os.IsNotExist(lerr) {
				return nil, errcode.New(errcode.PackageMissing, "installed package %q is missing; rebind %s", rec.PackageRoot, rec.ExtensionID)
			}
		}
		return nil, err
	}
	v := &verified{stamp: tree.Stamp, entry: tree.Kept, root: tree.Root}
	if err := matches(rec, tree); err != nil {
		v.close()
		return nil, err
	}
	return v, nil
}

// matches checks a scanned tree against rec's digests.
func matches(rec *binding.Record, tree *pkgtree.Tree) error {
	if tree.Digest != rec.PackageDigest {
		return errcode.New(errcode.IntegrityMismatch, "installed package %q no longer has digest %s; it was changed after bind", rec.PackageRoot, rec.PackageDigest)
	}
	if d, ok := pkgtree.FileSHA256(tree, wire.ManifestFile); !ok || d != rec.ManifestSHA256 {
		return errcode.New(errcode.IntegrityMismatch, "installed manifest in %q does not match manifest_sha256", rec.PackageRoot)
	}
	d, err := checkEntrypoint(tree, rec.Entrypoint, rec.PackageRoot)
	if err != nil {
		return err
	}
	if d != rec.EntrypointSHA256 {
		return errcode.New(errcode.IntegrityMismatch, "installed entrypoint %q does not match entrypoint_sha256", rec.Entrypoint)
	}
	return nil
}

// recheck rescans rec's installed tree after package code ran and proves it
// is still the one v verified: the same inodes, unchanged, with the same
// digests. Any drift is tamper evidence, integrity-mismatch whatever the
// rescan found (a file made writable, a link, a missing store copy): the
// call's outcome is refused, and since the tree no longer matches its
// binding, every later call refuses before running anything. A rescan that
// the host's own resource exhaustion stopped is no drift: host-resource.
func (v *verified) recheck(rec *binding.Record, after string) error {
	tree, err := pkgtree.Scan(rec.PackageRoot, pkgtree.Installed)
	if err == nil {
		err = matches(rec, tree)
	}
	if err == nil && tree.Stamp != v.stamp {
		err = errcode.New(errcode.IntegrityMismatch, "a file or directory was replaced, written or chmod'ed (same digest, other inode or change time)")
	}
	if errcode.HostFault(err) {
		// Not drift: the host could not read the tree. The call's outcome
		// is still refused (its tree is unproven), but nothing says the
		// package changed, and the next call verifies afresh [OP-3].
		return errcode.Wrap(errcode.HostResource, err, "installed package %q could not be revalidated after the %s ran; its outcome is refused", rec.PackageRoot, after)
	}
	if err != nil {
		return errcode.Wrap(errcode.IntegrityMismatch, err, "installed package %q changed while the %s ran (tamper evidence; the result is refused and %s stays refused until it is rebound)", rec.PackageRoot, after, rec.ExtensionID)
	}
	return nil
}

// Current re-reads b's binding file and checks it still has b's digest, so an
// invocation never runs on a binding that was replaced or retired meanwhile.
func Current(b *binding.Binding) error {
	data, err := fsutil.ReadPrivateFile(b.Path, binding.MaxBytes)
	if os.IsNotExist(err) {
		return errcode.New(errcode.BindingMissing, "binding %q was retired", b.Path)
	}
	if err != nil {
		return err
	}
	if binding.Digest(data) != b.Digest {
		return errcode.New(errcode.IntegrityMismatch, "binding %q changed since it was resolved", b.Path)
	}
	return nil
}

// Call is how one operation is invoked: the operation and its input are
// Invoke's typed arguments.
type Call struct {
	Adapter   string
	RequestID string // "" for a fresh random id
	SourceID  string // recorded in the owner record; may be ""
	// Stderr, when set, receives the package's stderr of the call's
	// handshake and invoke (launch.Spec.Stderr). Only an operator's direct
	// call sets it (--show-stderr); it is never stored [INV-4].
	Stderr StderrFunc
	// Confinement, when set, replaces the home's confinement setting for
	// this call's handshake and invoke: an operator's explicit check of
	// whether confinement is what makes a package fail [CONF-5].
	Confinement confine.Mode
	// Diagnostic, when set, receives the diagnostic of a well-formed
	// ok=false answer of the invoke, which is otherwise validated and
	// dropped: an operator's opt-in (a direct call's --show-stderr, a
	// source's debug log), never evidence [PROTO-4].
	Diagnostic DiagnosticFunc
	// Notice, when set, is told once per call when the package runs with
	// less confinement than its binding's ruleset (enforce on a kernel that
	// lacks a feature) [CONF-3]: a direct call prints it.
	Notice func(string)
}

// DiagnosticFunc receives the code, retryability and diagnostic of an
// invoke's ok=false answer.
type DiagnosticFunc func(code wire.Code, retryable bool, diagnostic string)

// show hands the diagnostic of out, an invoke's answer to requestID, to f
// when f is set and out is a well-formed ok=false answer.
func (f DiagnosticFunc) show(out []byte, requestID string) {
	if f == nil {
		return
	}
	if resp, err := protocol.DecodeResponse(out, requestID); err == nil && !resp.OK {
		f(resp.Error.Code, resp.Error.Retryable, resp.Error.Diagnostic)
	}
}

// StderrFunc receives the stderr of one invocation: its verb ("handshake" or
// "invoke"), at most wire.MaxStderrBytes bytes of it, and how many bytes the
// package wrote.
type StderrFunc func(verb string, kept []byte, total int64)

// show hands s's stderr to f, when f is set.
func (f StderrFunc) show(s *launch.Spec) {
	if f != nil {
		verb := s.Verb
		s.Stderr = func(kept []byte, total int64) { f(verb, kept, total) }
	}
}

// Invoke revalidates b, handshakes, and runs the operation op with input in,
// returning its decoded result.
//
// The order of what runs package code is fixed: revalidation, then the
// handshake, then (only after a matching handshake) the invoke. What is not
// package code is overlapped with it: the invoke's launch is prepared
// (owner record, launch barrier started and waiting, see launch.Prepare)
// while the handshake runs, so the start-up of its barrier, a whole fm
// process, is off the critical path. A failed handshake aborts it unreleased.
//
// The call's start-up holds a slot of ctx's launch gate (launch.Enter; serve
// and reconcile set one): from before the package is verified until the
// invoke's entrypoint has been executed, so a herd of calls is queued here,
// where no package's bound runs, rather than by the kernel [INV-5].
func Invoke[In, Out any](ctx context.Context, h *home.Home, b *binding.Binding, op Op[In, Out], in In, c Call) (*Out, error) {
	if op.name == "" {
		return nil, errcode.New(errcode.Internal, "no operation named")
	}
	if !b.Enables(c.Adapter) {
		return nil, errcode.New(errcode.AdapterUnbound, "binding %s does not enable adapter %q", b.ExtensionID, c.Adapter)
	}
	if c.RequestID == "" {
		c.RequestID = protocol.NewRequestID()
	}
	if err := Current(b); err != nil {
		return nil, err
	}
	leave, err := launch.Enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	v, err := verify(&b.Record, nil)
	if err != nil {
		return nil, err
	}
	defer v.close()
	v.mode = c.Confinement
	hs, hsReq, err := handshakeSpec(h, &b.Record, b.Digest, v, 0)
	if err != nil {
		return nil, err
	}
	if c.Notice != nil && v.plan.Mode != confine.Off && len(v.plan.Lacked) > 0 {
		c.Notice(b.ExtensionID + " runs " + v.plan.String())
	}
	input, err := strictjson.Canonical(in)
	if err != nil {
		return nil, err
	}
	req := wire.Request{
		Schema:            wire.RequestSchema,
		RequestID:         c.RequestID,
		HostProtocol:      b.HostProtocol,
		ExtensionID:       b.ExtensionID,
		ExtensionVersion:  b.ExtensionVersion,
		PackageDigest:     b.PackageDigest,
		Capability:        wire.CapabilityName,
		CapabilityVersion: b.Capabilities[0].Version,
		Adapter:           c.Adapter,
		Operation:         op.name,
		Input:             input,
	}
	invSpec, err := launchSpec(h, &b.Record, b.Digest, v, "invoke", req, c.RequestID, c.SourceID, op.name, time.Duration(b.TimeoutMS)*time.Millisecond)
	if err != nil {
		return nil, err
	}
	c.Stderr.show(&hs)
	c.Stderr.show(&invSpec)
	invSpec.Running = leave
	// The handshake's barrier is forked first (forks are serialized), then
	// the invoke's is prepared in the background while the handshake runs.
	hsp, err := launch.Prepare(ctx, hs)
	if err != nil {
		return nil, err
	}
	inv := prepare(ctx, invSpec)
	var out []byte
	res, err := hsp.Run(ctx)
	if err != nil {
		err = v.explain(&b.Record, "handshake", err)
	}
	// The handshake was package code: re-check what it could have changed,
	// whatever its outcome, before anything else ([INV-1]).
	if rerr := v.recheck(&b.Record, "handshake"); rerr != nil {
		err = rerr
	}
	if err == nil {
		out = res.Stdout
		if err = protocol.CheckHandshake(out, hsReq); err == nil {
			err = Current(b)
		}
	}
	if err != nil {
		inv.abort()
		return nil, err
	}
	out, err = inv.run(ctx)
	if rerr := v.recheck(&b.Record, "invoke"); rerr != nil {
		return nil, rerr
	}
	if err != nil {
		return nil, v.explain(&b.Record, "invoke", err)
	}
	raw, err := protocol.CheckResponse(out, c.RequestID)
	if err != nil {
		c.Diagnostic.show(out, c.RequestID)
		return nil, v.explain(&b.Record, "invoke", err)
	}
	decoded, err := op.Decode(raw)
	if err != nil {
		return nil, v.explain(&b.Record, "invoke", err)
	}
	return decoded, nil
}

// Handshake revalidates rec, runs the handshake ([PROTO-1], [PROTO-2]) and
// revalidates rec again, because the handshake ran package code in the
// installed copy: verify and register-extension must not report success for
// a copy that the next run will refuse (damagedByHandshake). bindingDigest
// is recorded in the invocation's owner record.
func Handshake(ctx context.Context, h *home.Home, rec *binding.Record, bindingDigest string) error {
	return handshake(ctx, h, rec, bindingDigest, nil, func(err error) error { return damagedByHandshake(rec, err) }, nil, 0)
}

// handshake revalidates rec (building on since, when not nil: see verify),
// runs its handshake and revalidates it again; damaged turns a failure of
// the second revalidation into the caller's refusal; show, when set,
// receives the package's stderr; bound is the handshake bound in
// milliseconds (0: the binding's setting). It holds a slot of ctx's launch
// gate throughout (see Invoke).
func handshake(ctx context.Context, h *home.Home, rec *binding.Record, bindingDigest string, since *pkgtree.Tree, damaged func(error) error, show StderrFunc, bound int64) error {
	leave, err := launch.Enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	v, err := verify(rec, since)
	if err != nil {
		return err
	}
	defer v.close()
	s, req, err := handshakeSpec(h, rec, bindingDigest, v, bound)
	if err != nil {
		return err
	}
	show.show(&s)
	out, err := launchRun(ctx, s)
	if rerr := v.recheck(rec, "handshake"); rerr != nil {
		return damaged(rerr)
	}
	if err != nil {
		return v.explain(rec, "handshake", err)
	}
	return protocol.CheckHandshake(out, req)
}

// handshakeSpec builds a fresh handshake request for rec and its launch,
// bounded by bound milliseconds, or with bound 0 by the binding's handshake
// setting ([HINT-3]).
func handshakeSpec(h *home.Home, rec *binding.Record, bindingDigest string, v *verified, bound int64) (launch.Spec, *wire.HandshakeRequest, error) {
	if bound == 0 {
		st, err := binding.ReadSettings(h, rec.ExtensionID, bindingDigest)
		if err != nil {
			return launch.Spec{}, nil, err
		}
		bound = st.HandshakeTimeoutMS
	}
	c := rec.Capabilities[0]
	req := &wire.HandshakeRequest{
		Schema:           wire.HandshakeRequestSchema,
		RequestID:        protocol.NewRequestID(),
		HostProtocols:    protocol.HostProtocols,
		ExtensionID:      rec.ExtensionID,
		ExtensionVersion: rec.ExtensionVersion,
		PackageDigest:    rec.PackageDigest,
		Capability:       wire.HandshakeCapability{Name: c.Name, Versions: []int64{c.Version}, AdapterNames: c.AdapterNames},
	}
	s, err := launchSpec(h, rec, bindingDigest, v, "handshake", req, req.RequestID, "", "handshake", time.Duration(bound)*time.Millisecond)
	return s, req, err
}

// launchSpec encodes req and builds the launch of verb on rec's entrypoint,
// as v verified it and holds it open: the exact environment, the package
// root as working directory, the bounds, the owner. It creates the
// package's state directory and the invocation records directory (once per
// v: see verified.env).
func launchSpec(h *home.Home, rec *binding.Record, bindingDigest string, v *verified, verb string, req any, requestID, sourceID, op string, timeout time.Duration) (launch.Spec, error) {
	stdin, err := strictjson.Canonical(req)
	if err != nil {
		return launch.Spec{}, err
	}
	if len(stdin) > wire.MaxEnvelopeBytes {
		return launch.Spec{}, errcode.New(errcode.RequestOversized, "%s request is %d bytes; the bound is %d", verb, len(stdin), wire.MaxEnvelopeBytes)
	}
	if v.env == nil {
		env, err := Environment(h, rec)
		if err != nil {
			return launch.Spec{}, err
		}
		if err := home.EnsurePrivate(h.Invocations(), true); err != nil {
			return launch.Spec{}, err
		}
		if v.ruleset, v.plan, err = confinement(h, rec, env, v.mode); err != nil {
			return launch.Spec{}, err
		}
		v.env = env
	}
	return launch.Spec{
		Path:        filepath.Join(rec.PackageRoot, filepath.FromSlash(rec.Entrypoint)),
		Exec:        v.entry,
		Verb:        verb,
		Dir:         rec.PackageRoot,
		DirFile:     v.root,
		Env:         v.env,
		Ruleset:     v.ruleset,
		Stdin:       stdin,
		StdoutLimit: wire.MaxEnvelopeBytes,
		StderrLimit: wire.MaxStderrBytes,
		Timeout:     timeout,
		Records:     h.Invocations(),
		Owner: launch.Owner{
			ExtensionID:   rec.ExtensionID,
			BindingDigest: bindingDigest,
			RequestID:     requestID,
			SourceID:      sourceID,
			Operation:     op,
		},
	}, nil
}

// launchRun runs s and returns its stdout.
func launchRun(ctx context.Context, s launch.Spec) ([]byte, error) {
	res, err := launch.Run(ctx, s)
	if err != nil {
		return nil, err
	}
	return res.Stdout, nil
}

// pending is a launch being prepared in the background (launch.Prepare).
type pending struct {
	done chan struct{}
	p    *launch.Pending
	err  error
}

func prepare(ctx context.Context, s launch.Spec) *pending {
	pd := &pending{done: make(chan struct{})}
	go func() {
		defer close(pd.done)
		pd.p, pd.err = launch.Prepare(ctx, s)
	}()
	return pd
}

// run waits for the preparation, then releases and runs the launch.
func (pd *pending) run(ctx context.Context) ([]byte, error) {
	<-pd.done
	if pd.err != nil {
		return nil, pd.err
	}
	res, err := pd.p.Run(ctx)
	if err != nil {
		return nil, err
	}
	return res.Stdout, nil
}

// abort waits for the preparation and gives the launch up unreleased. The
// caller is already failing with its own error; should the barrier's group
// not be proved gone, its owner record stays for Cleanup.
func (pd *pending) abort() {
	<-pd.done
	if pd.p != nil {
		_ = pd.p.Abort()
	}
}

// Environment builds the exact minimal environment of an entrypoint
// ([INV-3]) and creates the package's private state and temporary
// directories.
func Environment(h *home.Home, rec *binding.Record) ([]string, error) {
	state := h.ExtensionState(rec.ExtensionID)
	if err := home.EnsurePrivate(h.State, false); err != nil {
		return nil, err
	}
	if err := home.EnsurePrivate(state, true); err != nil {
		return nil, err
	}
	tmp := h.ExtensionTemp(rec.ExtensionID)
	if err := home.EnsurePrivate(filepath.Dir(tmp), true); err != nil {
		return nil, err
	}
	if err := home.EnsurePrivate(tmp, true); err != nil {
		return nil, err
	}
	env := []string{
		"PATH=" + SystemPath,
		"LANG=C",
		"LC_ALL=C",
		"FIRSTMATE_EXTENSION_ID=" + rec.ExtensionID,
		"FIRSTMATE_EXTENSION_VERSION=" + rec.ExtensionVersion,
		"FIRSTMATE_EXTENSION_STATE=" + state,
		"TMPDIR=" + tmp,
	}
	if rec.Consents.CredentialStore {
		for _, k := range credentialVars {
			if v, ok := os.LookupEnv(k); ok {
				env = append(env, k+"="+v)
			}
		}
	}
	return env, nil
}

// Resolve loads the registry and returns the binding enabling adapter.
func Resolve(h *home.Home, adapter string) (*binding.Binding, error) {
	bs, err := binding.Load(h)
	if err != nil {
		return nil, err
	}
	if bs == nil {
		return nil, errcode.New(errcode.AdapterUnbound, "no extension bindings in this home; bind a package that provides adapter %q", adapter)
	}
	return binding.ForAdapter(bs, adapter)
}

// Verify revalidates and handshakes every binding, or the one named id
// ([LST-3]). It returns the verified bindings.
func Verify(ctx context.Context, h *home.Home, id string) ([]*binding.Binding, error) {
	bs, err := binding.Load(h)
	if err != nil {
		return nil, err
	}
	if id != "" {
		b, err := binding.Find(bs, id)
		if err != nil {
			return nil, err
		}
		bs = []*binding.Binding{b}
	}
	for _, b := range bs {
		if err := Handshake(ctx, h, &b.Record, b.Digest); err != nil {
			return nil, err
		}
	}
	return bs, nil
}

// ReleaseInvocations resolves the owner records of dead hosts that pin
// bindingDigest, and refuses with binding-in-use while any record
// for it remains (a live invocation or an unproven group).
func ReleaseInvocations(h *home.Home, bindingDigest string) error {
	dir := h.Invocations()
	match := func(r launch.Record) bool { return r.BindingDigest == bindingDigest }
	if _, err := os.Lstat(dir); os.IsNotExist(err) {
		return nil
	}
	_, cerr := launch.Cleanup(dir, match)
	pins, err := launch.Pins(dir, bindingDigest)
	if err != nil {
		return err
	}
	if len(pins) > 0 {
		return errcode.New(errcode.BindingInUse, "%d invocation record(s) in %q still pin binding %s (a live invocation or a group not yet proved gone); retry, or run fm extension cleanup-invocations", len(pins), dir, bindingDigest)
	}
	if errcode.Is(cerr, errcode.ProcessCleanupFailed) {
		return nil // every record Cleanup kept has ended since: nothing pins the binding
	}
	return cerr
}

// SourceDrift compares the source directory a binding was bound from
// (source.path) with its bound copy ([LST-5]) and returns what an operator
// should know, or "" when they match: the directory is missing or cannot be
// scanned, or its tree digest differs (it was edited since the bind, which
// changes nothing that runs: the bound copy does). A transfer's source is
// its staged unit, which only fm writes: it is not compared. It runs no
// package code.
func SourceDrift(h *home.Home, b *binding.Binding) string {
	src := b.Source.Path
	if strings.HasPrefix(src, h.Staging()+string(filepath.Separator)) {
		return ""
	}
	tree, err := pkgtree.Scan(src, pkgtree.Source)
	switch {
	case err != nil && errcode.Is(err, errcode.PackageMissing):
		return "source directory " + src + " is missing; the bound copy is unaffected"
	case err != nil:
		return "source directory " + src + " cannot be scanned (" + string(errcode.Of(err)) + "), so it cannot be compared with the bound copy"
	case tree.Digest != b.PackageDigest:
		return "source directory " + src + " differs from the bound copy (its tree is " + tree.Digest + "); what runs is the bound copy: to bind the directory, run fm extension upgrade " + b.ExtensionID + " " + src + " --trust-same-user-code"
	}
	return ""
}
