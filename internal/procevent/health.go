package procevent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/internal/wake"
)

// Per-source operator state [STAT-1]..[STAT-4], [OP-5].
//
// Every runner pass that holds a source's claim ends by recording what it
// did in <state>/procevent-status/<source-id>.json (0600, in a 0700
// directory beside the registry and the inbox, never inside them): the time
// (RFC 3339, UTC) and outcome of the pass, appended to a history of at most
// HistoryLen entries (the oldest dropped), the consecutive failures with the
// last host code and detail, the failing run that [OP-5] collapses, and the
// next poll a serve scheduled. The claim serialises the writers of one
// source; the file is replaced durably (fsutil.ReplaceAt), so a reader sees
// the old or the new document.
//
// A detail is the one evidence carries (protocol.EvidenceFor) or, where it
// carries none, the host's own message (the one serve logs): the host's
// words, bounded and printable, never the package's stdout or stderr.
// Nothing here is ever announced or captured.
//
// A file that does not read back as exactly this document (strict JSON,
// bounded, the right schema and source id) is never trusted: the runner
// neither collapses on it nor overwrites it, and status and doctor report
// it with the fix (remove the file; fm writes a new one at the next poll).
//
// Collapsing [OP-5]: a failing run starts with a captured evidence result.
// While that evidence is unhandled and captured under the source's current
// binding, a further failure with the same host code is not captured: the
// run's count, last time and last detail are updated here instead, and
// nothing is announced (re-announcement of the one evidence goes on under
// the rule of announce.go). A different code captures new evidence, which
// starts a new run; the evidence being handled ends the run, so the next
// failure is captured again; a success (a result or no result) ends the run
// and, when its evidence is still unhandled, announces the recovery once
// with a check wake of key procevent-recovered:<source-id>:<evidence-seq>.

// HealthSchema is the schema of a source's status file.
const HealthSchema = "firstmate.procevent-status.v1"

// HistoryLen bounds a source's history.
const HistoryLen = 50

// maxHealth bounds a status file: HistoryLen entries of a bounded detail.
const maxHealth = 64 << 10

// PersistentFailures is the number of consecutive failed polls from which
// fm doctor fails a home [STAT-4].
const PersistentFailures = 3

// The outcomes of a history entry.
const (
	OutcomeResult    = "result"    // a result was captured (Sequence)
	OutcomeNoResult  = "no-result" // the poll had nothing
	OutcomeEvidence  = "evidence"  // the failure was captured as evidence (Sequence)
	OutcomeCollapsed = "collapsed" // the failure was counted in the run of the evidence Sequence [OP-5]
	OutcomeError     = "error"     // the pass failed without a capture (a host fault, a refusal)
	OutcomeCheck     = "check-failed"
	OutcomeRecovered = "recovered" // a success ended the run of the evidence Sequence
)

// HealthEntry is one line of a source's history.
type HealthEntry struct {
	Time     string `json:"time"` // RFC 3339, UTC
	Outcome  string `json:"outcome"`
	Sequence int64  `json:"sequence,omitzero"`
	Code     string `json:"code,omitzero"`
	Detail   string `json:"detail,omitzero"`
}

// FailRun is a failing run [OP-5]: Evidence is the sequence of its captured
// evidence, Count the failures of the run (the captured one included).
type FailRun struct {
	Code          string `json:"code"`
	Evidence      int64  `json:"evidence"`
	BindingDigest string `json:"binding_digest"`
	Count         int64  `json:"count"`
	Since         string `json:"since"`
	Last          string `json:"last"`
	Detail        string `json:"detail,omitzero"`
}

// Health is a source's status file.
type Health struct {
	Schema   string `json:"schema"`
	SourceID string `json:"source_id"`
	// Failures counts the consecutive failed passes (evidence, collapsed or
	// error); a result or no result resets it. Code and Detail are the
	// last failure's.
	Failures int64         `json:"consecutive_failures"`
	Code     string        `json:"last_code,omitzero"`
	Detail   string        `json:"last_detail,omitzero"`
	FailedAt string        `json:"failing_since,omitzero"`
	Run      *FailRun      `json:"run,omitempty"`
	NextPoll string        `json:"next_poll,omitzero"`
	History  []HealthEntry `json:"history"`
}

// Last is the latest entry of a poll (not of a verdict failure or a
// recovery, which follow their poll's entry), or nil.
func (s *Health) Last() *HealthEntry {
	for i := len(s.History) - 1; i >= 0; i-- {
		if o := s.History[i].Outcome; o != OutcomeCheck && o != OutcomeRecovered {
			return &s.History[i]
		}
	}
	return nil
}

func healthDir(h *home.Home) string { return filepath.Join(h.State, "procevent-status") }

func healthName(id string) string { return id + ".json" }

// stamp is t as the history writes it.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// detailOf is the host's account of err for the history: the refusal
// detail evidence would carry where an answer was refused, else the host's
// own message as serve logs it (whose head says what failed: "entrypoint
// killed by signal 9", which the evidence's confinement note alone would
// not); either bounded to protocol.MaxDetail printable bytes.
func detailOf(err error) string {
	if d := protocol.RefusalDetail(err); d != "" {
		return d
	}
	return protocol.Printable(err.Error(), protocol.MaxDetail)
}

// readHealth reads and checks a status file from the pinned directory dir;
// absent is (nil, nil).
func readHealth(dir *os.File, id string) (*Health, error) {
	data, err := fsutil.ReadPrivateAt(dir, healthName(id), maxHealth)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	what := "status file " + filepath.Join(dir.Name(), healthName(id))
	var s Health
	if err := strictjson.Decode(data, maxHealth, what, &s); err != nil {
		return nil, err
	}
	if s.Schema != HealthSchema || s.SourceID != id || !countable(s.Failures) || (s.Run != nil && (!countable(s.Run.Count) || s.Run.Count < 1)) || len(s.History) > HistoryLen || !s.knownCodes() {
		return nil, errcode.New(errcode.SchemaInvalid, "%s: schema must be %q for source %q with counts 0..%d and at most %d entries, each code one of fm's", what, HealthSchema, id, MaxSeq, HistoryLen)
	}
	return &s, nil
}

// countable reports whether n is a count the status file carries exactly:
// 0..MaxSeq, the integers a JSON number keeps (the counters stop there).
func countable(n int64) bool { return n >= 0 && n <= MaxSeq }

// knownCodes reports whether every code of s is "" or one of errcode.All.
func (s *Health) knownCodes() bool {
	codes := []string{s.Code}
	if s.Run != nil {
		codes = append(codes, s.Run.Code)
	}
	for _, e := range s.History {
		codes = append(codes, e.Code)
	}
	for _, c := range codes {
		if c != "" && code(c) == "" {
			return false
		}
	}
	return true
}

// code is the errcode.All entry spelled c, or "".
func code(c string) errcode.Code {
	if i := slices.IndexFunc(errcode.All, func(k errcode.Code) bool { return string(k) == c }); i >= 0 {
		return errcode.All[i]
	}
	return ""
}

// LastCode is the code of the last failure, as one of errcode.All ("" for
// none).
func (s *Health) LastCode() errcode.Code { return code(s.Code) }

// healthPass is the state one runner pass records: loaded under the claim,
// changed by the pass, saved before the claim is released.
type healthPass struct {
	dir *os.File // nil: the file could not be trusted; nothing is saved
	// collapsing: a supervised pass (serve, reconcile) collapses [OP-5].
	collapsing bool
	s          *Health
	now        time.Time
	entries    []HealthEntry
	// stderr collects the package's stderr where the operator turned the
	// debug log on [STAT-6].
	stderr *stderrLog
	// skip: a steady idle pass records nothing; replace: it takes the
	// place of the idle entry before it (see idleRecord).
	skip, replace bool
}

// idleRecord is how often a source that keeps answering no-result has its
// status file written: a no-result pass right after a no-result pass
// recorded less than idleRecord ago writes nothing, and one after that
// replaces the earlier no-result entry rather than adding one. So an idle
// source costs no write per poll, and its history keeps the failures and
// results of hours ago rather than fifty seconds of no-result.
const idleRecord = time.Minute

// idle decides skip and replace for a no-result pass.
func (p *healthPass) idle() {
	s := p.s
	if len(s.History) == 0 || s.Failures != 0 || s.Run != nil {
		return
	}
	last := s.History[len(s.History)-1]
	if last.Outcome != OutcomeNoResult {
		return
	}
	t, err := time.Parse(time.RFC3339, last.Time)
	p.skip = err == nil && p.now.Sub(t) < idleRecord
	p.replace = !p.skip
}

// loadHealth pins the status directory (creating it) and reads id's file. A
// file that cannot be trusted gives a pass that records nothing.
func (d *dirs) loadHealth(id string) *healthPass {
	p := &healthPass{now: time.Now(), s: &Health{Schema: HealthSchema, SourceID: id, History: []HealthEntry{}}}
	dir, err := d.child(healthDir(d.h), true)
	if err != nil {
		return p
	}
	s, err := readHealth(dir, id)
	if err != nil {
		dir.Close()
		return p
	}
	if s != nil {
		p.s = s
	}
	p.dir = dir
	return p
}

// note adds a history entry of this pass.
func (p *healthPass) note(outcome string, seq int64, code errcode.Code, detail string) {
	p.entries = append(p.entries, HealthEntry{Time: stamp(p.now), Outcome: outcome, Sequence: seq, Code: string(code), Detail: detail})
}

// failed records a failed pass.
func (p *healthPass) failed(err error) {
	s := p.s
	if s.Failures == 0 {
		s.FailedAt = stamp(p.now)
	}
	s.Failures = min(s.Failures+1, MaxSeq)
	s.Code, s.Detail = string(errcode.Of(err)), detailOf(err)
}

// succeeded records a pass that captured a result or had none.
func (p *healthPass) succeeded() {
	p.s.Failures, p.s.Code, p.s.Detail, p.s.FailedAt = 0, "", "", ""
}

// collapse reports whether failure belongs to the run of evidence that is
// still unhandled [OP-5], and if so counts it there.
func (p *healthPass) collapse(d *dirs, r *Registration, failure error) (int64, bool) {
	run := p.s.Run
	if p.dir == nil || run == nil || !d.unhandled(r.SourceID, run.Evidence) {
		p.s.Run = nil
		return 0, false
	}
	if !p.collapsing {
		return 0, false
	}
	if run.Code != string(errcode.Of(failure)) || run.BindingDigest != r.BindingDigest {
		return 0, false
	}
	run.Count = min(run.Count+1, MaxSeq)
	run.Last, run.Detail = stamp(p.now), detailOf(failure)
	p.note(OutcomeCollapsed, run.Evidence, errcode.Of(failure), run.Detail)
	return run.Evidence, true
}

// unhandled reports whether result seq of id is captured and not handled.
func (d *dirs) unhandled(id string, seq int64) bool {
	return fsutil.ExistsAt(d.inbox, name(id, seq, resultSuffix)) && !fsutil.ExistsAt(d.inbox, name(id, seq, handledSuffix))
}

// startRun records the captured evidence seq as the start of a new run.
func (p *healthPass) startRun(r *Registration, seq int64, failure error) {
	t := stamp(p.now)
	p.s.Run = &FailRun{Code: string(errcode.Of(failure)), Evidence: seq, BindingDigest: r.BindingDigest, Count: 1, Since: t, Last: t, Detail: detailOf(failure)}
}

// RecoveredKey is the key of the check wake that announces a recovery.
func RecoveredKey(id string, seq int64) string {
	return fmt.Sprintf("procevent-recovered:%s:%d", id, seq)
}

// recover ends a run at a success; while its evidence is unhandled the
// recovery is announced once. A failed announcement keeps the run, so the
// next success announces it.
func (p *healthPass) recover(ctx context.Context, d *dirs, r *Registration) error {
	run := p.s.Run
	if run == nil {
		return nil
	}
	if p.dir != nil && d.unhandled(r.SourceID, run.Evidence) {
		if _, err := wake.Append(ctx, d.state, WakeKind, RecoveredKey(r.SourceID, run.Evidence),
			fmt.Sprintf("check: procevent-recovered %s %s %d", r.Adapter, r.SourceID, run.Evidence)); err != nil {
			return err
		}
		p.note(OutcomeRecovered, run.Evidence, "", fmt.Sprintf("after %d failure(s) of the run", run.Count))
	}
	p.s.Run = nil
	return nil
}

// save writes the pass's state: its entries appended to the history (the
// oldest dropped past HistoryLen), and next, when a serve scheduled one.
func (p *healthPass) save(next time.Duration) error {
	if p.dir == nil {
		return nil
	}
	defer p.dir.Close()
	if p.skip {
		return nil
	}
	s := p.s
	if p.replace {
		s.History = s.History[:len(s.History)-1]
	}
	s.History = append(s.History, p.entries...)
	if n := len(s.History) - HistoryLen; n > 0 {
		s.History = append([]HealthEntry{}, s.History[n:]...)
	}
	s.NextPoll = ""
	if next > 0 {
		s.NextPoll = stamp(p.now.Add(next))
	}
	data, err := strictjson.Canonical(s)
	if err != nil {
		return err
	}
	return fsutil.ReplaceAt(p.dir, healthName(s.SourceID), append(data, '\n'))
}

// discard ends a pass that records nothing.
func (p *healthPass) discard() {
	if p.dir != nil {
		p.dir.Close()
		p.dir = nil
	}
}

// record notes what the pass did (out, or the error that ended it) and
// updates the run and the consecutive failures.
func (p *healthPass) record(ctx context.Context, d *dirs, r *Registration, out *Outcome, err error) error {
	switch {
	case err != nil && (out == nil || out.Status != Captured):
		p.note(OutcomeError, 0, errcode.Of(err), detailOf(err))
		p.failed(err)
		return nil
	case out.Status == Collapsed:
		p.failed(out.Failure)
	case out.Evidence:
		p.startRun(r, out.Sequence, out.Failure)
		p.note(OutcomeEvidence, out.Sequence, errcode.Of(out.Failure), detailOf(out.Failure))
		p.failed(out.Failure)
	default:
		if out.Status == Captured {
			p.note(OutcomeResult, out.Sequence, "", "")
		} else {
			p.idle()
			p.note(OutcomeNoResult, 0, "", "")
		}
		p.succeeded()
		for _, c := range out.Checks {
			detail := c.Operation
			if dt := detailOf(c.Err); dt != "" {
				detail += ": " + dt
			}
			p.note(OutcomeCheck, out.Sequence, errcode.Of(c.Err), detail)
		}
		if err == nil {
			return p.recover(ctx, d, r)
		}
	}
	return nil
}
