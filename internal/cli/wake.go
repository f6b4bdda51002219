package cli

import (
	"flag"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/wake"
)

// afterFlag is --after <queue-seq>: a non-negative decimal integer.
type afterFlag struct{ raw string }

func (a *afterFlag) declare(fs *flag.FlagSet) {
	fs.StringVar(&a.raw, "after", "0", "only wakes with a queue-seq greater than this")
}

func (a *afterFlag) value() (int64, error) {
	n, err := strconv.ParseInt(a.raw, 10, 64)
	if err != nil || n < 0 {
		return 0, errcode.New(errcode.Usage, "--after %q must be a non-negative decimal queue-seq", a.raw)
	}
	return n, nil
}

func init() {
	var (
		after    afterFlag
		listJSON bool
	)
	register("wake", &Verb{
		Name:    "list",
		Args:    "[--after <queue-seq>] [--json]",
		Summary: "print the queued wakes: on a terminal an aligned table, otherwise one stored line each (unix-seconds, queue-seq, kind, key, payload, tab-separated)",
		Flags: func(fs *flag.FlagSet) {
			after.declare(fs)
			fs.BoolVar(&listJSON, "json", false, "print one JSON document")
		},
		Run: func(e *Env, args []string) error {
			if err := need(args, 0, 0, "no arguments"); err != nil {
				return err
			}
			n, err := after.value()
			if err != nil {
				return err
			}
			h, err := e.Home()
			if err != nil {
				return err
			}
			ws, err := wake.List(h.State, n)
			if err != nil {
				return err
			}
			if listJSON {
				if ws == nil {
					ws = []wake.Wake{}
				}
				return writeJSON(e, map[string]any{"wakes": ws})
			}
			if e.ttyOut {
				return wakeTable(e, ws, n)
			}
			for _, w := range ws {
				fmt.Fprint(e.Stdout, w.Line())
			}
			return nil
		},
	})

	var watchAfter afterFlag
	register("wake", &Verb{
		Name:    "watch",
		Args:    "[--after <queue-seq>]",
		Summary: "print the queued wakes, then each new one as it is appended, until TERM/INT",
		Stream:  true,
		Flags:   watchAfter.declare,
		Run: func(e *Env, args []string) error {
			if err := need(args, 0, 0, "no arguments"); err != nil {
				return err
			}
			n, err := watchAfter.value()
			if err != nil {
				return err
			}
			h, err := e.Home()
			if err != nil {
				return err
			}
			return wake.Watch(e.Ctx, h.State, n, func(w wake.Wake) error {
				_, err := fmt.Fprint(e.Stdout, w.Line())
				return err
			})
		},
	})
}

// wakeTable prints wakes for a person at a terminal: aligned columns, the
// time in UTC, and a line saying so when there is none after queue-seq
// after.
func wakeTable(e *Env, ws []wake.Wake, after int64) error {
	if len(ws) == 0 {
		if after > 0 {
			fmt.Fprintf(e.Stdout, "no wakes after %d\n", after)
		} else {
			fmt.Fprintln(e.Stdout, "no wakes")
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tKIND\tKEY\tPAYLOAD")
	for _, w := range ws {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", w.Seq, time.Unix(w.Time, 0).UTC().Format(time.RFC3339), w.Kind, w.Key, w.Payload)
	}
	return tw.Flush()
}
