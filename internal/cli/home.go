package cli

import (
	"flag"
	"fmt"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/homeimport"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/pkg/fmjson"
)

// importFlags are the flags of home import.
type importFlags struct{ dryRun, json bool }

func (f *importFlags) declare(fs *flag.FlagSet) {
	fs.BoolVar(&f.dryRun, "dry-run", false, "change nothing; print what would be done")
	fs.BoolVar(&f.json, "json", false, "print one JSON document")
}

// homeImport is `fm home import`.
func homeImport(e *Env, f *importFlags, args []string) error {
	h, err := e.homeFor(args, 0, 0, "no arguments")
	if err != nil {
		return err
	}
	rep, err := homeimport.Import(e.Ctx, h, f.dryRun)
	if err != nil {
		return err
	}
	if f.json {
		return writeJSON(e, rep)
	}
	for _, l := range rep.Lines {
		fmt.Fprintln(e.Stdout, l.String())
	}
	if rep.Backup != "" {
		fmt.Fprintf(e.Stdout, "kept: every replaced or removed file is in %s\n", rep.Backup)
	}
	fmt.Fprintln(e.Stdout, rep.Summary())
	return nil
}

// homeConfinement is `fm home confinement [enforce|strict|off]`: with a
// mode it sets the home's confinement [CONF-2]; it then prints the setting,
// the kernel's Landlock ABI and what each bound package is confined to.
func homeConfinement(e *Env, f *jsonFlag, args []string) error {
	h, err := e.homeFor(args, 0, 1, "at most one mode: enforce, strict or off")
	if err != nil {
		return err
	}
	if len(args) == 1 {
		m, err := confine.ParseMode(args[0])
		if err != nil {
			return err
		}
		if err := confine.WriteMode(h.Config(), m); err != nil {
			return err
		}
	}
	c, err := host.HomeConfinement(h)
	if err != nil {
		return err
	}
	bs, err := binding.Load(h)
	if err != nil {
		return err
	}
	doc := fmjson.Confinement{Mode: string(c.Mode), Set: c.Set, ABI: c.ABI, Summary: c.Describe(), Bindings: []fmjson.ConfinedExtension{}}
	lines := []string{"confinement: " + doc.Summary}
	for _, b := range bs {
		p := host.BindingPlan(h, &b.Record, c)
		doc.Bindings = append(doc.Bindings, fmjson.ConfinedExtension{ExtensionID: b.ExtensionID, Confined: p.Confined(), Rules: nonNil(p.Rules), Lacked: nonNil(p.Lacked)})
		lines = append(lines, b.ExtensionID+": "+p.String())
	}
	if f.json {
		return writeJSON(e, doc)
	}
	for _, l := range lines {
		fmt.Fprintln(e.Stdout, l)
	}
	return nil
}

// nonNil is s, or an empty list for nil ([fmjson] rule 2).
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
