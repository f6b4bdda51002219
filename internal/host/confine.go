package host

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/launch/barrier"
	"firstmate.dev/fm/internal/protocol"
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
	lacked, err := confine.Check(c.Mode, c.ABI, confine.Grant{})
	switch {
	case err != nil:
		return string(c.Mode) + ": every package is refused (confinement-unavailable): the kernel lacks " + strings.Join(lacked, ", ")
	case c.Mode == confine.Off:
		return "off (this home's setting): packages run with the user's full rights"
	case c.ABI < 1:
		return string(c.Mode) + ": packages run NOT confined: this kernel has no Landlock"
	}
	s := string(c.Mode) + ": Landlock ABI " + strconv.Itoa(c.ABI)
	if len(lacked) > 0 {
		s += "; NOT enforced (kernel lacks): " + strings.Join(lacked, ", ")
	}
	return s
}

// confinement builds the ruleset of rec's launches from its consents
// [CONF-1] under mode, or h's setting when mode is "" [CONF-2]; env is the
// launches' environment, whose credential directories credential-store
// opens.
func confinement(h *home.Home, rec *binding.Record, env []string, mode confine.Mode) (*os.File, confine.Plan, error) {
	if mode == "" {
		m, _, err := confine.ReadMode(h.Config())
		if err != nil {
			return nil, confine.Plan{}, err
		}
		mode = m
	}
	vars := map[string]string{}
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		vars[k] = v
	}
	return confine.Build(mode, confine.Probe(), grant(h, rec, vars))
}

// grant is what rec's consents grant its package; vars are its
// environment's variables.
func grant(h *home.Home, rec *binding.Record, vars map[string]string) confine.Grant {
	g := confine.Grant{
		PackageRoot: rec.PackageRoot,
		State:       h.ExtensionState(rec.ExtensionID),
		Temp:        h.ExtensionTemp(rec.ExtensionID),
		Network:     rec.Consents.Network,
		Everywhere:  rec.Consents.ArtifactReferences,
	}
	if rec.Consents.CredentialStore {
		// SSH_AUTH_SOCK is a socket, which Landlock's ABIs up to 7 do not
		// restrict; the others are directories to read.
		for _, k := range credentialVars {
			if v, ok := vars[k]; ok && k != "SSH_AUTH_SOCK" && filepath.IsAbs(v) {
				g.Credentials = append(g.Credentials, v)
			}
		}
	}
	return g
}

// BindingPlan is what rec's package would be confined to now under c, with
// the caller's credential variables: what `fm home confinement` shows. It
// creates nothing and runs no package code.
func BindingPlan(h *home.Home, rec *binding.Record, c Confinement) confine.Plan {
	vars := map[string]string{}
	for _, k := range credentialVars {
		if v, ok := os.LookupEnv(k); ok {
			vars[k] = v
		}
	}
	f, p, _ := confine.Build(c.Mode, c.ABI, grant(h, rec, vars))
	if f != nil {
		f.Close()
	}
	return p
}

// explain is explain (the package's exit status worded) with the launch's
// confinement [CONF-5]: a confined package that failed may have been
// refused something its binding did not grant, so the error line says what
// it was confined to and how to check. Exit status barrier.ConfineFailed of
// a confined launch is the barrier's refusal to run unrestricted (or the
// package's own exit with that status): confinement-unavailable.
func (v *verified) explain(rec *binding.Record, verb string, err error) error {
	err = explain(rec, verb, err)
	if v.plan.Mode == confine.Off || v.plan.Mode == "" {
		return err
	}
	code := errcode.Of(err)
	var st launch.ExitStatus
	if errors.As(err, &st) && int(st) == barrier.ConfineFailed && v.ruleset != nil {
		code = errcode.ConfinementUnavailable
		return &errcode.Error{Code: code, Msg: err.Error() + "; exit " + strconv.Itoa(barrier.ConfineFailed) +
			" of a confined launch is the launch barrier refusing to run the package when the kernel refused its Landlock ruleset (landlock_restrict_self), unless the package itself exits " + strconv.Itoa(barrier.ConfineFailed), Err: err}
	}
	note := "the package ran " + v.plan.Short() + ": fm home confinement lists its rules, and a direct call with --confinement off checks whether they are the cause"
	short := "ran NOT confined (no Landlock)"
	if v.plan.Confined() {
		short = "ran confined by Landlock ABI " + strconv.Itoa(v.plan.ABI) + "; rules: fm home confinement; check: --confinement off"
	}
	return &errcode.Error{Code: code, Msg: err.Error() + "; " + note, Err: protocol.Confined(err, short)}
}
