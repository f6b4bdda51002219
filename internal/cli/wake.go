package cli

import (
	"bufio"
	"flag"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/wake"
	"firstmate.dev/fm/pkg/fmjson"
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
		Summary: "print the queued wakes: on a terminal an aligned table, otherwise one stored line each (unix-seconds, queue-seq, kind, key, payload, tab-separated); no wakes (after n) when there is none",
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
			if listJSON || e.ttyOut {
				ws, err := wake.List(h.State, n)
				if err != nil {
					return err
				}
				if !listJSON {
					return wakeTable(e, ws, n)
				}
				doc := fmjson.Wakes{Wakes: make([]fmjson.Wake, 0, len(ws))}
				for _, w := range ws {
					doc.Wakes = append(doc.Wakes, fmjson.Wake{Time: w.Time, Seq: w.Seq, Kind: w.Kind, Key: w.Key, Payload: w.Payload})
				}
				return writeJSON(e, doc)
			}
			// The queue's own lines, streamed: the queue may be long.
			out := bufio.NewWriter(e.Stdout)
			none := true
			err = wake.Each(h.State, n, func(w wake.Wake) error {
				none = false
				_, err := out.WriteString(w.Line())
				return err
			})
			if ferr := out.Flush(); err == nil {
				err = ferr
			}
			if err == nil && none {
				noWakes(e, n)
			}
			return err
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

	keep := procevent.DefaultCompactWindow
	register("wake", &Verb{
		Name:    "compact",
		Args:    "[--keep <n>]",
		Summary: "rewrite the wake queue to its latest wakes and the latest wake of each unhandled result, under the queue's lock; queue-seqs never go back",
		Flags: func(fs *flag.FlagSet) {
			fs.IntVar(&keep, "keep", keep, "how many of the latest wakes to keep")
		},
		Run: func(e *Env, args []string) error {
			if err := need(args, 0, 0, "no arguments"); err != nil {
				return err
			}
			if keep < 0 {
				return errcode.New(errcode.Usage, "--keep %d must not be negative", keep)
			}
			h, err := e.Home()
			if err != nil {
				return err
			}
			res, err := procevent.CompactWakes(e.Ctx, h, keep)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "compacted: kept=%d dropped=%d last-seq=%d\n", res.Kept, res.Dropped, res.Mark)
			return nil
		},
	})
}

// noWakes is the line of a listing with no wake after queue-seq after, on a
// terminal or not, like every other listing's "no …" line.
func noWakes(e *Env, after int64) {
	if after > 0 {
		fmt.Fprintf(e.Stdout, "no wakes after %d\n", after)
	} else {
		fmt.Fprintln(e.Stdout, "no wakes")
	}
}

// wakeTable prints wakes for a person at a terminal: aligned columns, the
// time in UTC, and a line saying so when there is none after queue-seq
// after.
func wakeTable(e *Env, ws []wake.Wake, after int64) error {
	if len(ws) == 0 {
		noWakes(e, after)
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tKIND\tKEY\tPAYLOAD")
	for _, w := range ws {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", w.Seq, time.Unix(w.Time, 0).UTC().Format(time.RFC3339), w.Kind, w.Key, w.Payload)
	}
	return tw.Flush()
}
