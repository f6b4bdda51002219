// Package doctor holds the checks of `fm doctor`: it reads a home without
// changing it and without running any package code, and returns one
// Finding per thing it checked:
//
//	ok    a check passed
//	warn  legal, but probably not what you want (serve not running while
//	      sources are registered, unhandled results, a writable home)
//	FAIL  something fm will refuse or cannot do, with the fix
//
// A failure carries its error code, and a fix: the next step, or where the
// code's row of docs/troubleshooting.md is. The CLI (internal/cli) prints
// the findings and chooses the exit status; nothing here prints.
//
// A new check is a method of checker, called from Check, that reads through
// the packages that own what it checks and records its findings with ok,
// warn, fail or fails; its unit test makes the condition in a real home
// (testpkg.Home) and reads the findings back.
package doctor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/homeimport"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/remote"
	"firstmate.dev/fm/internal/shown"
	"firstmate.dev/fm/internal/transfer"
	"firstmate.dev/fm/internal/wake"
)

// Status is how a check came out.
type Status string

// Finding statuses, as the report prints them.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "FAIL"
)

// Finding is one line of the report: the check that made it, its status,
// for a failure the error code, what was found, and the fix ("" for most
// passes). A failure's Message is its error's text as the error spells it.
type Finding struct {
	Check   string       `json:"check"`
	Status  Status       `json:"status"`
	Code    errcode.Code `json:"code"`
	Message string       `json:"message"`
	Fix     string       `json:"fix"`
}

// Count returns how many of the findings failed and how many warn.
func Count(findings []Finding) (problems, warnings int) {
	for _, f := range findings {
		switch f.Status {
		case Fail:
			problems++
		case Warn:
			warnings++
		}
	}
	return problems, warnings
}

// Unresolved is the one finding for a home that did not resolve
// (home.Resolve's error): nothing else can be checked.
func Unresolved(err error) []Finding {
	c := &checker{}
	fix := "" // the state root: its message says what to change
	if errcode.Is(err, errcode.HomeInvalid) {
		fix = "point FM_HOME at an existing directory you own (FM_STATE_OVERRIDE, if set, at an absolute private directory)"
	}
	c.fail("home", err, fix)
	return c.findings
}

// Check makes every check of h, in the report's order.
func Check(h *home.Home) []Finding {
	d := &checker{h: h}
	d.checkHome()
	d.checkImport()
	d.checkState()
	d.checkConfinement()
	bs, err := binding.Load(h)
	if err != nil {
		d.fail("registry", err, "")
	} else {
		d.ok("registry", "%d binding(s) in %s", len(bs), h.Bindings())
		for _, b := range bs {
			d.checkBinding(b)
		}
	}
	d.checkTransfers(bs, err == nil)
	d.checkInvocations()
	d.checkTemps()
	d.checkUpgrades()
	d.checkSources(bs, err == nil)
	d.checkFailing()
	d.checkWakes()
	d.checkRoutes()
	return d.findings
}

// checker collects the findings of one run.
type checker struct {
	h        *home.Home
	findings []Finding
}

func (d *checker) ok(check, format string, args ...any) {
	d.findings = append(d.findings, Finding{Check: check, Status: OK, Message: fmt.Sprintf(format, args...)})
}

func (d *checker) warn(check, fix, format string, args ...any) {
	d.findings = append(d.findings, Finding{Check: check, Status: Warn, Message: fmt.Sprintf(format, args...), Fix: fix})
}

// fail records err; fix is the next step, or "" to point at the error
// code's row of the troubleshooting table.
func (d *checker) fail(check string, err error, fix string) {
	code := errcode.Of(err)
	if fix == "" {
		fix = fmt.Sprintf("see %q in docs/troubleshooting.md", code)
	}
	d.findings = append(d.findings, Finding{Check: check, Status: Fail, Code: code, Message: err.Error(), Fix: fix})
}

// checkTemps reports, only when there are any, the temps killed writers
// left (fsutil.SweepTemps): in the lifecycle-locked directories every temp
// (only a running bind has one, and it is gone when the bind ends), in the
// state directories those whose writer has provably exited.
func (d *checker) checkTemps() {
	var found []string
	for _, set := range []struct {
		dirs   []string
		locked bool
	}{{host.TempDirs(d.h), true}, {procevent.StateTempDirs(d.h), false}} {
		for _, dir := range set.dirs {
			temps, err := fsutil.DeadTemps(dir, set.locked)
			if err != nil {
				d.fail("temps", err, "")
				return
			}
			found = append(found, temps...)
		}
	}
	if len(found) > 0 {
		d.warn("temps", "the next bind, retire-binding or receive-transfer-bind removes those under config/ and data/, fm procevent reconcile (or a running serve, or sweep-home) those under state/",
			"%d temp file(s) or directories left by killed writers, first %s", len(found), found[0])
	}
}

func (d *checker) checkHome() {
	fi, err := os.Stat(d.h.Dir)
	if err == nil && fi.Mode().Perm()&0o022 != 0 {
		d.warn("home", "chmod go-w "+d.h.Dir, "home %s is group- or world-writable (mode %04o): another user can rename what it holds", d.h.Dir, fi.Mode().Perm())
		return
	}
	d.ok("home", "%s (code root %s)", d.h.Dir, d.h.Root)
}

// checkConfinement reports the home's confinement and what this kernel can
// enforce of it [CONF-2] [CONF-3]: off, or enforce on a kernel that lacks
// something, is a warning (packages run with more than their bindings
// granted); strict on such a kernel fails, since every package is refused.
func (d *checker) checkConfinement() {
	c, err := host.HomeConfinement(d.h)
	if err != nil {
		d.fail("confinement", err, "rewrite it: fm home confinement enforce")
		return
	}
	lacked, err := confine.Check(c.Mode, c.ABI, confine.Grant{})
	switch {
	case err != nil:
		d.fail("confinement", err, "a kernel with Landlock (ABI 6 or later), or fm home confinement enforce")
	case c.Mode == confine.Off:
		d.warn("confinement", "fm home confinement enforce (docs/configuration.md, \"Confinement\")", "%s: every package runs with your full rights", c.Describe())
	case len(lacked) > 0:
		d.warn("confinement", "a kernel with Landlock (ABI 6 or later: CONFIG_SECURITY_LANDLOCK and landlock in lsm=)", "%s", c.Describe())
	default:
		d.ok("confinement", "%s", c.Describe())
	}
}

// checkImport reports what the earlier Firstmate implementation left in the
// home ([HOME-4]): fm refuses it with home-import-needed until fm home import
// converts it. A home of fm's adds no line.
func (d *checker) checkImport() {
	pending, err := homeimport.Pending(d.h)
	if err != nil {
		d.fail("import", err, "")
		return
	}
	if len(pending) > 0 {
		d.fails("import", errcode.HomeImportNeeded, "stop the earlier implementation, then run fm home import (docs/configuration.md, \"Moving a home onto fm\")",
			"this home holds what the earlier Firstmate implementation wrote: %s", strings.Join(pending, ", "))
	}
}

// checkState checks the state root and every directory fm keeps in it: each
// must be private and exactly 0700, the rule extension polls enforce
// ([CAP-6]).
func (d *checker) checkState() {
	if _, err := os.Lstat(d.h.State); errors.Is(err, os.ErrNotExist) {
		d.ok("state", "%s does not exist yet (it is created on first use)", d.h.State)
		return
	}
	ext := filepath.Join(d.h.State, "extensions") // the parent of every ExtensionState
	dirs := []string{d.h.State, d.h.Registrations(), d.h.Inbox(), d.h.Invocations(), ext}
	if names, err := os.ReadDir(ext); err == nil {
		for _, n := range names {
			dirs = append(dirs, filepath.Join(ext, n.Name()))
		}
	}
	bad := 0
	for _, p := range dirs {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := home.CheckPrivate(p, true); err != nil {
			d.fail("state", err, privateFix(err, p))
			bad++
		}
	}
	if bad == 0 {
		d.ok("state", "%s and its directories are private (0700)", d.h.State)
	}
}

// privateFix is the next step for a directory that failed CheckPrivate.
func privateFix(err error, p string) string {
	switch errcode.Of(err) {
	case errcode.ModeUnsafe:
		return "chmod 700 " + p
	case errcode.OwnerMismatch:
		return "chown $(id -un) " + p + " (or run fm as its owner)"
	}
	return "make " + p + " a real directory (not a symlink), mode 0700, owned by you"
}

// checkBinding revalidates one binding's installed package ([INV-1]) without
// running it.
func (d *checker) checkBinding(b *binding.Binding) {
	if err := host.Revalidate(&b.Record); err != nil {
		err = errcode.Wrap(errcode.Of(err), err, "%s@%s", b.ExtensionID, b.ExtensionVersion)
		fix := "the store copy changed after bind, so nothing will run it: restore it, or move the binding aside, remove the copy and bind again (docs/configuration.md §3, \"A damaged store copy\")"
		if errcode.Is(err, errcode.PackageMissing) {
			fix = fmt.Sprintf("move the binding aside and bind again from %s (docs/configuration.md §3, \"A damaged store copy\")", shown.Path(b.Source.Path))
		}
		d.fail("binding", err, fix)
		return
	}
	d.ok("binding", "%s@%s: installed package %s verifies", b.ExtensionID, b.ExtensionVersion, b.PackageDigest)
}

// checkTransfers reports, only when there are any, the transfer units an
// interrupted receive-transfer-bind or retire-transfer left half-way
// (transfer.Partials), each with the command that finishes it.
func (d *checker) checkTransfers(bs []*binding.Binding, registryOK bool) {
	partials, err := transfer.Partials(d.h, bs, registryOK)
	if err != nil {
		d.fail("transfer", err, "")
	}
	for _, p := range partials {
		if p.Failing {
			d.fails("transfer", errcode.RetirementPartial, p.Fix, "%s", p.What)
		} else {
			d.warn("transfer", p.Fix, "%s", p.What)
		}
	}
}

// checkInvocations finds owner records whose host died ([GRP-3]).
func (d *checker) checkInvocations() {
	recs, err := launch.List(d.h.Invocations())
	if err != nil {
		d.fail("invocations", err, "")
		return
	}
	var stale []string
	for _, r := range recs {
		if !r.HostLive {
			stale = append(stale, filepath.Base(r.Path))
		}
	}
	if len(stale) > 0 {
		d.fails("invocations", errcode.ProcessCleanupFailed, "run fm extension cleanup-invocations (fm procevent serve also does it every 30 s)",
			"%d invocation record(s) in %s belong to an fm that died, and pin their binding and source until their process group is proved gone: %s",
			len(stale), d.h.Invocations(), strings.Join(stale, ", "))
		return
	}
	d.ok("invocations", "%d live, none stale", len(recs))
}

// fails records a failure that no error value carries.
func (d *checker) fails(check string, code errcode.Code, fix, format string, args ...any) {
	d.fail(check, errcode.New(code, format, args...), fix)
}

// checkSources reports registrations, claims, serve and results. With
// registryOK, an extension registration whose binding is no longer enabled
// is a failure: its every poll fails.
func (d *checker) checkSources(bs []*binding.Binding, registryOK bool) {
	st, err := procevent.ReadStatus(d.h)
	if err != nil {
		d.fail("sources", err, "")
		return
	}
	polling := 0
	for _, s := range st.Sources {
		if s.Polling {
			polling++
		}
		if registryOK && s.Kind == procevent.KindExtension && !slices.ContainsFunc(bs, func(b *binding.Binding) bool { return b.Digest == s.BindingDigest }) {
			d.fails("source", errcode.BindingMissing,
				fmt.Sprintf("restore that binding, or retire the source: fm procevent retire %s --if-owner <its owner token>", s.SourceID),
				"source %q (%s from %s) is registered with binding %s, which is no longer enabled; every poll of it fails", s.SourceID, s.Adapter, s.Owner, s.BindingDigest)
		}
	}
	d.ok("sources", "%d registered, %d polling now", len(st.Sources), polling)
	// An error here is the registry's or the inbox's, which ReadStatus has
	// just read: each counter that cannot advance is one finding.
	if problems, err := procevent.Sequences(d.h); err == nil {
		for _, p := range problems {
			d.fail("source", p, "retire the source and register it under a new source id (its results stay in the inbox)")
		}
	}
	switch {
	case st.Serving:
		d.ok("serve", "fm procevent serve is running for this home")
	case len(st.Sources) > 0:
		d.warn("serve", "run fm procevent serve, under systemd for instance (docs/configuration.md §5)",
			"fm procevent serve is not running: nothing polls the %d registered source(s) unless you run fm procevent start", len(st.Sources))
	default:
		d.ok("serve", "not running (no sources registered)")
	}
	if st.Unhandled > 0 {
		d.warn("results", "read them with fm procevent inbox, then mark each one fm procevent handled <source-id> <seq>",
			"%d of %d captured result(s) are unhandled", st.Unhandled, st.Results)
		return
	}
	d.ok("results", "%d captured, none unhandled", st.Results)
}

// checkFailing fails a home with a source that fails persistently
// (procevent.PersistentFailures consecutive failed polls) or whose status
// file fm cannot trust [STAT-4], each by name, with why and the command
// that shows it.
func (d *checker) checkFailing() {
	_, reps, err := procevent.Statuses(d.h)
	if err != nil {
		d.fail("failing", err, "")
		return
	}
	bad := 0
	for _, r := range reps {
		look := "fm procevent status " + r.SourceID
		switch {
		case r.HealthErr != nil:
			d.fail("failing", r.HealthErr, fmt.Sprintf("remove that file (fm writes a new one at the next poll), then %s", look))
		case r.Persistent():
			hs := r.Health
			why := hs.Code
			if hs.Detail != "" {
				why += ": " + hs.Detail
			}
			d.fails("failing", hs.LastCode(), "run "+look+" for its history; fix the cause, then it recovers at its next poll",
				"source %q has failed its last %d polls since %s (%s)", r.SourceID, hs.Failures, hs.FailedAt, why)
		default:
			continue
		}
		bad++
	}
	if bad == 0 {
		d.ok("failing", "no source fails persistently (%d or more failed polls in a row)", procevent.PersistentFailures)
	}
}

// checkWakes reads the whole queue in bounded memory: a queue or
// high-water mark that stops every append fails, bad lines (skipped by every
// reader) warn.
func (d *checker) checkWakes() {
	st, err := wake.ReadStats(d.h.State)
	if err != nil {
		d.fail("wakes", err, "")
		return
	}
	if st.Bad > 0 {
		d.warn("wakes", "fm wake compact drops them",
			"%d line(s) of %s are not wakes (a torn append, or an edit) and every reader skips them; %d wake(s) queued", st.Bad, d.h.WakeQueue(), st.Wakes)
		return
	}
	d.ok("wakes", "%d queued in %s", st.Wakes, d.h.WakeQueue())
}

func (d *checker) checkRoutes() {
	routes, err := remote.Routes(d.h)
	switch {
	case errors.Is(err, os.ErrNotExist):
		d.ok("routes", "no secondmate routes (%s does not exist)", d.h.Secondmates())
	case err != nil:
		d.fail("routes", err, "")
	default:
		d.ok("routes", "%d secondmate route(s) in %s", len(routes), d.h.Secondmates())
	}
}
