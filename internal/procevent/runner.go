package procevent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/wake"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// Status is what one runner pass did ([RUN-1]).
type Status string

// The statuses of a runner pass.
const (
	Captured     Status = "captured"
	NoResult     Status = "no-result"
	AlreadyOwned Status = "already owned"
	// Collapsed is a failure counted in the failing run whose evidence is
	// still unhandled, not captured [OP-5].
	Collapsed Status = "collapsed"
)

// Outcome is the result of one runner pass over one source.
type Outcome struct {
	SourceID string
	Status   Status
	Path     string // the captured result, when Status is Captured
	Sequence int64
	Evidence bool  // the capture is failure evidence [OP-3]
	Failure  error // with Evidence: the poll's failure, in the host's words
	Silent   bool  // the silent verdict marked it handled; it was not announced
	Retired  bool  // the terminal verdict retired the polled generation
	// Count is, for Collapsed, the failures of the run so far [OP-5].
	Count int64
	// Checks are the verdicts that failed and took the false path [OP-4].
	Checks []CheckFailure
}

// CheckFailure is a result.terminal or result.silent verdict that failed.
type CheckFailure struct {
	Operation string
	Err       error
}

// Start is the generic runner ([RUN-1]): one attached poll of source id, then
// capture, announcement, and the silent and terminal verdicts.
//
// The order is fixed, and each step happens only after the previous one is
// durable:
//
//  1. read the source's current generation (an unknown source is
//     source-missing and nothing is created) and, for an extension, check
//     the external boundary [CAP-6] on the pinned handles, all before any
//     lock file is touched; then claim the source [RUN-4] (or report
//     AlreadyOwned) and read the generation again under the claim, which no
//     registration or retirement can change while it is held;
//  2. resolve the groups that dead runners of this source left
//     (launch.Cleanup), and refuse while an owner record of a poll of this
//     source remains (a group not proved gone, even of a live host), because
//     two polls of one source must never run at once;
//  3. refuse with sequence-exhausted, before polling, a source whose
//     sequence cannot advance or a wake queue that cannot (nothing would be
//     captured that could not be announced);
//  4. poll: the built-in argv, or source.poll on exactly the registered
//     binding with the request id of [RID-1] (adapter, source, next
//     sequence, token, package digest), so a retry before a capture repeats
//     the id and the first poll after a capture gets the next one;
//  5. no result: nothing is written. A result, or for an extension any
//     failure as evidence, is captured [CAP-1], with a pending marker that
//     says its announcement is being decided (see announce.go);
//  6. for a result (never for evidence), the silent verdict: true marks it
//     handled and it is not announced; otherwise one check wake announces it
//     [CAP-2]; then the pending marker is removed;
//  7. for a result, the terminal verdict: true retires exactly the polled
//     generation [CAP-4].
//
// A poll cancelled by ctx or stopped by a retire captures nothing; the next
// poll reuses its request id.
func Start(ctx context.Context, h *home.Home, id string) (*Outcome, error) {
	return start(ctx, h, id, supervision{})
}

// supervision is how serve and reconcile run a pass, unlike an operator's
// start: collapse makes a repeated failure count in its run instead of being
// captured [OP-5], and next, when set, is asked the delay until the next
// poll once the pass knows whether it failed (the status file records it).
type supervision struct {
	collapse bool
	next     func(failed bool) time.Duration
}

// start is Start under supervision sv.
func start(ctx context.Context, h *home.Home, id string, sv supervision) (*Outcome, error) {
	if err := protocol.CheckSourceID(id); err != nil {
		return nil, err
	}
	d, err := openDirs(h, false, false)
	if err == errAbsent {
		return nil, missing(id)
	}
	if err != nil {
		return nil, err
	}
	defer d.close()
	return d.run(ctx, id, sv)
}

// missing is the error for a source that is not registered.
func missing(id string) error {
	return errcode.New(errcode.SourceMissing, "no source %q is registered; see fm procevent list", id)
}

// claimSource reads id's registration, checks the boundary it asks for, and
// only then takes the claim (nil: a live runner holds it) and reads the
// registration again under it. Nothing is created for a source that is not
// registered: a claim file made by losing a race with a retire is removed
// again.
func (d *dirs) claimSource(id string) (*claim, *Registration, error) {
	if d.reg == nil {
		return nil, nil, missing(id)
	}
	r, err := readRegistration(d.reg, id)
	if err != nil {
		return nil, nil, err
	}
	if r.External() {
		if err := d.tighten(); err != nil {
			return nil, nil, err
		}
	}
	c, err := d.claim(id)
	if c == nil || err != nil {
		return nil, nil, err
	}
	if r, err = readRegistration(d.reg, id); err != nil {
		if errcode.Is(err, errcode.SourceMissing) {
			d.removeLocks(id)
		}
		c.release()
		return nil, nil, err
	}
	if r.External() {
		if err := d.tighten(); err != nil {
			c.release()
			return nil, nil, err
		}
	}
	return c, r, nil
}

func (d *dirs) run(ctx context.Context, id string, sv supervision) (*Outcome, error) {
	c, r, err := d.claimSource(id)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return &Outcome{SourceID: id, Status: AlreadyOwned}, nil
	}
	defer c.release()
	hp := d.loadHealth(id)
	hp.collapsing = sv.collapse
	out, err := d.pass(ctx, r, hp)
	if ctx.Err() != nil || errors.Is(err, errStopped) {
		// Interrupted or stopped: nothing happened to record.
		hp.discard()
		return out, err
	}
	hp.now = time.Now()
	if err2 := hp.record(ctx, d, r, out, err); err == nil {
		err = err2
	}
	failed := err != nil || out.Evidence || out.Status == Collapsed
	var wait time.Duration
	if sv.next != nil {
		wait = sv.next(failed)
	}
	if failed && hp.stderr != nil && hp.dir != nil {
		if err2 := hp.stderr.save(hp.dir, id); err == nil && err2 != nil {
			err = err2
		}
	}
	if err2 := hp.save(wait); err == nil && err2 != nil {
		err = errcode.Wrap(errcode.Of(err2), err2, "the poll of %q is done (see its line) but its status file could not be written", id)
	}
	return out, err
}

// pass is one runner pass over r under its claim: steps 2 to 7 of Start,
// with the collapse of [OP-5] before an evidence capture.
func (d *dirs) pass(ctx context.Context, r *Registration, hp *healthPass) (*Outcome, error) {
	id := r.SourceID
	// Watch for a retire's stop request from the moment of the claim: a
	// retire may be waiting for exactly this claim.
	pctx, endWatch, err := d.watchStop(ctx, id)
	if err != nil {
		return nil, err
	}
	defer endWatch()
	if context.Cause(pctx) == errStopped {
		return nil, stopped(id)
	}
	if err := d.openInbox(true); err != nil {
		return nil, err
	}
	if err := settleSource(d.h, id); err != nil {
		return nil, err
	}
	// Pending markers found under the claim were left by runners that died
	// deciding an announcement: the results fall under the re-announce rule.
	names, err := d.sourceNames(id)
	if err != nil {
		return nil, err
	}
	if err := d.clearPending(id, names); err != nil {
		return nil, err
	}
	seq, err := d.nextSeq(id, names)
	if err != nil {
		return nil, err
	}
	// A result the wake queue could not announce would be captured for
	// nothing, again at every pass: refuse before polling instead.
	if err := wake.Exhausted(d.state); err != nil {
		return nil, err
	}

	if r.External() && debugging(hp.dir, id) {
		hp.stderr = &stderrLog{}
	}
	p, err := d.poll(pctx, r, seq, hp.stderr)
	if err != nil {
		return nil, err
	}
	out := &Outcome{SourceID: id, Status: NoResult}
	if p.content == nil {
		return out, nil
	}
	evidence := p.failure != nil
	if evidence {
		if ev, ok := hp.collapse(d, r, p.failure); ok {
			out.Status, out.Sequence, out.Failure, out.Count = Collapsed, ev, p.failure, hp.s.Run.Count
			return out, nil
		}
	}
	m, path, err := d.capture(r, seq, p.content, evidence)
	if err != nil {
		return nil, err
	}
	out.Status, out.Path, out.Sequence, out.Evidence, out.Failure = Captured, path, seq, evidence, p.failure
	var v *verdicts
	if !evidence {
		v = &verdicts{h: d.h, meta: m, owner: p.owner, content: p.content}
		if out.verdict(pctx, v, host.Silent) {
			if _, err := d.markHandled(id, seq, HandledBySilent); err != nil {
				return out, err
			}
			out.Silent = true
		}
	}
	if !out.Silent {
		if err := announce(ctx, d.state, m); err != nil {
			return out, errcode.Wrap(errcode.Of(err), err, "captured %s (durable, listed by fm procevent inbox) but could not announce it; once the cause below is fixed, fm procevent reconcile announces it", path)
		}
	}
	// Announced or silenced, durably: the announcement is decided.
	// A marker is only looked at, never read: its file may be kept for
	// reuse (fsutil: "Spare files").
	if err := fsutil.RemoveKeepingAt(d.inbox, name(id, seq, pendingSuffix)); err != nil {
		return out, err
	}
	if v != nil && out.verdict(pctx, v, host.Terminal) {
		if err := d.retireGeneration(r); err != nil {
			return out, err
		}
		out.Retired = true
	}
	return out, nil
}

// verdict asks v's owner op; a failure is the false path [OP-4], and it is
// kept in o.Checks for the history and the runner's lines [STAT-3].
func (o *Outcome) verdict(ctx context.Context, v *verdicts, op host.Op[wire.ResultInput, wire.BoolResult]) bool {
	yes, err := v.is(ctx, op)
	if err != nil {
		o.Checks = append(o.Checks, CheckFailure{Operation: op.Name(), Err: err})
	}
	return yes
}

// polled is what one poll gave: the bytes to capture (nil for no result),
// the failure they are evidence of (nil for a result), and the extension
// binding that answered a result.
type polled struct {
	content []byte
	failure error
	owner   *binding.Binding
}

// poll runs one poll of r, handing an extension's stderr and ok=false
// diagnostic to dbg when it is set (the source's debug log). A built-in failure, any interrupted poll and a host fault
// (host-resource) are errors: nothing is captured for them.
func (d *dirs) poll(ctx context.Context, r *Registration, seq int64, dbg *stderrLog) (*polled, error) {
	var (
		out []byte
		b   *binding.Binding
		err error
	)
	if r.External() {
		b, err = registeredBinding(d.h, r)
		if err == nil {
			in := wire.PollInput{SourceID: r.SourceID, ConfigRef: r.ConfigRef}
			out, err = pollExtension(ctx, d.h, b, r.Adapter, in, dbg.call(protocol.PollRequestID(r.Adapter, r.SourceID, seq, r.Token, r.PackageDigest)))
		}
	} else {
		out, err = pollBuiltin(ctx, d.h, r)
	}
	switch {
	case err == nil:
		return &polled{content: out, owner: b}, nil
	case errors.Is(context.Cause(ctx), errStopped):
		return nil, stopped(r.SourceID)
	case ctx.Err() != nil:
		return nil, errcode.New(errcode.ProcessFailed, "the poll of %q was interrupted; nothing was captured (the next poll repeats its request id)", r.SourceID)
	case errcode.Is(err, errcode.HostResource):
		// The host ran out of a resource: not the package's failure, so no
		// evidence; the next poll repeats the request id [OP-3].
		return nil, err
	case r.External():
		return &polled{content: evidenceFor(err, r.ExtensionID), failure: err}, nil
	}
	return nil, err
}

// stopped is the error of a pass that a retire's stop request ended.
func stopped(id string) error {
	return &errcode.Error{Code: errcode.SourceActive, Msg: fmt.Sprintf("the poll of %q was stopped by a retire; nothing was captured", id), Err: errStopped}
}

// registeredBinding resolves the binding of r's adapter and requires it to
// be exactly the registered one: a retired, replaced or re-bound binding is
// a failure (captured as evidence), never a silent switch to other code.
func registeredBinding(h *home.Home, r *Registration) (*binding.Binding, error) {
	b, err := host.Resolve(h, r.Adapter)
	if err != nil {
		return nil, err
	}
	if b.Digest != r.BindingDigest || b.PackageDigest != r.PackageDigest || b.ExtensionID != r.ExtensionID {
		return nil, errcode.New(errcode.IntegrityMismatch, "adapter %q is now bound by %s (binding %s), not by the %s@%s binding %s that source %q was registered with; register the source again", r.Adapter, b.ExtensionID, b.Digest, r.ExtensionID, r.ExtensionVersion, r.BindingDigest, r.SourceID)
	}
	return b, nil
}

// retireGeneration removes r's registration if it is still exactly that
// generation, and then the source's lock files. The caller holds the claim.
func (d *dirs) retireGeneration(r *Registration) error {
	cur, err := readRegistration(d.reg, r.SourceID)
	if errcode.Is(err, errcode.SourceMissing) {
		return nil
	}
	if err != nil {
		return err
	}
	if cur.Token != r.Token {
		return nil
	}
	if err := fsutil.RemoveAt(d.reg, r.SourceID+sourceSuffix); err != nil {
		return err
	}
	d.removeLocks(r.SourceID)
	return nil
}

// cleanupSource resolves the owner records that dead hosts left for
// invocations of source id (live invocations are not touched);
// process-cleanup-failed while any stays unproven. It returns the records
// of the source that are left, for the caller to refuse on: from the
// cleanup's own listing (launch.CleanupSource) when none is left (the
// caller holds the source's claim, so no invocation of it starts
// meanwhile), else from a fresh one, so that a record that ended since the
// cleanup's listing (a live invocation's) refuses nothing.
func cleanupSource(h *home.Home, id string) ([]launch.Record, error) {
	_, left, err := launch.CleanupSource(h.Invocations(), id, func(r launch.Record) bool { return !r.HostLive })
	if err == nil && len(left) > 0 {
		left, err = launch.ListSource(h.Invocations(), id)
	}
	return left, err
}

// settleSource is cleanupSource, then noPollOf what it left: what must hold
// before a poll, a generation or a registration of source id starts.
func settleSource(h *home.Home, id string) error {
	left, err := cleanupSource(h, id)
	if err != nil {
		return err
	}
	return noPollOf(id, left)
}

// noPollOf refuses (process-cleanup-failed) while an owner record of a poll
// of source id is among recs, the records left after cleanupSource: a group
// that was not proved gone, whose host may even be alive (a serve whose
// poll's group outlived TERM and KILL keeps its record until it exits). No
// new poll or generation of the source may start beside it.
func noPollOf(id string, recs []launch.Record) error {
	for _, r := range recs {
		if r.Operation == wire.OpPoll {
			return errcode.New(errcode.ProcessCleanupFailed, "source %q: the process group of an earlier poll was not proved gone (owner record %s, host pid %d); nothing was started: retry, or run fm extension cleanup-invocations once that host has exited", id, r.Path, r.Host.PID)
		}
	}
	return nil
}

// cleanupDead resolves every owner record whose host is dead. An absent
// records directory has nothing to clean and is not created.
func cleanupDead(h *home.Home) (int, error) {
	return launch.Cleanup(h.Invocations(), func(r launch.Record) bool { return !r.HostLive })
}
