package cli

import (
	"flag"
	"fmt"

	"firstmate.dev/fm/internal/homeimport"
)

func init() {
	addGroup("home", "move a home of the earlier Firstmate implementation onto fm")
	var dryRun, asJSON bool
	register("home", &Verb{
		Name: "import",
		Args: "[--dry-run] [--json]",
		Summary: "Convert a stopped home of the earlier Firstmate implementation into fm's layout, in place: registrations\n" +
			"(tokens kept), result owners, handled markers, sequence counters, the wake queue, transfer receipts and modes.\n" +
			"Every replaced or removed file is kept under data/imported/<UTC time>/. One line per thing converted, then\n" +
			"imported: sources=<n> results=<n> unhandled=<n> transfers=<n>. Safe to interrupt: run it again to finish.",
		Flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&dryRun, "dry-run", false, "change nothing; print what would be done")
			fs.BoolVar(&asJSON, "json", false, "print one JSON document")
		},
		Run: func(e *Env, args []string) error {
			h, err := e.homeFor(args, 0, 0, "no arguments")
			if err != nil {
				return err
			}
			rep, err := homeimport.Import(e.Ctx, h, dryRun)
			if err != nil {
				return err
			}
			if asJSON {
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
		},
	})
}
