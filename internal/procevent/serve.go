package procevent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/launch"
)

// Supervision [RUN-2].
//
// serve keeps every registered source polling: one goroutine per source runs
// the generic runner (Start) again and again, so there is at most one poll
// per source (the claim guarantees it across processes too). Between two
// polls of a source it waits MinGap; after a failure (an error, or captured
// failure evidence) it backs off exponentially from 2*MinGap up to
// MaxBackoff, and a success or a no-result resets the backoff. A host fault
// (host-resource: fm itself out of files, disk, memory or processes) is such
// a failure too, but it is never captured as evidence (runner.go), and it is
// not logged per poll: one line on stderr (ServeOptions.Warn) starts the
// episode and one ends it, after faultQuiet without a host fault. It re-reads
// the registry as soon as its watch (watch.go) reports a registration
// appearing or going, and every Rescan as a safety net: a new registration
// gets its goroutine, and a goroutine whose source was retired ends at its
// next pass. Every
// MaintainEvery (and at start) it runs the maintenance half of a cycle:
// resolve the groups dead hosts left (launch.Cleanup on every record whose
// host is dead: a killed runner leaves the records of its polls and of their
// handshakes, and the latter carry no source id), re-announce unhandled
// results (see announce.go), and compact the wake queue once it is larger
// than AutoCompactBytes (CompactWakes), so a served home's queue stays
// bounded without the operator.
//
// serve is a child subreaper (package launch), so a package process that left
// its poll's group re-parents to it when its parent dies; with
// ServeOptions.ReapOrphans (the serve command) it reaps those every Rescan,
// never touching the leader of a group a poll is still proving gone.
//
// Every launch serve makes passes one launch.Gate of launch.GateSize slots
// (four per CPU it may use): a call holds a slot while it starts, so the herd of
// a start, of a restart after a kill, or of a burst of registrations is
// queued in serve, where no package's bound runs, and at most that many
// calls compete for the CPUs at once [INV-5]. Reconcile's concurrent polls
// pass one likewise.
//
// One serve per home: it holds the lock <state>/procevent/serve.lock
// (fsutil.Lock, without waiting) for its life; the kernel drops it if serve
// dies, and removing or replacing the file does not let a second serve in. On ctx cancellation (TERM/INT) every running poll's context is
// cancelled, which makes the launch supervision stop that poll's exact
// process group; serve returns once every goroutine has ended. A poll
// stopped this way captures nothing and is repeated with the same request id
// by the next runner. If serve is killed outright, its polls' groups keep
// their owner records; the next serve (or reconcile, or start of that
// source) proves them gone before polling again, and every capture that was
// published before the kill is already durable.

// ServeOptions tune serve and reconcile; start from DefaultServeOptions.
type ServeOptions struct {
	MinGap     time.Duration // between two polls of one source
	MaxBackoff time.Duration // ceiling of the failure backoff
	Rescan     time.Duration // registry rescan period
	Reannounce time.Duration // re-announce interval; 0 re-announces every cycle
	// ReapOrphans makes serve reap, every Rescan, the zombie children that
	// are not the leader of one of its invocations (launch.ReapOrphans):
	// serve is a child subreaper, so a process that left its poll's group
	// re-parents to it and would otherwise stay its zombie forever. Set it
	// only in a process whose every child is started by package launch (the
	// fm procevent serve command), never in one that also runs os/exec
	// children.
	ReapOrphans bool
	// Log receives one line per notable event, one call at a time; nil
	// discards them.
	Log func(line string)
	// Warn receives the line that starts and the line that ends an episode
	// of host faults (host-resource), once each however many polls fail
	// in between; nil discards them.
	Warn func(line string)
	// Notice receives serve's own lifecycle lines [STAT-5]: started,
	// source added, source removed, stopped; nil discards them.
	Notice func(line string)
}

// DefaultServeOptions are the defaults of serve and reconcile.
func DefaultServeOptions() ServeOptions {
	return ServeOptions{MinGap: time.Second, MaxBackoff: 5 * time.Minute, Rescan: 2 * time.Second, Reannounce: DefaultReannounce}
}

// MaintainEvery is the period of serve's maintenance (see Serve): a measure
// of an idle serve's CPU is a time average only over whole periods.
const MaintainEvery = 30 * time.Second

func (o *ServeOptions) check() error {
	if o.MinGap <= 0 || o.MaxBackoff < o.MinGap || o.Rescan <= 0 || o.Reannounce < 0 {
		return errcode.New(errcode.Usage, "--min-gap and --rescan must be positive, --max-backoff at least --min-gap, --reannounce-after not negative")
	}
	if o.Log == nil {
		o.Log = func(string) {}
	}
	if o.Warn == nil {
		o.Warn = func(string) {}
	}
	if o.Notice == nil {
		o.Notice = func(string) {}
	}
	return nil
}

// Line is the [RUN-1] text of an outcome: one or two lines, no newline at
// the end. A capture of failure evidence says so and names its code
// (`captured: <path> (evidence: <code>)`), and a result the silent verdict
// marked handled is followed by `silenced: <source-id> <seq>`, so neither
// looks like an ordinary announced result.
func (o *Outcome) Line() string {
	switch o.Status {
	case Captured:
		s := "captured: " + o.Path
		if o.Evidence {
			s += " (evidence: " + string(errcode.Of(o.Failure)) + ")"
		}
		if o.Silent {
			s += fmt.Sprintf("\nsilenced: %s %d", o.SourceID, o.Sequence)
		}
		if o.Retired {
			s += "\nretired: " + o.SourceID + " (terminal)"
		}
		return s
	case NoResult:
		return "no-result: " + o.SourceID
	case Collapsed:
		return fmt.Sprintf("collapsed: %s (%s): failure %d of the run of evidence %d; not captured", o.SourceID, errcode.Of(o.Failure), o.Count, o.Sequence)
	}
	return "already owned: " + o.SourceID
}

// CheckLines are the lines of the verdicts that failed [STAT-3]:
// `check-failed: <source-id> <seq> <operation> (<code>)`, each of which took
// the false path [OP-4].
func (o *Outcome) CheckLines() []string {
	var ls []string
	for _, c := range o.Checks {
		ls = append(ls, fmt.Sprintf("check-failed: %s %d %s (%s)", o.SourceID, o.Sequence, c.Operation, errcode.Of(c.Err)))
	}
	return ls
}

// Serve runs the supervisor until ctx is done.
func Serve(ctx context.Context, h *home.Home, o ServeOptions) error {
	if err := o.check(); err != nil {
		return err
	}
	d, err := openDirs(h, false, true)
	if err != nil {
		return err
	}
	defer d.close()
	lock, err := fsutil.Lock(ctx, d.reg, "serve.lock", fsutil.LockOptions{Try: true})
	if errors.Is(err, fsutil.ErrLocked) {
		return errcode.New(errcode.SourceActive, "another fm procevent serve%s is running for home %q; stop it first (one serve per home)", servePID(d.reg), h.Dir)
	}
	if err != nil {
		return err
	}
	defer lock.Release()
	ctx = launch.WithGate(ctx, launch.NewGate(launch.GateSize()))
	defer recordPID(d.reg)()
	// Files are reused for the life of the serve rather than created and
	// unlinked per invocation and capture (fsutil: "Spare files").
	defer launch.KeepSpares(h.Invocations())()
	defer fsutil.KeepSpares(h.Registrations(), nil)()
	defer fsutil.KeepSpares(h.Inbox(), nil)()
	// Each pass takes its source's inbox names from an index kept by
	// inotify rather than a listing of the whole inbox (inboxindex.go).
	defer indexInbox()()
	defer tuneGCWhileServing()()
	s := &supervisor{h: h, o: o, running: map[string]bool{}}
	s.maintain(ctx, d)
	s.started(d)
	defer s.o.Notice(fmt.Sprintf("serve: stopped pid=%d", os.Getpid()))
	// A registration or retirement is picked up when the registry watch
	// reports it (watch.go); the Rescan ticker is the safety net.
	var changed <-chan struct{}
	if w, err := watchRegistry(d.reg); err == nil {
		c, end := w.onChange()
		changed = c
		defer w.release()
		defer end()
	}
	rescan := time.NewTicker(o.Rescan)
	defer rescan.Stop()
	last := time.Now()
	for {
		s.rescan(ctx, d)
		select {
		case <-ctx.Done():
			s.wg.Wait()
			return nil
		case <-changed:
		case <-rescan.C:
		}
		if o.ReapOrphans {
			launch.ReapOrphans()
		}
		if time.Since(last) >= MaintainEvery {
			s.maintain(ctx, d)
			last = time.Now()
		}
	}
}

type supervisor struct {
	h       *home.Home
	o       ServeOptions
	wg      sync.WaitGroup
	mu      sync.Mutex
	running map[string]bool
	// known are the registered sources of the last rescan, for the added
	// and removed lines; nil before the first.
	known map[string]bool
	logMu sync.Mutex
	// starved is set from the first host fault of an episode until a pass
	// succeeds at least faultQuiet after the last host fault (lastFault).
	starved   bool
	lastFault time.Time
}

// faultQuiet is how long an episode of host faults lasts after its last
// fault: under pressure some passes still succeed between faults, and an
// episode that ended at each of them would warn per poll again.
const faultQuiet = MaintainEvery

func (s *supervisor) log(format string, args ...any) {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	s.o.Log(fmt.Sprintf(format, args...))
}

// failed logs a failure of what, or, for a host fault, warns once at the
// start of its episode: while the host is out of files, disk, memory or
// processes every source fails the same way, and a line per poll would be
// noise. It reports whether err was a host fault.
func (s *supervisor) failed(what string, err error) bool {
	if !errcode.Is(err, errcode.HostResource) {
		s.log("failed: %s (%s): %v", what, errcode.Of(err), err)
		return false
	}
	s.logMu.Lock()
	defer s.logMu.Unlock()
	s.lastFault = time.Now()
	if !s.starved {
		s.starved = true
		s.o.Warn(fmt.Sprintf("host-resource: %s: %v; backing off and retrying (raise the limit: ulimit -n, free disk or memory)", what, err))
	}
	return true
}

// recovered ends an episode of host faults.
func (s *supervisor) recovered() {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	if s.starved && time.Since(s.lastFault) >= faultQuiet {
		s.starved = false
		s.o.Warn("host-resource: recovered; polling again")
	}
}

// maintain resolves dead runners' groups, removes the temps of killed
// writers (temps.go) and re-announces; failures are logged and retried at
// the next maintenance.
func (s *supervisor) maintain(ctx context.Context, d *dirs) {
	n, err := cleanupDead(s.h)
	if n > 0 {
		s.log("cleaned-invocations: %d", n)
	}
	if err != nil {
		s.failed("cleanup", err)
	}
	if _, err := sweepTemps(s.h); err != nil {
		s.failed("sweep temps", err)
	}
	// The inbox is pinned afresh by every maintenance: a pin kept for the
	// life of serve would hold an inbox replaced since, and every
	// re-announce would then be refused against the new one.
	d.unpinInbox()
	if n, err := d.reannounce(ctx, s.o.Reannounce); err != nil {
		s.failed("re-announce", err)
	} else if n > 0 {
		s.log("reannounced: %d", n)
	}
	if fi, err := os.Lstat(s.h.WakeQueue()); err == nil && fi.Size() > AutoCompactBytes {
		if res, err := CompactWakes(ctx, s.h, DefaultCompactWindow); err != nil {
			s.log("failed: compact wakes (%s): %v", errcode.Of(err), err)
		} else {
			s.log("compacted-wakes: kept=%d dropped=%d", res.Kept, res.Dropped)
		}
	}
}

// rescan starts a goroutine for every registered source that has none.
func (s *supervisor) rescan(ctx context.Context, d *dirs) {
	ids, err := sourceIDs(d.reg)
	if err != nil {
		s.failed("rescan", err)
		return
	}
	s.noteChanges(ids)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if s.running[id] || ctx.Err() != nil {
			continue
		}
		s.running[id] = true
		s.wg.Go(func() {
			s.source(ctx, id)
			s.mu.Lock()
			delete(s.running, id)
			s.mu.Unlock()
		})
	}
}

// source polls one source until it is retired or ctx is done. The delay
// after a pass is MinGap; after a failure (an error, captured evidence, or
// a failure collapsed into its run [OP-5]) it backs off from 2*MinGap,
// doubling up to MaxBackoff; a success resets it. The runner records the
// time of the next poll in the source's status file [STAT-1].
func (s *supervisor) source(ctx context.Context, id string) {
	var backoff time.Duration
	delay := func(failed bool) time.Duration {
		if failed {
			backoff = min(max(2*s.o.MinGap, 2*backoff), s.o.MaxBackoff)
		} else {
			backoff = 0
		}
		return max(s.o.MinGap, backoff)
	}
	for {
		wait := time.Duration(-1)
		out, err := start(ctx, s.h, id, supervision{collapse: true, next: func(failed bool) time.Duration { wait = delay(failed); return wait }})
		if ctx.Err() != nil {
			return
		}
		failed := err != nil || out.Evidence || out.Status == Collapsed
		switch {
		case errcode.Is(err, errcode.SourceMissing):
			return
		case errors.Is(err, errStopped):
			s.log("stopped: %s (a retire stopped its poll)", id)
			failed = false
		case err != nil:
			s.failed(id, err)
		case out.Evidence:
			// The failure was captured as evidence: say where, then why
			// in the host's words (the evidence's code and detail).
			s.log("%s\nfailed: %s (%s): %v", out.Line(), id, errcode.Of(out.Failure), out.Failure)
		case out.Status == Captured, out.Status == Collapsed:
			s.log("%s", out.Line())
		}
		if out != nil {
			for _, c := range out.CheckLines() {
				s.log("%s", c)
			}
		}
		if err == nil {
			s.recovered()
		}
		if wait < 0 { // the pass ended before its claim: not recorded
			wait = delay(failed)
		}
		if out != nil && out.Retired {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// Report is what one reconcile cycle did.
type Report struct {
	Outcomes    []*Outcome       // per polled source, in source-id order
	Failures    map[string]error // per source whose pass failed
	Cleaned     int              // owner records of dead runners resolved
	Reannounced int
}

// Reconcile runs one supervision cycle and returns ([RUN-2]): resolve the
// groups dead runners left, remove the temps of killed writers (temps.go),
// re-announce unhandled results, then poll every
// registered source once, concurrently (a source whose claim is held reports
// AlreadyOwned). A home with no registry has nothing to do and gets nothing
// created. A failure of one source does not stop the others.
func Reconcile(ctx context.Context, h *home.Home, o ServeOptions) (*Report, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	rep := &Report{Failures: map[string]error{}}
	d, err := openDirs(h, false, false)
	if err == errAbsent {
		return rep, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.close()
	// A group that stays unproven here refuses only its own source's poll
	// (Start checks again), so its error is reported there, per source.
	rep.Cleaned, _ = cleanupDead(h)
	if _, err := sweepTemps(h); err != nil {
		return nil, err
	}
	if rep.Reannounced, err = d.reannounce(ctx, o.Reannounce); err != nil {
		return nil, err
	}
	if d.reg == nil {
		return rep, nil // no registry: results to re-announce, no source to poll
	}
	ids, err := sourceIDs(d.reg)
	if err != nil {
		return nil, err
	}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	ctx = launch.WithGate(ctx, launch.NewGate(launch.GateSize()))
	for _, id := range ids {
		wg.Go(func() {
			out, err := start(ctx, h, id, supervision{collapse: true})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errcode.Is(err, errcode.SourceMissing):
			case err != nil:
				rep.Failures[id] = err
			default:
				rep.Outcomes = append(rep.Outcomes, out)
			}
		})
	}
	wg.Wait()
	sort.Slice(rep.Outcomes, func(i, j int) bool { return rep.Outcomes[i].SourceID < rep.Outcomes[j].SourceID })
	return rep, nil
}
