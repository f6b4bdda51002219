// Package upgrade moves an extension's sources to a new package version or
// new binding settings in one command, fm extension upgrade ([UPG-1] to
// [UPG-4]).
//
// The chain is the one an operator would otherwise type by hand, run under
// one hold of the lifecycle lock ([LIFE-1]): retire every source registered
// with the current binding (with its stored owner token), retire that
// binding (with its current digest), bind the new package, register every
// source again with its config_ref (fresh owner tokens, printed and stored
// in the registrations). Everything the design requires of the operator is
// checked before the first change, so a refusal changes nothing: results
// only the current binding may classify must be handled first ([UPG-2]),
// every source's adapter must stay enabled, and the new package must bind
// (install and handshake) before anything is retired.
//
// Before the first change the plan is written durably to
// data/extensions/upgrades/<id>.json: the sources to move (id, adapter,
// config_ref) and the settings. A step that fails after it (a poll that
// cannot be stopped, a registration's handshake) leaves the plan; running
// the same command again finishes the move from wherever it stopped, and
// fm doctor reports the plan until then ([UPG-4]).
package upgrade

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/lifecycle"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/retire"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// PlanSchema is the schema of data/extensions/upgrades/<id>.json.
const PlanSchema = "firstmate.fm-upgrade-plan.v1"

// maxPlan bounds a plan file.
const maxPlan = 1 << 20

// Plan is an upgrade in progress: written before its first change, removed
// after its last.
type Plan struct {
	Schema      string `json:"schema"`
	ExtensionID string `json:"extension_id"`
	// From is the digest of the binding being replaced.
	From       string   `json:"from_binding_digest"`
	PackageDir string   `json:"package_dir"`
	Adapters   []string `json:"adapters"`
	Consents   []string `json:"consents"`
	TimeoutMS  int64    `json:"timeout_ms"`
	// HandshakeTimeoutMS is fm's own setting (binding.Settings).
	HandshakeTimeoutMS int64    `json:"handshake_timeout_ms"`
	Sources            []Source `json:"sources"`
}

// Source is one source the upgrade moves.
type Source struct {
	SourceID  string `json:"source_id"`
	Adapter   string `json:"adapter"`
	ConfigRef string `json:"config_ref"`
}

// Reporter receives each step as it is done, so a command prints what
// happened even when a later step fails.
type Reporter interface {
	RetiredSource(id string)
	RetiredBinding(id, digest, keptAt string)
	Bound(b *binding.Binding)
	Registered(r *procevent.Registration)
	KeptSource(r *procevent.Registration)
}

// Options are an upgrade's inputs. Bind holds the operator's bind options:
// Dir and Trust always; Adapters, Consents and TimeoutMS only where given
// (none, none and 0 keep the current binding's; consents given are added).
type Options struct {
	ID     string
	Bind   host.BindOptions
	Report Reporter
}

// Run upgrades the binding of opts.ID ([UPG-1]). It returns the new binding,
// or the current one with unchanged true when the package and settings give
// a binding identical to it (nothing is changed then, no token reissued).
func Run(ctx context.Context, h *home.Home, opts Options) (b *binding.Binding, unchanged bool, err error) {
	if err := wire.CheckID(opts.ID); err != nil {
		return nil, false, errcode.New(errcode.Usage, "%v", err)
	}
	if bs, err := binding.Load(h); err != nil {
		return nil, false, err
	} else if _, err := binding.Find(bs, opts.ID); err != nil && !fileExists(planPath(h, opts.ID)) {
		return nil, false, err // nothing to upgrade, nothing created [HOME-5]
	}
	lock, err := lifecycle.Acquire(ctx, h)
	if err != nil {
		return nil, false, err
	}
	defer lock.Release()
	opts.Bind.Lock = lock
	u, err := begin(h, opts)
	if err != nil {
		return nil, false, err
	}
	return u.run(ctx)
}

// upgrade is one run under the lock.
type upgrade struct {
	h    *home.Home
	opts Options
	plan *Plan                     // from an interrupted run, or nil
	old  *binding.Binding          // the enabled binding of the id, or nil
	regs []*procevent.Registration // registered with old
}

// begin reads the plan and the current binding and its dependents, and
// checks what needs no package code: a received binding is retire-transfer's
// (transfer-exists), and unhandled results of the current binding refuse
// ([UPG-2]).
func begin(h *home.Home, opts Options) (*upgrade, error) {
	u := &upgrade{h: h, opts: opts}
	plan, err := readPlan(h, opts.ID)
	if err != nil {
		return nil, err
	}
	u.plan = plan
	bs, err := binding.Load(h)
	if err != nil {
		return nil, err
	}
	if u.old, err = binding.Find(bs, opts.ID); err != nil && plan == nil {
		return nil, err
	}
	if u.old == nil {
		return u, nil
	}
	if strings.HasPrefix(u.old.Source.Path, h.Staging()+string(filepath.Separator)) {
		return nil, errcode.New(errcode.TransferExists, "binding %s was received by transfer; bind its new version with receive-transfer-bind after fm extension retire-transfer", opts.ID)
	}
	regs, unhandled, err := procevent.Dependents(h, u.old)
	if err != nil {
		return nil, err
	}
	if len(unhandled) > 0 {
		return nil, procevent.UnhandledError(u.old, unhandled)
	}
	u.regs = regs
	if err := pinnedElsewhere(h, u.old, regs); err != nil {
		return nil, err
	}
	return u, nil
}

// pinnedElsewhere refuses (binding-in-use) while an invocation that is not a
// poll of a source the upgrade moves pins b (a direct call, say): the
// retirement of b would refuse for it after the sources were retired. The
// records of dead hosts are resolved first, as retirement resolves them
// (host.ReleaseInvocations); a poll of a moved source is stopped by the
// source's retirement.
func pinnedElsewhere(h *home.Home, b *binding.Binding, regs []*procevent.Registration) error {
	dir := h.Invocations()
	if _, err := os.Lstat(dir); os.IsNotExist(err) {
		return nil
	}
	_, _ = launch.Cleanup(dir, func(r launch.Record) bool { return r.BindingDigest == b.Digest })
	pins, err := launch.Pins(dir, b.Digest)
	if err != nil {
		return err
	}
	pins = slices.DeleteFunc(pins, func(r launch.Record) bool {
		return slices.ContainsFunc(regs, func(reg *procevent.Registration) bool { return reg.SourceID == r.SourceID })
	})
	if len(pins) > 0 {
		return errcode.New(errcode.BindingInUse, "%d invocation(s) not of a source it moves pin binding %s (%s, host pid %d, operation %s); nothing was changed: let the call end and retry, or run fm extension cleanup-invocations once its host has exited", len(pins), b.Digest, pins[0].Path, pins[0].Host.PID, pins[0].Operation)
	}
	return nil
}

// settings completes the operator's bind options from the current binding,
// else from the plan.
func (u *upgrade) settings() (host.BindOptions, error) {
	o := u.opts.Bind
	var adapters, consents []string
	var timeout, handshake int64
	switch {
	case u.old != nil:
		adapters, timeout = u.old.Adapters(), u.old.TimeoutMS
		for _, c := range wire.Consents {
			if u.old.Consents.Has(c) {
				consents = append(consents, c)
			}
		}
		st, err := binding.ReadSettings(u.h, u.old.ExtensionID, u.old.Digest)
		if err != nil {
			return o, err
		}
		handshake = st.HandshakeTimeoutMS
	case u.plan != nil:
		adapters, consents, timeout, handshake = u.plan.Adapters, u.plan.Consents, u.plan.TimeoutMS, u.plan.HandshakeTimeoutMS
	}
	if len(o.Adapters) == 0 {
		o.Adapters = slices.Clone(adapters)
	}
	for _, c := range consents {
		if !slices.Contains(o.Consents, c) {
			o.Consents = append(o.Consents, c)
		}
	}
	if o.TimeoutMS == 0 {
		o.TimeoutMS = timeout
	}
	if o.HandshakeTimeoutMS == 0 {
		o.HandshakeTimeoutMS = handshake
	}
	return o, nil
}

// sources is every source the upgrade moves: the plan's, and those
// registered with the current binding (their own adapter and config_ref).
func (u *upgrade) sources() []Source {
	var out []Source
	if u.plan != nil {
		out = slices.Clone(u.plan.Sources)
	}
	for _, r := range u.regs {
		s := Source{SourceID: r.SourceID, Adapter: r.Adapter, ConfigRef: r.ConfigRef}
		if i := slices.IndexFunc(out, func(o Source) bool { return o.SourceID == r.SourceID }); i >= 0 {
			out[i] = s
		} else {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b Source) int { return strings.Compare(a.SourceID, b.SourceID) })
	return out
}

// run checks the new settings against the sources, binds the new package
// without publishing it, and then makes the changes in order.
func (u *upgrade) run(ctx context.Context) (*binding.Binding, bool, error) {
	o, err := u.settings()
	if err != nil {
		return nil, false, err
	}
	sources := u.sources()
	for _, s := range sources {
		if !slices.Contains(o.Adapters, s.Adapter) {
			return nil, false, errcode.New(errcode.CapabilityMismatch, "source %q uses adapter %q, which the new binding would not enable (--adapter %s); nothing was changed: keep the adapter, or retire the source first", s.SourceID, s.Adapter, s.Adapter)
		}
	}
	rec, digest, err := host.Prepare(ctx, u.h, o, u.opts.ID)
	if err != nil {
		return nil, false, err
	}
	current := u.old != nil && u.old.Digest == digest
	if current && u.plan == nil {
		st, err := binding.ReadSettings(u.h, u.old.ExtensionID, u.old.Digest)
		if err != nil || st.HandshakeTimeoutMS == o.HandshakeTimeoutMS {
			return u.old, err == nil, err
		}
		// Only fm's own setting changes: the binding and the sources stay.
		return u.old, false, binding.WriteSettings(u.h, u.old.ExtensionID, u.old.Digest, binding.Settings{HandshakeTimeoutMS: o.HandshakeTimeoutMS})
	}
	plan := &Plan{Schema: PlanSchema, ExtensionID: u.opts.ID, PackageDir: o.Dir, Adapters: o.Adapters, Consents: o.Consents, TimeoutMS: o.TimeoutMS, HandshakeTimeoutMS: o.HandshakeTimeoutMS, Sources: sources}
	if u.old != nil {
		plan.From = u.old.Digest
	} else {
		plan.From = u.plan.From
	}
	if err := writePlan(u.h, plan); err != nil {
		return nil, false, err
	}
	b := u.old
	if !current {
		if b, err = u.replace(ctx, rec, o); err != nil {
			return nil, false, err
		}
	}
	if err := u.register(ctx, b, sources); err != nil {
		return nil, false, err
	}
	return b, false, removePlan(u.h, u.opts.ID)
}

// replace retires the sources registered with the current binding and the
// binding itself, then publishes rec with the settings of o.
func (u *upgrade) replace(ctx context.Context, rec *binding.Record, o host.BindOptions) (*binding.Binding, error) {
	for _, r := range u.regs {
		if err := procevent.Retire(ctx, u.h, r.SourceID, procevent.Condition{IfOwner: r.Token}); err != nil {
			return nil, err
		}
		u.opts.Report.RetiredSource(r.SourceID)
	}
	if u.old != nil {
		kept, err := retire.Held(u.h, u.old.ExtensionID, u.old.Digest)
		if err != nil {
			return nil, err
		}
		u.opts.Report.RetiredBinding(u.old.ExtensionID, u.old.Digest, kept)
	}
	b, err := host.Publish(u.h, rec, o)
	if err != nil {
		return nil, err
	}
	u.opts.Report.Bound(b)
	return b, nil
}

// register registers every source with b that is not registered with it
// yet (an interrupted run may have registered some).
func (u *upgrade) register(ctx context.Context, b *binding.Binding, sources []Source) error {
	regs, err := procevent.Sources(u.h)
	if err != nil {
		return err
	}
	for _, s := range sources {
		i := slices.IndexFunc(regs, func(r *procevent.Registration) bool { return r.SourceID == s.SourceID })
		if i >= 0 && regs[i].BindingDigest == b.Digest && regs[i].ConfigRef == s.ConfigRef && regs[i].Adapter == s.Adapter {
			u.opts.Report.KeptSource(regs[i])
			continue
		}
		r, err := procevent.RegisterWith(ctx, u.h, b, s.Adapter, s.SourceID, s.ConfigRef)
		if err != nil {
			return err
		}
		u.opts.Report.Registered(r)
	}
	return nil
}

// planPath is where the plan of an upgrade of id is kept.
func planPath(h *home.Home, id string) string {
	return filepath.Join(Dir(h), id+".json")
}

// Dir is data/extensions/upgrades, the plans of unfinished upgrades.
func Dir(h *home.Home) string { return filepath.Join(h.Extensions(), "upgrades") }

// readPlan reads the plan of id, nil when there is none.
func readPlan(h *home.Home, id string) (*Plan, error) {
	p := planPath(h, id)
	data, err := fsutil.ReadPrivateFile(p, maxPlan)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var plan Plan
	if err := strictjson.Decode(data, maxPlan, "upgrade plan "+p, &plan); err != nil {
		return nil, err
	}
	if plan.Schema != PlanSchema || plan.ExtensionID != id || !binding.CheckDigest(plan.From) {
		return nil, errcode.New(errcode.SchemaInvalid, "upgrade plan %s: not a plan of %s (schema %q)", p, id, PlanSchema)
	}
	return &plan, nil
}

// Plans lists the plans of unfinished upgrades (fm doctor).
func Plans(h *home.Home) ([]*Plan, error) {
	names, err := os.ReadDir(Dir(h))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read %s", Dir(h))
	}
	var out []*Plan
	for _, n := range names {
		id, ok := strings.CutSuffix(n.Name(), ".json")
		if !ok || wire.CheckID(id) != nil {
			continue
		}
		p, err := readPlan(h, id)
		if err != nil {
			return out, err
		}
		if p != nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// writePlan writes plan durably (0600 in a 0700 directory); its lists are
// written as arrays, never null.
func writePlan(h *home.Home, plan *Plan) error {
	for _, l := range []*[]string{&plan.Adapters, &plan.Consents} {
		if *l == nil {
			*l = []string{}
		}
	}
	if plan.Sources == nil {
		plan.Sources = []Source{}
	}
	data, err := strictjson.Canonical(plan)
	if err != nil {
		return err
	}
	if err := home.EnsurePrivate(Dir(h), false); err != nil {
		return err
	}
	d, err := home.OpenPrivate(Dir(h), false)
	if err != nil {
		return err
	}
	defer d.Close()
	return fsutil.ReplaceAt(d, plan.ExtensionID+".json", data)
}

// removePlan removes the plan of id once its upgrade is complete.
func removePlan(h *home.Home, id string) error {
	d, err := home.OpenPrivate(Dir(h), false)
	if err != nil {
		return err
	}
	defer d.Close()
	return fsutil.RemoveAt(d, id+".json")
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
