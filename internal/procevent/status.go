package procevent

import (
	"os"
	"path/filepath"

	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
)

// HomeStatus is a read-only snapshot of a home's process-event core, for
// `fm doctor`: whether a serve supervises the home, which sources are
// registered and which of them a runner is polling right now, and how many
// captured results wait to be handled.
type HomeStatus struct {
	// Serving reports that an `fm procevent serve` holds the home's serve
	// lock.
	Serving bool
	// Sources are the registrations, in source-id order.
	Sources []SourceStatus
	// Results counts the captured results in the inbox; Unhandled those
	// without a handled marker.
	Results, Unhandled int
}

// SourceStatus is one registration as HomeStatus shows it. The owner token is
// not part of it.
type SourceStatus struct {
	SourceID, Adapter, Kind string
	// Owner is "<extension id>@<version>" or "built-in".
	Owner string
	// BindingDigest is the binding an extension registration was resolved
	// to ("" for a built-in).
	BindingDigest string
	// Polling reports that a live runner holds the source's claim.
	Polling bool
}

// ReadStatus reads the status of h's process-event core. It creates
// nothing: an absent state root, registry or inbox reads as empty, and a lock
// file that was never created is not held.
//
// Whether a lock is held is read from /proc/locks (fsutil.Held), without
// taking it, so a status read never makes a runner, a registration or a
// serve that starts at that instant find its lock busy. No state is written.
func ReadStatus(h *home.Home) (*HomeStatus, error) {
	st := &HomeStatus{}
	d, err := openDirs(h, false, false)
	if err == errAbsent {
		return st, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.close()
	if d.reg != nil {
		if err := st.readSources(d); err != nil {
			return nil, err
		}
	}
	// The inbox is read whether or not the registry exists.
	switch err := d.openInbox(false); err {
	case errAbsent:
		return st, nil
	case nil:
	default:
		return nil, err
	}
	results, err := d.results()
	if err != nil {
		return nil, err
	}
	st.Results = len(results)
	for _, r := range results {
		if !r.Handled {
			st.Unhandled++
		}
	}
	return st, nil
}

// readSources reads serve's lock, the registrations and their claims.
func (st *HomeStatus) readSources(d *dirs) error {
	var err error
	if st.Serving, err = held(d.reg, "serve.lock"); err != nil {
		return err
	}
	regs, err := d.sources()
	if err != nil {
		return err
	}
	for _, r := range regs {
		polling, err := held(d.reg, r.SourceID+claimSuffix)
		if err != nil {
			return err
		}
		st.Sources = append(st.Sources, SourceStatus{r.SourceID, r.Adapter, r.Kind, r.Owner(), r.BindingDigest, polling})
	}
	return nil
}

// held reports whether a process holds the lock file name in dir (or holds
// a removed file of that name; see fsutil.Held); an absent one is not
// created.
func held(dir *os.File, name string) (bool, error) {
	return fsutil.Held(dir, name, fsutil.LockOptions{})
}

// Sequences reports every source of h whose sequence cannot advance (each
// as the sequence-exhausted error its next poll would get, or the error of
// its unreadable counter) and every inbox entry whose sequence is past
// MaxSeq, registered source or not. It creates nothing.
func Sequences(h *home.Home) ([]error, error) {
	d, err := openDirs(h, false, false)
	if err == errAbsent {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.close()
	switch err := d.openInbox(false); err {
	case errAbsent, nil:
	default:
		return nil, err
	}
	var problems []error
	reported := map[string]bool{}
	if d.reg != nil {
		regs, err := d.sources()
		if err != nil {
			return nil, err
		}
		names, err := d.inboxNames()
		if err != nil {
			return nil, err
		}
		for _, r := range regs {
			if _, err := d.nextSeq(r.SourceID, names); err != nil {
				problems = append(problems, err)
				reported[r.SourceID] = true
			}
		}
	}
	names, err := d.inboxNames()
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if id, _, _, _ := splitName(n); outOfRange(n, "") && !reported[id] {
			problems = append(problems, exhausted(id, "inbox entry "+filepath.Join(d.inbox.Name(), n)+" has a sequence past the last one"))
		}
	}
	return problems, nil
}

// The states of a source [STAT-2].
const (
	StatePolling = "polling" // a runner holds its claim now
	StateFailing = "failing" // its last recorded pass failed
	StateStopped = "stopped" // no serve runs for the home: nothing polls it unless start or reconcile runs
	StateIdle    = "idle"    // a serve supervises it and it waits for its next poll
)

// SourceReport is one registered source as fm procevent status shows it.
type SourceReport struct {
	*Registration
	Polling   bool
	Unhandled int64
	// Health is the source's status file (nil: never polled); HealthErr
	// says why it could not be trusted.
	Health    *Health
	HealthErr error
	// Run is the failing run [OP-5] while its evidence is unhandled.
	Run *FailRun
	// Debug is the path of the source's debug log where the operator
	// turned it on [STAT-6], else "".
	Debug string
}

// State is the source's state [STAT-2], given whether a serve runs.
func (r *SourceReport) State(serving bool) string {
	switch {
	case r.Polling:
		return StatePolling
	case r.Health != nil && r.Health.Failures > 0:
		return StateFailing
	case !serving:
		return StateStopped
	}
	return StateIdle
}

// Persistent reports whether the source fails persistently: at least
// PersistentFailures consecutive failed passes [STAT-4].
func (r *SourceReport) Persistent() bool {
	return r.Health != nil && r.Health.Failures >= PersistentFailures
}

// Statuses reads every registered source's report, in source-id order, and
// whether a serve runs. It creates nothing and writes nothing.
func Statuses(h *home.Home) (serving bool, reports []*SourceReport, err error) {
	d, err := openDirs(h, false, false)
	if err == errAbsent {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, err
	}
	defer d.close()
	if d.reg == nil {
		return false, nil, nil
	}
	if serving, err = held(d.reg, "serve.lock"); err != nil {
		return false, nil, err
	}
	regs, err := d.sources()
	if err != nil {
		return false, nil, err
	}
	unhandled := map[string]int64{}
	switch err := d.openInbox(false); err {
	case errAbsent:
	case nil:
		results, err := d.results()
		if err != nil {
			return false, nil, err
		}
		for _, r := range results {
			if !r.Handled {
				unhandled[r.SourceID]++
			}
		}
	default:
		return false, nil, err
	}
	var hdir *os.File
	if _, err := os.Lstat(healthDir(h)); err == nil {
		if hdir, err = d.child(healthDir(h), false); err != nil {
			return false, nil, err
		}
		defer hdir.Close()
	}
	for _, r := range regs {
		rep := &SourceReport{Registration: r, Unhandled: unhandled[r.SourceID]}
		if rep.Polling, err = held(d.reg, r.SourceID+claimSuffix); err != nil {
			return false, nil, err
		}
		if hdir != nil {
			rep.Health, rep.HealthErr = readHealth(hdir, r.SourceID)
			if debugging(hdir, r.SourceID) {
				rep.Debug = filepath.Join(hdir.Name(), r.SourceID+stderrSuffix)
			}
		}
		if rep.Health != nil && rep.Health.Run != nil && d.inbox != nil && d.unhandled(r.SourceID, rep.Health.Run.Evidence) {
			rep.Run = rep.Health.Run
		}
		reports = append(reports, rep)
	}
	return serving, reports, nil
}
