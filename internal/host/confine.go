package host

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/launch/barrier"
)

// Confinement is a home's confinement as fm applies it: the setting, whether
// the home's file sets it, and the kernel's Landlock ABI.
type Confinement struct {
	Mode confine.Mode
	Set  bool
	ABI  int
}

// HomeConfinement reads h's confinement setting and probes the kernel.
func HomeConfinement(h *home.Home) (Confinement, error) {
	m, set, err := confine.ReadMode(h.Config())
	if err != nil {
		return Confinement{}, err
	}
	return Confinement{Mode: m, Set: set, ABI: confine.Probe()}, nil
}

// Describe is the one-line account of c for a package with every consent
// withheld: what inspect, verify and doctor show.
func (c Confinement) Describe() string {
	f, p, err := confine.Build(c.Mode, c.ABI, confine.Grant{})
	if f != nil {
		f.Close()
	}
	if err != nil {
		return string(c.Mode) + ": every package is refused (confinement-unavailable): the kernel lacks " + strings.Join(p.Lacked, ", ")
	}
	if p.Mode == confine.Off {
		return p.String()
	}
	if !p.Confined() {
		return string(c.Mode) + ": packages run NOT confined: this kernel has no Landlock"
	}
	s := string(c.Mode) + ": Landlock ABI " + strconv.Itoa(c.ABI)
	if len(p.Lacked) > 0 {
		s += "; NOT enforced (kernel lacks): " + strings.Join(p.Lacked, ", ")
	}
	return s
}

// confinement builds the ruleset of rec's launches from its consents
// [CONF-1] under mode, or h's setting when mode is "" [CONF-2].
func confinement(h *home.Home, rec *binding.Record, env []string, mode confine.Mode) (*os.File, confine.Plan, error) {
	if mode == "" {
		m, _, err := confine.ReadMode(h.Config())
		if err != nil {
			return nil, confine.Plan{}, err
		}
		mode = m
	}
	g := confine.Grant{
		PackageRoot: rec.PackageRoot,
		State:       h.ExtensionState(rec.ExtensionID),
		Temp:        h.ExtensionTemp(rec.ExtensionID),
		Network:     rec.Consents.Network,
		Everywhere:  rec.Consents.ArtifactReferences,
	}
	if rec.Consents.CredentialStore {
		for _, e := range env {
			k, v, _ := strings.Cut(e, "=")
			if k != "SSH_AUTH_SOCK" && k != "PATH" && filepath.IsAbs(v) && slices.Contains(credentialVars, k) {
				g.Credentials = append(g.Credentials, v)
			}
		}
	}
	return confine.Build(mode, confine.Probe(), g)
}

// explain is explain (the package's exit status worded) with the launch's
// confinement [CONF-5]: a confined package that failed may have been
// refused something its binding did not grant, so the error line says what
// it was confined to and how to check. Exit status barrier.ConfineFailed of
// a confined launch is the barrier's refusal to run unrestricted (or the
// package's own exit with that status): confinement-unavailable.
func (v *verified) explain(rec *binding.Record, verb string, err error) error {
	err = explain(rec, verb, err)
	if !v.plan.Confined() {
		return err
	}
	code := errcode.Of(err)
	var st launch.ExitStatus
	if errors.As(err, &st) && int(st) == barrier.ConfineFailed && v.ruleset != nil {
		code = errcode.ConfinementUnavailable
		return &errcode.Error{Code: code, Msg: err.Error() + "; exit " + strconv.Itoa(barrier.ConfineFailed) +
			" of a confined launch is the launch barrier refusing to run the package when the kernel refused its Landlock ruleset (landlock_restrict_self), unless the package itself exits " + strconv.Itoa(barrier.ConfineFailed), Err: err}
	}
	return &errcode.Error{Code: code, Msg: err.Error() + "; the package ran " + v.plan.String() +
		" [CONF-5]: to check whether confinement is the cause, rerun this call with --confinement off; to grant more, see docs/configuration.md \"Confinement\"", Err: err}
}
