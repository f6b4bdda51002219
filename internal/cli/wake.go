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

// wakeListFlags are the flags of wake list.
type wakeListFlags struct {
	after afterFlag
	json  bool
}

func (f *wakeListFlags) declare(fs *flag.FlagSet) {
	f.after.declare(fs)
	fs.BoolVar(&f.json, "json", false, "print one JSON document")
}

// wakeList is `fm wake list`.
func wakeList(e *Env, f *wakeListFlags, args []string) error {
	if err := need(args, 0, 0, "no arguments"); err != nil {
		return err
	}
	n, err := f.after.value()
	if err != nil {
		return err
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	if f.json || e.ttyOut {
		ws, err := wake.List(h.State, n)
		if err != nil {
			return err
		}
		if !f.json {
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
}

// wakeWatch is `fm wake watch`.
func wakeWatch(e *Env, after *afterFlag, args []string) error {
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
	return wake.Watch(e.Ctx, h.State, n, func(w wake.Wake) error {
		_, err := fmt.Fprint(e.Stdout, w.Line())
		return err
	})
}

// compactFlags are the flags of wake compact.
type compactFlags struct{ keep int }

func (f *compactFlags) declare(fs *flag.FlagSet) {
	fs.IntVar(&f.keep, "keep", procevent.DefaultCompactWindow, "how many of the latest wakes to keep")
}

// wakeCompact is `fm wake compact`.
func wakeCompact(e *Env, f *compactFlags, args []string) error {
	if err := need(args, 0, 0, "no arguments"); err != nil {
		return err
	}
	if f.keep < 0 {
		return errcode.New(errcode.Usage, "--keep %d must not be negative", f.keep)
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	res, err := procevent.CompactWakes(e.Ctx, h, f.keep)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "compacted: kept=%d dropped=%d last-seq=%d\n", res.Kept, res.Dropped, res.Mark)
	return nil
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
