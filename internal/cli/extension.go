package cli

import (
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/retire"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
	"firstmate.dev/fm/pkg/fmjson"
)

// bindFlags are the bind options shared by bind, receive-transfer-bind and
// remote-bind ([BIND-1]).
type bindFlags struct {
	adapters stringList
	trust    bool
	consents stringList
	timeout  *string // nil when --timeout-ms was not given: "" is a value, and malformed
}

func (f *bindFlags) declare(fs *flag.FlagSet) {
	fs.Var(&f.adapters, "adapter", "an adapter name to enable (repeatable; at least one)")
	fs.BoolVar(&f.trust, "trust-same-user-code", false, "confirm that the package is trusted to run as you (required)")
	fs.Var(&f.consents, "consent", "a consent fact the package requires: "+strings.Join(wire.Consents, ", ")+" (repeatable)")
	fs.Func("timeout-ms", "invoke timeout in milliseconds, 100..3600000 (default 300000)", func(v string) error {
		f.timeout = &v
		return nil
	})
}

// options checks the flags and returns host options for dir.
func (f *bindFlags) options(dir string) (host.BindOptions, error) {
	opts := host.BindOptions{Dir: dir, Trust: f.trust, TimeoutMS: binding.DefaultTimeoutMS}
	for _, c := range f.consents {
		if !slices.Contains(wire.Consents, c) {
			return opts, errcode.New(errcode.Usage, "unknown consent %q (known: %s)", c, strings.Join(wire.Consents, ", "))
		}
		if !slices.Contains(opts.Consents, c) {
			opts.Consents = append(opts.Consents, c)
		}
	}
	for _, a := range f.adapters {
		if slices.Contains(opts.Adapters, a) {
			return opts, errcode.New(errcode.Usage, "--adapter %q given twice", a)
		}
		opts.Adapters = append(opts.Adapters, a)
	}
	if f.timeout != nil {
		n, err := strconv.ParseInt(*f.timeout, 10, 64)
		if err != nil || strings.TrimLeft(*f.timeout, "0123456789") != "" || n < binding.MinTimeoutMS || n > binding.MaxTimeoutMS {
			return opts, errcode.New(errcode.Usage, "--timeout-ms %q must be a decimal integer 100..3600000", *f.timeout)
		}
		opts.TimeoutMS = n
	}
	return opts, nil
}

// bindOptions checks the bind flags for the package directory dir, then
// resolves the home: the opening of bind and receive-transfer-bind.
func (e *Env) bindOptions(f *bindFlags, dir string) (*home.Home, host.BindOptions, error) {
	opts, err := f.options(dir)
	if err != nil {
		return nil, opts, err
	}
	h, err := e.Home()
	return h, opts, err
}

// args returns the flags as command-line arguments, for forwarding a bind to
// another home.
func (f *bindFlags) args() []string {
	var out []string
	for _, a := range f.adapters {
		out = append(out, "--adapter", a)
	}
	if f.trust {
		out = append(out, "--trust-same-user-code")
	}
	for _, c := range f.consents {
		out = append(out, "--consent", c)
	}
	if f.timeout != nil {
		out = append(out, "--timeout-ms", *f.timeout)
	}
	return out
}

// printBound prints the six bind lines ([BIND-7]), and on stderr the
// warning of an entrypoint that finds its files through $0.
func printBound(e *Env, b *binding.Binding) {
	warnDollarZero(e, b)
	fmt.Fprintf(e.Stdout, "bound: %s@%s\n", b.ExtensionID, b.ExtensionVersion)
	fmt.Fprintf(e.Stdout, "binding: %s\n", b.Path)
	fmt.Fprintf(e.Stdout, "binding-digest: %s\n", b.Digest)
	fmt.Fprintf(e.Stdout, "package: %s\n", b.PackageRoot)
	fmt.Fprintf(e.Stdout, "package-digest: %s\n", b.PackageDigest)
	fmt.Fprintf(e.Stdout, "verified: %s/%d (%s)\n", b.Capabilities[0].Name, b.Capabilities[0].Version, strings.Join(b.Adapters(), ","))
}

// localBindFlags are the flags of bind and upgrade: the bind options and
// --show-stderr, which prints the package's stderr of the handshake here
// (an author's loop) and so is not forwarded to another home.
type localBindFlags struct {
	bindFlags
	showStderr bool
	handshake  *string // nil when --handshake-timeout-ms was not given
}

// local returns the bind options of dir with the local flags applied.
func (f *localBindFlags) local(e *Env, dir string) (*home.Home, host.BindOptions, error) {
	var handshake int64 // 0: not given
	if f.handshake != nil {
		v := *f.handshake
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || strings.TrimLeft(v, "0123456789") != "" || n < binding.MinHandshakeTimeoutMS || n > binding.MaxHandshakeTimeoutMS {
			return nil, host.BindOptions{}, errcode.New(errcode.Usage, "--handshake-timeout-ms %q must be a decimal integer 100..600000", v)
		}
		handshake = n
	}
	h, opts, err := e.bindOptions(&f.bindFlags, dir)
	opts.HandshakeTimeoutMS = handshake
	if f.showStderr {
		opts.Stderr = showStderr(e.Stderr)
	}
	return h, opts, err
}

func (f *localBindFlags) declare(fs *flag.FlagSet) {
	f.bindFlags.declare(fs)
	fs.Func("handshake-timeout-ms", "handshake bound in milliseconds, 100..600000 (default 5000; upgrade: the current binding's)", func(v string) error {
		f.handshake = &v
		return nil
	})
	fs.BoolVar(&f.showStderr, "show-stderr", false, "print the package's stderr of the handshake (at most 8192 bytes, escaped) on stderr; it is never stored")
}

// extensionBind is `fm extension bind` ([BIND-1], [BIND-8]).
func extensionBind(e *Env, bf *localBindFlags, args []string) error {
	if err := need(args, 1, 1, "one package directory"); err != nil {
		return err
	}
	dir := args[0]
	if !filepath.IsAbs(dir) {
		return errcode.New(errcode.PathUnsafe, "package directory %q must be an absolute path: give its canonical spelling, such as the output of (cd %q && pwd -P)", dir, dir)
	}
	h, opts, err := bf.local(e, dir)
	if err != nil {
		return err
	}
	defer e.withProgress(&opts.Progress)()
	b, err := host.Bind(e.Ctx, h, opts)
	if err != nil {
		return err
	}
	printBound(e, b)
	return nil
}

// warnDollarZero prints, on stderr, the warning for an entrypoint script
// that finds its files through $0 ([HINT-4]), when b's is one.
func warnDollarZero(e *Env, b *binding.Binding) {
	if w := host.DollarZeroWarning(&b.Record); w != "" {
		fmt.Fprintf(e.Stderr, "warning: %s\n", w)
	}
}

// extensionList is `fm extension list`.
func extensionList(e *Env, f *jsonFlag, args []string) error {
	if err := need(args, 0, 0, "no arguments"); err != nil {
		return err
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	bs, err := binding.Load(h)
	if err != nil {
		return err
	}
	if f.json {
		doc, err := listDocument(h, bs)
		if err != nil {
			return err
		}
		return writeJSON(e, doc)
	}
	if len(bs) == 0 {
		fmt.Fprintln(e.Stdout, "no extension bindings")
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "EXTENSION\tVERSION\tCAPABILITY\tADAPTERS\tPACKAGE_DIGEST")
	for _, b := range bs {
		c := b.Capabilities[0]
		fmt.Fprintf(tw, "%s\t%s\t%s/%d\t%s\t%s\n", b.ExtensionID, b.ExtensionVersion, c.Name, c.Version, strings.Join(c.AdapterNames, ","), b.PackageDigest)
	}
	return tw.Flush()
}

// inspectFlags is inspect's --json, accepted for symmetry: the record is
// printed as JSON either way.
type inspectFlags struct{}

func (*inspectFlags) declare(fs *flag.FlagSet) {
	fs.Bool("json", false, "print the record as JSON (the default form)")
}

// extensionInspect is `fm extension inspect`.
func extensionInspect(e *Env, _ *inspectFlags, args []string) error {
	if err := need(args, 1, 1, "one extension id"); err != nil {
		return err
	}
	bs, err := loadRegistry(e)
	if err != nil {
		return err
	}
	b, err := binding.Find(bs, args[0])
	if err != nil {
		return err
	}
	data, err := b.Record.Encode()
	if err != nil {
		return err
	}
	_, err = e.Stdout.Write(data)
	return err
}

// extensionVerify is `fm extension verify` ([LST-3]; its notes: [LST-5]).
func extensionVerify(e *Env, args []string) error {
	h, err := e.homeFor(args, 0, 1, "at most one extension id")
	if err != nil {
		return err
	}
	id := ""
	if len(args) == 1 {
		id = args[0]
	}
	bs, err := host.Verify(e.Ctx, h, id)
	if err != nil {
		return err
	}
	if len(bs) == 0 {
		fmt.Fprintln(e.Stdout, "no extension bindings")
	}
	for _, b := range bs {
		fmt.Fprintf(e.Stdout, "verified: %s@%s %s\n", b.ExtensionID, b.ExtensionVersion, b.PackageDigest)
	}
	for _, b := range bs {
		if note := host.SourceDrift(h, b); note != "" {
			fmt.Fprintf(e.Stdout, "note: %s: %s\n", b.ExtensionID, note)
		}
	}
	if len(bs) > 0 {
		c, err := host.HomeConfinement(h)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.Stdout, "confinement: %s\n", c.Describe())
	}
	return nil
}

// retireBindingFlags are the flags of retire-binding.
type retireBindingFlags struct{ digest string }

func (f *retireBindingFlags) declare(fs *flag.FlagSet) {
	fs.StringVar(&f.digest, "if-binding-digest", "", "the binding digest printed by bind (required)")
}

// extensionRetireBinding is `fm extension retire-binding`.
func extensionRetireBinding(e *Env, f *retireBindingFlags, args []string) error {
	if err := need(args, 1, 1, "one extension id"); err != nil {
		return err
	}
	if f.digest == "" {
		return errcode.New(errcode.Usage, "--if-binding-digest is required")
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	kept, err := retire.Binding(e.Ctx, h, args[0], f.digest)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "retired-binding: %s %s\nretained-at: %s\n", args[0], f.digest, kept)
	return nil
}

// cleanupFlags are the flags of cleanup-invocations.
type cleanupFlags struct{ digest string }

func (f *cleanupFlags) declare(fs *flag.FlagSet) {
	fs.StringVar(&f.digest, "binding-digest", "", "only records that pin this binding")
}

// extensionCleanupInvocations is `fm extension cleanup-invocations`.
func extensionCleanupInvocations(e *Env, f *cleanupFlags, args []string) error {
	h, err := e.homeFor(args, 0, 0, "no arguments")
	if err != nil {
		return err
	}
	n, err := launch.Cleanup(h.Invocations(), func(r launch.Record) bool {
		return !r.HostLive && (f.digest == "" || r.BindingDigest == f.digest)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "cleaned-invocations: %d\n", n)
	return nil
}

// loadRegistry resolves the home and loads its registry; it creates nothing.
func loadRegistry(e *Env) ([]*binding.Binding, error) {
	h, err := e.Home()
	if err != nil {
		return nil, err
	}
	return binding.Load(h)
}

// listDocument is the --json form of extension list, with each binding's
// fm-owned settings.
func listDocument(h *home.Home, bs []*binding.Binding) (fmjson.Bindings, error) {
	doc := fmjson.Bindings{Bindings: []fmjson.Binding{}}
	for _, b := range bs {
		st, err := binding.ReadSettings(h, b.ExtensionID, b.Digest)
		if err != nil {
			return doc, err
		}
		c := b.Capabilities[0]
		doc.Bindings = append(doc.Bindings, fmjson.Binding{
			ExtensionID: b.ExtensionID, ExtensionVersion: b.ExtensionVersion, Capability: c.Name, CapabilityVersion: c.Version,
			AdapterNames: c.AdapterNames, PackageDigest: b.PackageDigest, BindingDigest: b.Digest, Binding: b.Path,
			HandshakeTimeoutMS: st.HandshakeTimeoutMS,
		})
	}
	return doc, nil
}

// writeJSON prints one pretty JSON document.
func writeJSON(e *Env, v any) error {
	data, err := strictjson.Pretty(v)
	if err != nil {
		return err
	}
	_, err = e.Stdout.Write(data)
	return err
}
