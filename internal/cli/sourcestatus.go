package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/pkg/fmjson"
)

// proceventStatus is `fm procevent status [<source-id>] [--json]` [STAT-2]:
// every registered source's state in one table, or one source in detail
// with its recent history.
func proceventStatus(e *Env, f *jsonFlag, args []string) error {
	if err := need(args, 0, 1, "at most one source id"); err != nil {
		return err
	}
	if len(args) == 1 {
		if err := protocol.CheckSourceID(args[0]); err != nil {
			return err
		}
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	serving, reps, err := procevent.Statuses(h)
	if err != nil {
		return err
	}
	doc := fmjson.Statuses{Serving: serving, Sources: []fmjson.SourceStatus{}}
	for _, r := range reps {
		if len(args) == 1 && r.SourceID != args[0] {
			continue
		}
		doc.Sources = append(doc.Sources, sourceStatus(r, serving, len(args) == 1))
	}
	if len(args) == 1 && len(doc.Sources) == 0 {
		return errcode.New(errcode.SourceMissing, "no source %q is registered; see fm procevent status", args[0])
	}
	switch {
	case f.json:
		return writeJSON(e, doc)
	case len(args) == 1:
		return describeSource(e.Stdout, doc.Serving, &doc.Sources[0])
	case len(doc.Sources) == 0:
		fmt.Fprintln(e.Stdout, "no process-event sources")
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tADAPTER\tOWNER\tSTATE\tLAST-POLL\tOUTCOME\tFAILURES\tCODE\tUNHANDLED\tNEXT-POLL")
	for _, s := range doc.Sources {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\n", s.SourceID, s.Adapter, s.Owner, s.State,
			when(s.LastPoll), dash(s.LastOutcome), s.ConsecutiveFailures, dash(s.LastCode), s.Pending, when(s.NextPoll))
	}
	return tw.Flush()
}

// sourceStatus is the --json form of one report; history only when asked.
func sourceStatus(r *procevent.SourceReport, serving, history bool) fmjson.SourceStatus {
	s := fmjson.SourceStatus{
		Source:        fmjson.Source{SourceID: r.SourceID, Adapter: r.Adapter, Kind: r.Kind, Owner: r.Owner(), Pending: r.Unhandled},
		BindingDigest: r.BindingDigest, ConfigRef: r.ConfigRef, State: r.State(serving),
		History: []fmjson.HistoryEntry{},
	}
	if r.HealthErr != nil {
		s.StatusError = r.HealthErr.Error()
	}
	s.DebugLog = r.Debug
	if hs := r.Health; hs != nil {
		if last := hs.Last(); last != nil {
			s.LastPoll, s.LastOutcome = unixOf(last.Time), last.Outcome
		}
		s.ConsecutiveFailures, s.FailingSince, s.LastCode, s.LastDetail = hs.Failures, unixOf(hs.FailedAt), hs.Code, hs.Detail
		s.NextPoll = unixOf(hs.NextPoll)
		if history {
			for _, en := range hs.History {
				s.History = append(s.History, fmjson.HistoryEntry{Time: unixOf(en.Time), Outcome: en.Outcome, Sequence: en.Sequence, Code: en.Code, Detail: en.Detail})
			}
		}
	}
	if run := r.Run; run != nil {
		s.Run = fmjson.FailRun{Evidence: run.Evidence, Code: run.Code, Count: run.Count, Since: unixOf(run.Since), Last: unixOf(run.Last), Detail: run.Detail}
	}
	return s
}

// describeSource prints one source in detail, then its history.
func describeSource(w io.Writer, serving bool, s *fmjson.SourceStatus) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	binding := s.BindingDigest
	if len(binding) > 19 {
		binding = binding[:19]
	}
	rows := [][2]string{
		{"source", s.SourceID}, {"adapter", s.Adapter}, {"owner", s.Owner}, {"binding", dash(binding)},
		{"config_ref", dash(s.ConfigRef)}, {"state", s.State}, {"serve", map[bool]string{true: "running", false: "not running"}[serving]},
		{"last poll", when(s.LastPoll) + " " + dash(s.LastOutcome)},
		{"failures", fmt.Sprintf("%d consecutive since %s, last %s %s", s.ConsecutiveFailures, when(s.FailingSince), dash(s.LastCode), s.LastDetail)},
		{"unhandled", fmt.Sprint(s.Pending)}, {"next poll", when(s.NextPoll)},
	}
	if s.ConsecutiveFailures == 0 {
		rows[8][1] = "0"
	}
	if s.Run.Evidence > 0 {
		rows = append(rows, [2]string{"failing run", fmt.Sprintf("evidence %d (%s): %d failure(s) from %s to %s; fm procevent handled %s %d ends it", s.Run.Evidence, s.Run.Code, s.Run.Count, when(s.Run.Since), when(s.Run.Last), s.SourceID, s.Run.Evidence)})
	}
	if s.DebugLog != "" {
		rows = append(rows, [2]string{"debug", "on: the package's stderr of failed polls is kept in " + s.DebugLog})
	}
	if s.StatusError != "" {
		rows = append(rows, [2]string{"status file", "not trusted: " + s.StatusError})
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s:\t%s\n", r[0], r[1])
	}
	fmt.Fprintln(tw, "\nTIME\tOUTCOME\tSEQ\tCODE\tDETAIL")
	for _, en := range s.History {
		seq := "-"
		if en.Sequence > 0 {
			seq = fmt.Sprint(en.Sequence)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", when(en.Time), en.Outcome, seq, dash(en.Code), en.Detail)
	}
	return tw.Flush()
}

// proceventDebug is `fm procevent debug <source-id> on|off` [STAT-6].
func proceventDebug(e *Env, args []string) error {
	if err := need(args, 2, 2, "a source id and on or off"); err != nil {
		return err
	}
	if args[1] != "on" && args[1] != "off" {
		return errcode.New(errcode.Usage, "%q: say on or off", args[1])
	}
	h, err := e.Home()
	if err != nil {
		return err
	}
	log, err := procevent.SetDebug(h, args[0], args[1] == "on")
	if err != nil {
		return err
	}
	if args[1] == "on" {
		fmt.Fprintf(e.Stdout, "debug: %s on (the package's stderr of failed polls goes to %s)\n", args[0], log)
		return nil
	}
	fmt.Fprintf(e.Stdout, "debug: %s off\n", args[0])
	return nil
}

// unixOf is an RFC 3339 time of a status file in unix seconds (0 for none).
func unixOf(t string) int64 {
	p, err := time.Parse(time.RFC3339, t)
	if err != nil {
		return 0
	}
	return p.Unix()
}

// when is unix seconds as RFC 3339 UTC, or "-" for none.
func when(t int64) string {
	if t == 0 {
		return "-"
	}
	return time.Unix(t, 0).UTC().Format(time.RFC3339)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
