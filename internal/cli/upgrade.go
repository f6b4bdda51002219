package cli

import (
	"flag"
	"fmt"
	"path/filepath"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/storegc"
	"firstmate.dev/fm/internal/upgrade"
)

// extensionUpgrade is `fm extension upgrade` ([UPG-1]).
func extensionUpgrade(e *Env, bf *localBindFlags, args []string) error {
	if err := need(args, 2, 2, "an extension id and a package directory"); err != nil {
		return err
	}
	id, dir := args[0], args[1]
	if !filepath.IsAbs(dir) {
		return errcode.New(errcode.PathUnsafe, "package directory %q must be an absolute path: give its canonical spelling, such as the output of (cd %q && pwd -P)", dir, dir)
	}
	h, opts, err := bf.local(e, dir)
	if err != nil {
		return err
	}
	if bf.timeout == nil {
		opts.TimeoutMS = 0 // keep the current binding's
	}
	defer e.withProgress(&opts.Progress)()
	b, unchanged, err := upgrade.Run(e.Ctx, h, upgrade.Options{ID: id, Bind: opts, Report: upgradeReport{e, h}})
	if err != nil {
		return err
	}
	if unchanged {
		fmt.Fprintf(e.Stdout, "unchanged: %s@%s %s (the package and settings give the binding already enabled; nothing was changed)\n", b.ExtensionID, b.ExtensionVersion, b.Digest)
		return nil
	}
	fmt.Fprintf(e.Stdout, "upgraded: %s@%s %s\n", b.ExtensionID, b.ExtensionVersion, b.Digest)
	return nil
}

// upgradeReport prints each step of an upgrade as it is done.
type upgradeReport struct {
	e *Env
	h *home.Home
}

func (r upgradeReport) RetiredSource(id string) { fmt.Fprintf(r.e.Stdout, "retired: %s\n", id) }

func (r upgradeReport) RetiredBinding(id, digest, kept string) {
	fmt.Fprintf(r.e.Stdout, "retired-binding: %s %s\nretained-at: %s\n", id, digest, kept)
}

func (r upgradeReport) Bound(b *binding.Binding) { printBound(r.e, b) }

func (r upgradeReport) Registered(reg *procevent.Registration) { printRegistered(r.e, r.h, reg) }

func (r upgradeReport) KeptSource(reg *procevent.Registration) {
	fmt.Fprintf(r.e.Stdout, "kept: %s (%s from %s, registered with this binding already)\n", reg.SourceID, reg.Adapter, reg.Owner())
}

// printRegistered prints an extension registration's three lines: the
// source, its owner token, and the exact command that retires it, naming a
// program that exists (retireProgram, [REG-2]).
func printRegistered(e *Env, h *home.Home, r *procevent.Registration) {
	fmt.Fprintf(e.Stdout, "registered: %s (%s from %s)\n", r.SourceID, r.Adapter, r.Owner())
	fmt.Fprintf(e.Stdout, "owner-token: %s\n", r.Token)
	fmt.Fprintf(e.Stdout, "retire: %s %s --if-owner %s\n", retireProgram(h), r.SourceID, r.Token)
}

// proceventToken is `fm procevent token` ([UPG-5]): the owner token of an
// extension registration, read from its record, and its retire command.
func proceventToken(e *Env, args []string) error {
	h, err := e.homeFor(args, 1, 1, "one source id")
	if err != nil {
		return err
	}
	regs, err := procevent.Sources(h)
	if err != nil {
		return err
	}
	for _, r := range regs {
		if r.SourceID != args[0] {
			continue
		}
		if !r.External() {
			return errcode.New(errcode.Usage, "source %q is a built-in registration: it has no owner token to print; retire it with fm procevent retire %s --if-matches %s -- <its argv>", r.SourceID, r.SourceID, r.Adapter)
		}
		printRegistered(e, h, r)
		return nil
	}
	return errcode.New(errcode.SourceMissing, "no source %q is registered; see fm procevent list", args[0])
}

// gcFlags are the flags of extension gc.
type gcFlags struct{ o storegc.Options }

func (f *gcFlags) declare(fs *flag.FlagSet) {
	fs.BoolVar(&f.o.DryRun, "dry-run", false, "print what would be removed; remove nothing")
	fs.BoolVar(&f.o.IncludeRetired, "include-retired", false, "also remove the copies of retired bindings and retired transfers (they can no longer be restored)")
}

// extensionGC is `fm extension gc` ([GC-1]).
func extensionGC(e *Env, f *gcFlags, args []string) error {
	h, err := e.homeFor(args, 0, 0, "no arguments")
	if err != nil {
		return err
	}
	rep, err := storegc.Run(e.Ctx, h, f.o)
	word := "removed"
	if f.o.DryRun {
		word = "would-remove"
	}
	if rep != nil {
		for _, c := range rep.Removed {
			fmt.Fprintf(e.Stdout, "%s: %s\n", word, c)
		}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "gc: %s=%d kept=%d\n", word, len(rep.Removed), len(rep.Kept))
	return nil
}
