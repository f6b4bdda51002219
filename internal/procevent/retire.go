package procevent

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/protocol"
)

// Condition selects a retire form ([REG-4]). At most one field is set; the
// zero Condition is the bare form.
type Condition struct {
	// IfOwner retires only the generation with this token. With nothing
	// registered under the id the retire is a no-op that succeeds (it is
	// idempotent); while another generation is registered it is refused
	// (owner-token-mismatch) and touches nothing, so an old token never
	// reports "retired" for a source that keeps running.
	IfOwner string
	// IfMatches retires a built-in registration only if it is exactly this
	// adapter and argv. Nothing registered is a no-op that succeeds.
	IfMatches *Match
	// IfAbsent succeeds only if nothing is registered (source-active
	// otherwise); it retires nothing.
	IfAbsent bool
}

// Match is the complete content of a built-in registration.
type Match struct {
	Adapter string
	Argv    []string
}

// decide reports whether r (nil when nothing is registered) is to be removed,
// or why the retire is refused.
func (c Condition) decide(id string, r *Registration) (bool, error) {
	switch {
	case c.IfAbsent:
		if r != nil {
			return false, errcode.New(errcode.SourceActive, "source %q is registered (%s from %s); --if-absent retires nothing", id, r.Adapter, r.Owner())
		}
		return false, nil
	case c.IfOwner != "":
		if r != nil && r.Token != c.IfOwner {
			return false, errcode.New(errcode.OwnerTokenMismatch, "source %q is registered as another generation (%s from %s) than the one of that owner token; nothing was retired: use the token printed by its register-extension", id, r.Adapter, r.Owner())
		}
		return r != nil, nil
	case c.IfMatches != nil:
		if r == nil {
			return false, nil
		}
		if r.External() || r.Adapter != c.IfMatches.Adapter || !slices.Equal(r.Argv, c.IfMatches.Argv) {
			return false, errcode.New(errcode.OwnerTokenMismatch, "source %q is registered as %s from %s with another argv; it does not match, nothing was retired", id, r.Adapter, r.Owner())
		}
		return true, nil
	}
	switch {
	case r == nil:
		return false, errcode.New(errcode.SourceMissing, "no source %q is registered; see fm procevent list", id)
	case r.External():
		return false, errcode.New(errcode.OwnerTokenMismatch, "source %q is an extension registration; retire it with --if-owner <its owner token>", id)
	}
	return true, nil
}

// Retire retires the registration of source id under condition c ([REG-4]).
// A running poll of the source is stopped first (its exact process group,
// through the runner; see claim.go), the groups dead runners left for it are
// resolved, and only then is the record removed, with the source's lock files
// and stale pending markers. It refuses while the poll does not stop or while
// any owner record of an invocation for the source remains: a group not
// proved gone, even one whose host is alive (a serve whose poll's group
// outlived TERM and KILL keeps its record). Its waits for the claim end when
// ctx does (process-failed, nothing retired).
func Retire(ctx context.Context, h *home.Home, id string, c Condition) error {
	if err := protocol.CheckSourceID(id); err != nil {
		return err
	}
	if c.IfOwner != "" && !binding.CheckDigest(c.IfOwner) {
		return errcode.New(errcode.Usage, "--if-owner %q must be sha256:<64 lowercase hex>", c.IfOwner)
	}
	d, err := openDirs(h, false, false)
	if err == nil && d.reg == nil {
		d.close()
		err = errAbsent
	}
	if err == errAbsent {
		_, err = c.decide(id, nil)
		return err
	}
	if err != nil {
		return err
	}
	defer d.close()
	return d.retire(ctx, id, c.decide)
}

// retire removes the registration of id when decide says so, deciding once
// without the claim (so a refused retire never stops a poll) and again while
// holding it.
func (d *dirs) retire(ctx context.Context, id string, decide func(string, *Registration) (bool, error)) error {
	if d.reg == nil {
		_, err := decide(id, nil)
		return err
	}
	current := func() (*Registration, error) {
		r, err := readRegistration(d.reg, id)
		if errcode.Is(err, errcode.SourceMissing) {
			return nil, nil
		}
		return r, err
	}
	r, err := current()
	if err != nil {
		return err
	}
	if ok, err := decide(id, r); !ok || err != nil {
		return err
	}
	release, err := d.awaitClaim(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	if r, err = current(); err != nil {
		return err
	}
	if ok, err := decide(id, r); !ok || err != nil {
		if r == nil {
			d.removeLocks(id) // retired meanwhile: leave no lock file behind
		}
		return err
	}
	recs, err := cleanupSource(d.h, id)
	if err != nil {
		return err
	}
	if len(recs) > 0 {
		return errcode.New(errcode.ProcessCleanupFailed, "source %q: %d invocation record(s) of the source remain (%s, host pid %d): a process group not proved gone, or a call still running; nothing was retired: retry, or run fm extension cleanup-invocations once that host has exited", id, len(recs), recs[0].Path, recs[0].Host.PID)
	}
	if err := fsutil.RemoveAt(d.reg, id+sourceSuffix); err != nil {
		return err
	}
	d.removeLocks(id)
	if err := d.openInbox(false); err == nil {
		names, err := d.inboxNames()
		if err != nil {
			return err
		}
		return d.clearPending(id, names)
	} else if err != errAbsent {
		return err
	}
	return nil
}

// Sweep retires every registration of the home with its stored identity and
// then proves every invocation group of the home gone ([LIFE-3]). It returns
// how many registrations it attempted. With preflight it only checks that
// the registry and the invocation records are readable and valid, changes
// nothing, and returns how many it would attempt.
func Sweep(ctx context.Context, h *home.Home, preflight bool) (int, error) {
	regs, err := Sources(h)
	if err != nil {
		return 0, err
	}
	if preflight {
		_, err := launch.List(h.Invocations())
		return len(regs), err
	}
	var failed []string
	if len(regs) > 0 {
		d, err := openDirs(h, false, false)
		if err != nil {
			return 0, err
		}
		defer d.close()
		for _, r := range regs {
			same := func(_ string, cur *Registration) (bool, error) { return cur != nil && cur.Token == r.Token, nil }
			if err := d.retire(ctx, r.SourceID, same); err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", r.SourceID, err))
			}
		}
	}
	if _, err := sweepTemps(h); err != nil {
		failed = append(failed, err.Error())
	}
	if _, err := cleanupDead(h); err != nil {
		failed = append(failed, err.Error())
	} else if live, err := launch.List(h.Invocations()); err != nil || len(live) > 0 {
		failed = append(failed, fmt.Sprintf("%d live invocation(s) remain in %q", len(live), h.Invocations()))
	}
	if len(failed) > 0 {
		return len(regs), errcode.New(errcode.RetirementPartial, "sweep of %d registration(s) is incomplete, retry: %s", len(regs), failed[0])
	}
	return len(regs), nil
}

// Preflight is the process-event dependency check of every retirement of a
// binding ([LIFE-2]; retire.Enabled calls it): it refuses (binding-in-use)
// while a registration or an unhandled captured result depends on b, and
// names every one of them, with the command that ends each kind of
// dependence: fm extension upgrade moves the registrations to a new binding
// in one step ([UPG-1]), and fm procevent handled <source-id> --all handles
// every unhandled result of a source ([UPG-3]).
func Preflight(h *home.Home, b *binding.Binding) error {
	regs, results, err := Dependents(h, b)
	if err != nil {
		return err
	}
	if len(regs) > 0 {
		ids := make([]string, len(regs))
		for i, r := range regs {
			ids[i] = r.SourceID
		}
		return errcode.New(errcode.BindingInUse, "binding %s of %s is in use by %d registered source(s): %s; move them to a new binding with fm extension upgrade %s <package-dir>, or retire each first (fm procevent retire <source-id> --if-owner <its owner token>; fm procevent token <source-id> prints it)", b.Digest, b.ExtensionID, len(regs), strings.Join(ids, ", "), b.ExtensionID)
	}
	if len(results) > 0 {
		return UnhandledError(b, results)
	}
	return nil
}

// UnhandledError is the refusal (binding-in-use) of a change of binding b
// while results only b may classify are unhandled: it lists every one of
// them, and the commands that handle them one by one or per source.
func UnhandledError(b *binding.Binding, results []Result) error {
	items := make([]string, len(results))
	sources := []string{}
	for i, r := range results {
		items[i] = fmt.Sprintf("%s %d (%s)", r.SourceID, r.Sequence, r.Path)
		if !slices.Contains(sources, r.SourceID) {
			sources = append(sources, r.SourceID)
		}
	}
	return errcode.New(errcode.BindingInUse, "binding %s of %s is the only owner of %d unhandled captured result(s): %s; nothing was changed: read and handle each (fm procevent handled <source-id> <seq>), or all of a source at once (fm procevent handled <source-id> --all, for: %s), then retry", b.Digest, b.ExtensionID, len(results), strings.Join(items, ", "), strings.Join(sources, ", "))
}

// Dependents lists what depends on b, in source-id order: the extension
// registrations made with it, and the unhandled captured results it owns.
//
// Dependence is by binding digest, the exact identity: an extension
// registration depends on the binding it was registered with (its
// binding_digest), and an unhandled extension result on the binding recorded
// in its meta, because that binding is the only owner allowed to classify it
// and give its verdicts. A registration or result of another binding of the
// same extension id does not pin this one (it can no longer run against it
// anyway). A registry or inbox that cannot be read is an error: no
// dependency can then be ruled out.
func Dependents(h *home.Home, b *binding.Binding) (regs []*Registration, unhandled []Result, err error) {
	all, err := Sources(h)
	if err != nil {
		return nil, nil, err
	}
	for _, r := range all {
		if r.External() && r.BindingDigest == b.Digest {
			regs = append(regs, r)
		}
	}
	results, err := Inbox(h)
	if err != nil {
		return nil, nil, err
	}
	for _, res := range results {
		if !res.Handled && res.dependsOn(b) {
			unhandled = append(unhandled, res)
		}
	}
	return regs, unhandled, nil
}
