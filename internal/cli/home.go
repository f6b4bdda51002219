package cli

import (
	"flag"
	"fmt"

	"firstmate.dev/fm/internal/homeimport"
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
