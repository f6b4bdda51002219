package procevent

import (
	"context"
	"strconv"
	"strings"
	"unicode/utf8"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// Asking a result's owner [CAP-4], [CAP-5], [CAP-7], [OP-4].
//
// A captured result is always interpreted by its captured owner, named by its
// meta: a built-in result by the adapter script of its adapter, an extension
// result by exactly the binding recorded in its meta (same extension id and
// version, capability version, package digest and binding digest). Never by
// whatever owns the adapter name now: a built-in installed later under the
// same name never reinterprets an extension result, and a result whose owner
// binding was retired or replaced cannot be classified until that exact
// binding is restored.
//
// The terminal and silent verdicts change state (a handled marker, a
// retirement), so they are asked only through verdicts, a value that only
// the runner creates, in-process, right after it captured the result, from
// the bytes it holds and the binding it polled with. No command-line
// argument, environment variable or inherited descriptor is an input to it.
// Every failure of a verdict is the false path [OP-4].

// verdicts is the runner's one-shot capability to ask a just-captured
// result's owner for its terminal and silent verdicts. It is unexported and
// never stored or serialized.
type verdicts struct {
	h       *home.Home
	meta    *Meta
	owner   *binding.Binding // the extension binding that polled; nil for built-ins
	content []byte
}

// is asks the owner op (host.Terminal or host.Silent); any failure is
// false, and is returned for the record.
func (v *verdicts) is(ctx context.Context, op host.Op[wire.ResultInput, wire.BoolResult]) (bool, error) {
	res, err := ask(ctx, v.h, v.meta, v.owner, op, v.content, Direct{})
	if err != nil {
		return false, err
	}
	return res.Value, nil
}

// ask asks the owner of the result m the result operation op. b is the owner
// binding when the caller already holds it; nil resolves it from m. An empty
// o.RequestID is a fresh random one.
func ask[Out any](ctx context.Context, h *home.Home, m *Meta, b *binding.Binding, op host.Op[wire.ResultInput, Out], content []byte, o Direct) (*Out, error) {
	if m.Kind == KindBuiltin {
		raw, err := askBuiltin(ctx, h, m, op.Name(), content)
		if err != nil {
			return nil, err
		}
		return op.Decode(raw)
	}
	if !utf8.Valid(content) {
		return nil, errcode.New(errcode.SchemaInvalid, "result %s.%d is not UTF-8 text; an extension cannot be asked about it", m.SourceID, m.Sequence)
	}
	if b == nil {
		var err error
		if b, err = ownerBinding(h, m); err != nil {
			return nil, err
		}
	}
	in := wire.ResultInput{SourceID: m.SourceID, Sequence: m.Sequence, Content: string(content)}
	return host.Invoke(ctx, h, b, op, in, host.Call{
		Adapter:     m.Adapter,
		RequestID:   o.RequestID,
		SourceID:    m.SourceID,
		Stderr:      o.Stderr,
		Diagnostic:  o.Diagnostic,
		Confinement: o.Confinement,
		Notice:      o.Notice,
	})
}

// ownerBinding finds the exact binding recorded in an extension result's
// meta.
func ownerBinding(h *home.Home, m *Meta) (*binding.Binding, error) {
	bs, err := binding.Load(h)
	if err != nil {
		return nil, err
	}
	b, err := binding.Find(bs, m.ExtensionID)
	if err != nil {
		return nil, errcode.New(errcode.BindingMissing, "the owner of result %s.%d, %s@%s (binding %s), is not bound; restore that binding to ask it", m.SourceID, m.Sequence, m.ExtensionID, m.ExtensionVersion, m.BindingDigest)
	}
	if b.Digest != m.BindingDigest || b.ExtensionVersion != m.ExtensionVersion || b.PackageDigest != m.PackageDigest || b.Capabilities[0].Version != m.CapabilityVersion || !b.Enables(m.Adapter) {
		return nil, errcode.New(errcode.OwnerMismatch, "result %s.%d belongs to %s@%s with binding %s, but the current binding of %s is %s; restore the owner binding to ask it", m.SourceID, m.Sequence, m.ExtensionID, m.ExtensionVersion, m.BindingDigest, m.ExtensionID, b.Digest)
	}
	return b, nil
}

// Classify asks the owner of the captured result at path for its
// classification ([CAP-5]). It changes no state.
func Classify(ctx context.Context, h *home.Home, path string) (string, error) {
	l, err := loadResult(h, path)
	if err != nil {
		return "", err
	}
	res, err := ask(ctx, h, l.meta, nil, host.Classify, l.content, Direct{})
	if err != nil {
		return "", err
	}
	return res.Classification, nil
}

// Direct are an operator's options of a direct call ([OP-2]).
type Direct struct {
	RequestID string // "" for a fresh random id
	// Uncaptured lets a direct source.poll run for a source id that is
	// registered in the home, whose event it then consumes outside
	// capture (see Poll).
	Uncaptured bool
	// Stderr, when set, receives the package's stderr (host.Call.Stderr).
	Stderr host.StderrFunc
	// Diagnostic, when set, receives an ok=false answer's diagnostic
	// (host.Call.Diagnostic).
	Diagnostic host.DiagnosticFunc
	// Confinement, when set, replaces the home's confinement setting
	// (host.Call.Confinement): --confinement of a direct call [CONF-5].
	Confinement confine.Mode
	// Notice receives what the kernel could not enforce (host.Call.Notice).
	Notice func(string)
}

// Answer is the owner's answer to a direct result operation: the
// classification of result.classify, or the verdict of result.terminal and
// result.silent.
type Answer struct {
	Operation      string
	Classification string // result.classify
	Verdict        bool   // result.terminal, result.silent
}

// String is the answer as the direct call prints it: the classification, or
// "true" or "false".
func (a Answer) String() string {
	if a.Operation == wire.OpClassify {
		return a.Classification
	}
	return strconv.FormatBool(a.Verdict)
}

// Ask is the direct call of a result operation ([OP-2]): it asks the owner of
// the extension result at path, which must have been captured for adapter
// (and, when sourceID is not empty, for that source), with o.RequestID
// (random when empty). It changes no state: a terminal or silent answer here
// is only printed, never acted on [CAP-7].
func Ask(ctx context.Context, h *home.Home, adapter, op, path, sourceID string, o Direct) (Answer, error) {
	var verdict host.Op[wire.ResultInput, wire.BoolResult]
	switch op {
	case wire.OpPoll:
		return Answer{}, errcode.New(errcode.Usage, "%s takes no --result-file", op)
	case wire.OpClassify:
	case wire.OpTerminal:
		verdict = host.Terminal
	case wire.OpSilent:
		verdict = host.Silent
	default:
		return Answer{}, errcode.New(errcode.Usage, "unknown operation %q (one of %s)", op, strings.Join(wire.Operations, ", "))
	}
	l, err := loadResult(h, path)
	if err != nil {
		return Answer{}, err
	}
	switch {
	case l.meta.Kind != KindExtension:
		return Answer{}, errcode.New(errcode.AdapterUnbound, "result %q was captured by the built-in adapter %q; use fm procevent classify", path, l.meta.Adapter)
	case l.meta.Adapter != adapter:
		return Answer{}, errcode.New(errcode.CapabilityMismatch, "result %q was captured for adapter %q, not %q", path, l.meta.Adapter, adapter)
	case sourceID != "" && sourceID != l.meta.SourceID:
		return Answer{}, errcode.New(errcode.Usage, "result %q belongs to source %q, not %q", path, l.meta.SourceID, sourceID)
	}
	a := Answer{Operation: op}
	if op == wire.OpClassify {
		res, err := ask(ctx, h, l.meta, nil, host.Classify, l.content, o)
		if err != nil {
			return Answer{}, err
		}
		a.Classification = res.Classification
		return a, nil
	}
	res, err := ask(ctx, h, l.meta, nil, verdict, l.content, o)
	if err != nil {
		return Answer{}, err
	}
	a.Verdict = res.Value
	return a, nil
}

// Poll is the direct call of source.poll ([OP-2]): it resolves the binding of
// adapter and polls once with o.RequestID (random when empty). It returns the
// output, or nil for no result, or the failure evidence document ([OP-3]):
// any failure of the poll, including an unresolvable binding, becomes
// evidence, except a host fault (host-resource), which is the host's and is
// returned as an error.
//
// A direct poll captures and announces nothing, so for a source id that is
// registered in the home it would consume the source's event and lose it:
// it is refused (source-registered) unless o.Uncaptured says the operator
// knows. With it, the direct poll is a poll of that source [RUN-4]: it takes
// the source's claim without waiting, exactly as a runner does, or refuses
// (source-active) while a runner holds it; it resolves what dead runners of
// the source left and refuses (process-cleanup-failed) while a poll's group
// stays unproven; and a retire's stop request stops it like a runner's poll.
// These refusals are errors, not evidence: nothing ran.
func Poll(ctx context.Context, h *home.Home, adapter string, in wire.PollInput, o Direct) (output, evidence []byte, err error) {
	ctx, release, err := holdForDirectPoll(ctx, h, in.SourceID, o.Uncaptured)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	b, err := host.Resolve(h, adapter)
	if errcode.Is(err, errcode.HostResource) {
		return nil, nil, err // the host's fault, not evidence [OP-3]
	}
	if err != nil {
		return nil, evidenceFor(err, ""), nil
	}
	out, err := pollExtension(ctx, h, b, adapter, in, host.Call{RequestID: o.RequestID, Stderr: o.Stderr, Diagnostic: o.Diagnostic, Confinement: o.Confinement, Notice: o.Notice})
	if errcode.Is(err, errcode.HostResource) {
		return nil, nil, err
	}
	if err != nil {
		return nil, evidenceFor(err, b.ExtensionID), nil
	}
	return out, nil, nil
}

// holdForDirectPoll refuses a direct poll of a registered source id unless
// uncaptured, and then takes its claim (see Poll). It returns the context the
// poll runs under (a retire's stop request cancels it) and the function that
// releases the claim. An unregistered id is not claimed, and nothing is
// created for it.
func holdForDirectPoll(ctx context.Context, h *home.Home, id string, uncaptured bool) (context.Context, func(), error) {
	none := func() {}
	d, err := openDirs(h, false, false)
	if err == errAbsent {
		return ctx, none, nil
	}
	if err != nil {
		return nil, nil, err
	}
	refuse := func(r *Registration) error {
		return errcode.New(errcode.SourceRegistered, "source %q is registered in this home (adapter %s): a direct poll would consume its event outside capture and the event would be lost; run fm procevent start %s, or pass --uncaptured to poll anyway", id, r.Adapter, id)
	}
	if d.reg != nil && !uncaptured {
		// Before the claim, so that a source whose runner polls it
		// gets this refusal rather than source-active.
		r, err := readRegistration(d.reg, id)
		switch {
		case err == nil:
			d.close()
			return nil, nil, refuse(r)
		case !errcode.Is(err, errcode.SourceMissing):
			d.close()
			return nil, nil, err
		}
	}
	c, r, err := d.claimSource(id)
	switch {
	case errcode.Is(err, errcode.SourceMissing):
		d.close()
		return ctx, none, nil
	case err != nil:
		d.close()
		return nil, nil, err
	case c == nil:
		d.close()
		return nil, nil, errcode.New(errcode.SourceActive, "source %q is registered and its runner is polling it; a direct poll would run beside it: wait for the poll to end (or stop fm procevent serve), then retry", id)
	case !uncaptured:
		// Registered since the check above: the claim proves it now.
		c.release()
		d.close()
		return nil, nil, refuse(r)
	}
	pctx, endWatch, err := d.watchStop(ctx, id)
	if err == nil {
		err = settleSource(h, id)
		if err != nil {
			endWatch()
		}
	}
	if err != nil {
		c.release()
		d.close()
		return nil, nil, err
	}
	return pctx, func() { endWatch(); c.release(); d.close() }, nil
}

// pollExtension runs source.poll on b as c says (its request id, stderr and
// confinement); nil output with a nil error is no result.
func pollExtension(ctx context.Context, h *home.Home, b *binding.Binding, adapter string, in wire.PollInput, c host.Call) ([]byte, error) {
	c.Adapter, c.SourceID = adapter, in.SourceID
	p, err := host.Invoke(ctx, h, b, host.Poll, in, c)
	if err != nil {
		return nil, err
	}
	if p.Status == "result" {
		return []byte(p.Output), nil
	}
	return nil, nil
}

// evidenceFor is the captured form of a poll failure: the canonical evidence
// document of [OP-3] as one line.
func evidenceFor(err error, extensionID string) []byte {
	return append(protocol.EvidenceFor(err, extensionID), '\n')
}
