// Package homeimport moves a home of the earlier Firstmate implementation
// (its Node host and bash runner) onto fm, in place: `fm home import`
// ([HOME-4]). Most of such a home is already fm's (bindings, the package
// store, transfer envelopes, wake lines); what differs is converted here:
//
//   - registrations state/procevent/<id>.source in the text format become
//     fm's JSON records with the same adapter, argv or extension identity,
//     config reference and registration token ([REG-2], [REG-4]);
//   - a captured result's owner sidecars (<id>.<seq>.adapter, .extension,
//     .generation) become its .meta.json, with exactly the sidecars'
//     identity ([CAP-1], [CAP-4]); the result's bytes and sequence are never
//     touched; an empty handled marker becomes fm's marker ([CAP-3]); each
//     source's sequence counter is raised to the highest sequence any
//     evidence in the home says was used (evidence.go: inbox names, wake
//     queue keys, watcher markers), so no sequence is used twice;
//   - the wake queue is kept, made 0600, and its queue-seq high-water mark is
//     kept at or above every queue-seq in it ([WAKE-1]); nothing is announced;
//   - a received transfer's receipt of the earlier schema becomes fm's
//     receipt, whose embedded manifest is rebuilt from the staged package
//     and must give exactly the receipt's digests ([XFER-6]);
//   - the earlier implementation's runtime files (dead runners' pid files,
//     outputs, leases, markers, its stale locks, .wake-queue.lock and the
//     watcher's .seen-procevent-* markers) are removed: fm has no use for
//     them, and they would only mislead;
//   - directories fm keeps private are made 0700 and its files 0600.
//
// # Order and crashes
//
// Nothing changes before every check has passed: nothing of the earlier
// implementation (or of fm) may run (busy.go), every file to convert is one
// regular file the user owns and parses, and every transfer unit matches its
// receipt. The plan is made under fm's lifecycle lock ([LIFE-1]); when it
// writes procevent records, serve's lock is taken (without waiting: home-busy)
// after the checks and before the first change, and held to the end, since
// serve takes no lifecycle lock. Then, in this order, each step durable
// before the next:
//
//  1. modes (chmod in place: nothing is replaced), files first and the wake
//     queue first of all, so fm wake reads the queue from the first step on;
//  2. the journal data/imported/.current and the run directory;
//  3. the wake queue's high-water mark;
//  4. receipts, each copied to the run, then replaced by rename;
//  5. results: the meta is created (never replacing), then the sidecars are
//     copied and removed; handled markers copied and replaced by rename;
//     counters raised;
//  6. registrations, each copied, then replaced by rename;
//  7. runtime files and markers, copied, then removed; the import's own
//     temporary files of an interrupted run removed;
//  8. the journal removed.
//
// Every state a crash can leave is one fm reads correctly, or one its
// readers detect and refuse with home-import-needed ([LIFE-2]): a text
// registration, a result with sidecars but no meta, or a receipt of the
// earlier schema, each converted by one atomic rename or one create; a meta
// beside sidecars is simply fm's result (the sidecars are ignored by fm and
// removed by the re-run, which first checks they name the meta's owner). A
// handled marker exists throughout its replacement, and a counter only
// grows. Each step finds its own work again from the files, not from the
// journal, so a re-run finishes exactly what a killed run left and does
// nothing twice: the final state is the one an uninterrupted run gives
// (except for built-in registration tokens, which fm never prints).
//
// Readers that detect the earlier format: procevent's registration and meta
// readers, transfer's receipt reader, and fm doctor (Pending).
package homeimport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/lifecycle"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/internal/transfer"
	"firstmate.dev/fm/internal/wake"
)

// Line is one thing the import converted (or, dry, would convert).
type Line struct {
	Kind    string `json:"kind"`
	Subject string `json:"subject"`
	Detail  string `json:"detail"`
}

func (l Line) String() string { return l.Kind + " " + l.Subject + ": " + l.Detail }

// Report is the outcome of Import.
type Report struct {
	Home   string `json:"home"`
	DryRun bool   `json:"dry_run"`
	// Backup is the run directory holding the copies ("" when nothing was
	// replaced or removed, and in a dry run).
	Backup    string `json:"backup"`
	Lines     []Line `json:"converted"`
	Sources   int    `json:"sources"`
	Results   int    `json:"results"`
	Unhandled int    `json:"unhandled"`
	Transfers int    `json:"transfers"`
}

// Summary is the report's last line.
func (r *Report) Summary() string {
	verb := "imported"
	if r.DryRun {
		verb = "would import"
	}
	return fmt.Sprintf("%s: sources=%d results=%d unhandled=%d transfers=%d", verb, r.Sources, r.Results, r.Unhandled, r.Transfers)
}

// crashPoint, when set (by tests only), is called after every durable change
// the import makes; a test kills the process there.
var crashPoint func()

// beforeChange, when set (by tests only), is called once every check has
// passed, right before the import takes serve's lock and changes anything.
var beforeChange func()

// Import converts h (see the package documentation). With dryRun it changes
// nothing and reports what it would do. A home with nothing of the earlier
// implementation left is not touched. The wait for the lifecycle lock ends
// with ctx.
func Import(ctx context.Context, h *home.Home, dryRun bool) (*Report, error) {
	if err := idle(h); err != nil {
		return nil, err
	}
	p, err := scan(h)
	if err != nil {
		return nil, err
	}
	if p.pastBound != nil {
		return nil, p.pastBound
	}
	if dryRun || !p.todo() {
		rep := p.report()
		rep.DryRun = dryRun
		return rep, nil
	}
	lock, err := lifecycle.Acquire(ctx, h)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	// Again under the lock: what was checked before may have changed.
	if err := idle(h); err != nil {
		return nil, err
	}
	if p, err = scan(h); err != nil {
		return nil, err
	}
	if p.pastBound != nil {
		return nil, p.pastBound
	}
	rep := p.report()
	if !p.todo() { // another import finished it meanwhile
		return rep, nil
	}
	if err := p.execute(rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// Pending describes, one line per kind, what of the earlier implementation h
// still holds; none means there is nothing to import. It only reads.
func Pending(h *home.Home) ([]string, error) {
	p, err := scan(h)
	if err != nil {
		return nil, err
	}
	return p.pending(), nil
}

// plan is what one import does, found by scan.
type plan struct {
	h       *home.Home
	journal string // the run of an interrupted import, or ""

	dirs, files []modeFix
	mark        *markFix
	receipts    []receiptFix
	results     []resultFix
	sidecars    []string // of results that have their meta
	handled     []string // empty handled markers
	counters    []counterFix
	high        map[string]int64 // source id -> highest sequence used (evidence.go)
	pastBound   error            // the first evidence of a sequence past the bound (evidence.go)
	sources     []sourceFix
	removals    []string // runtime files and markers
	temps       []string // the import's own, of an interrupted run
	warnings    []Line

	im *procevent.Importer // while execute writes procevent records
}

type modeFix struct {
	path     string
	from, to uint32
}

type markFix struct {
	path     string
	from, to int64
	exists   bool
}

type receiptFix struct {
	unit, id, version, digest string
	data                      []byte
}

type resultFix struct {
	meta    *procevent.Meta
	handled bool
	names   []string // its sidecars
}

type counterFix struct {
	id       string
	from, to int64
}

type sourceFix struct {
	reg *procevent.Registration
}

func (p *plan) legacy() bool {
	return len(p.pending()) > 0
}

// todo reports whether an import has anything to change: the earlier
// implementation's files, or a counter below the evidence of a used
// sequence (a home imported before the queue and markers were read as
// evidence).
func (p *plan) todo() bool {
	return p.legacy() || len(p.counters) > 0
}

func (p *plan) pending() []string {
	var out []string
	add := func(n int, what string) {
		if n > 0 {
			out = append(out, fmt.Sprintf("%d %s", n, what))
		}
	}
	if p.journal != "" {
		out = append(out, "an interrupted import (data/imported/"+journalName+")")
	}
	add(len(p.sources), "registration(s) in the earlier text format")
	add(len(p.results), "captured result(s) without .meta.json")
	add(len(p.sidecars)+len(p.handled), "owner sidecar(s) or empty handled marker(s)")
	add(len(p.receipts), "transfer receipt(s) of the earlier schema")
	add(len(p.removals), "runtime file(s) of the earlier implementation")
	return out
}

// report is the report of p before it runs: its lines and counts.
func (p *plan) report() *Report {
	rep := &Report{Home: p.h.Dir, Lines: []Line{}}
	add := func(kind, subject, format string, args ...any) {
		rep.Lines = append(rep.Lines, Line{kind, subject, fmt.Sprintf(format, args...)})
	}
	for _, m := range slices.Concat(p.files, p.dirs) {
		add("mode", display(p.h, m.path), "%04o -> %04o", m.from, m.to)
	}
	if m := p.mark; m != nil {
		add("wake", display(p.h, m.path), "queue-seq high-water mark %d (was %d); nothing announced", m.to, m.from)
	}
	for _, r := range p.receipts {
		add("transfer", r.id+"@"+r.version, "%s: receipt converted, manifest rebuilt from the staged package", r.digest)
		rep.Transfers++
	}
	for _, r := range p.results {
		state := "unhandled"
		if r.handled {
			state = "handled"
		} else {
			rep.Unhandled++
		}
		add("result", fmt.Sprintf("%s.%d", r.meta.SourceID, r.meta.Sequence), "%s %s, %s", r.meta.Adapter, r.meta.Owner(), state)
		rep.Results++
	}
	for _, n := range p.handled {
		add("handled", display(p.h, n), "marker converted")
	}
	for _, c := range p.counters {
		add("counter", c.id, "next sequence %d (counter %d -> %d)", c.to+1, c.from, c.to)
	}
	for _, s := range p.sources {
		kept := "registration token kept"
		if !s.reg.External() {
			kept = "argv kept"
		}
		add("source", s.reg.SourceID, "%s from %s, %s", s.reg.Adapter, s.reg.Owner(), kept)
		rep.Sources++
	}
	rep.Lines = append(rep.Lines, p.warnings...)
	for _, n := range p.removals {
		add("removed", display(p.h, n), "runtime file of the earlier implementation")
	}
	return rep
}

// fileCheck refuses what cannot be made a private file of the user: a link,
// anything but a regular file, another owner, more than one hard link.
func fileCheck(path string) (*unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "stat %s", path)
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return nil, errcode.New(errcode.LinkUnsafe, "%s is a symlink where fm keeps a file; replace it with the file itself, then run fm home import again", path)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, errcode.New(errcode.PathUnsafe, "%s is not a regular file; move it aside, then run fm home import again", path)
	case int(st.Uid) != os.Geteuid():
		return nil, errcode.New(errcode.OwnerMismatch, "%s is owned by uid %d, not by you (uid %d): chown it, or run the import as its owner", path, st.Uid, os.Geteuid())
	case st.Nlink == 0: // removed as it was looked at
		return nil, &os.PathError{Op: "stat", Path: path, Err: fs.ErrNotExist}
	case st.Nlink != 1:
		return nil, errcode.New(errcode.LinkUnsafe, "%s has %d hard links; fm needs exactly one: remove the other names, then run fm home import again", path, st.Nlink)
	}
	return &st, nil
}

// dirCheck refuses what cannot be made a private directory of the user.
func dirCheck(path string) (*unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "stat %s", path)
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return nil, errcode.New(errcode.LinkUnsafe, "%s is a symlink where fm keeps a directory; replace it with the directory itself, then run fm home import again", path)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return nil, errcode.New(errcode.PathUnsafe, "%s is not a directory; move it aside, then run fm home import again", path)
	case int(st.Uid) != os.Geteuid():
		return nil, errcode.New(errcode.OwnerMismatch, "%s is owned by uid %d, not by you (uid %d): chown it, or run the import as its owner", path, st.Uid, os.Geteuid())
	}
	return &st, nil
}

// private checks a file (or, with dir, a directory) and plans its mode.
func (p *plan) private(path string, dir bool) (*unix.Stat_t, error) {
	check, want, list := fileCheck, uint32(0o600), &p.files
	if dir {
		check, want, list = dirCheck, 0o700, &p.dirs
	}
	st, err := check(path)
	if err != nil {
		return nil, err
	}
	if st.Mode&0o7777 != want {
		*list = append(*list, modeFix{path, st.Mode & 0o7777, want})
	}
	return st, nil
}

// gone reports an entry that was listed but is no longer there: a fm
// home's running serve removes pending markers and retires registrations
// while a scan (fm doctor's) reads the directory, and what is gone is
// nothing to import. An import itself runs with no writer left.
func gone(err error) bool { return errors.Is(err, fs.ErrNotExist) }

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// scan reads h and plans the import; it changes nothing. Every refusal is
// made here, before anything changes.
func scan(h *home.Home) (*plan, error) {
	p := &plan{h: h}
	if err := p.scanImported(); err != nil {
		return nil, err
	}
	if !exists(h.State) {
		return p, p.scanReceipts()
	}
	if _, err := p.private(h.State, true); err != nil {
		return nil, err
	}
	for _, d := range []string{h.Registrations(), h.Inbox(), h.Invocations(), filepath.Join(h.State, "extensions")} {
		if exists(d) {
			if _, err := p.private(d, true); err != nil {
				return nil, err
			}
		}
	}
	names, err := readNames(filepath.Join(h.State, "extensions"))
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, err := p.private(filepath.Join(h.State, "extensions", n), true); err != nil {
			return nil, err
		}
	}
	for _, step := range []func() error{p.scanState, p.scanReceipts, p.scanInbox, p.scanRegistry, p.planCounters} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	// What is removed is first kept by copy (keep): anything that cannot be
	// copied is refused now, before anything changes.
	for _, r := range p.removals {
		err := filepath.WalkDir(r, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return errcode.Wrap(errcode.Internal, err, "read %s", path)
			}
			return keepable(path, d.Type())
		})
		if err != nil {
			return nil, err
		}
	}
	if !p.legacy() {
		// A home of fm's: its modes are fm doctor's business, not the
		// import's.
		p.dirs, p.files, p.mark = nil, nil, nil
	}
	return p, nil
}

// scanImported checks where the import keeps its copies (data/, data/imported
// and the run an interrupted import names) before anything changes: openRun
// would refuse them only after the modes were already changed. The journal
// is read here too.
func (p *plan) scanImported() error {
	dir := imported(p.h)
	if data := filepath.Dir(dir); exists(data) {
		if err := home.CheckPrivate(data, false); err != nil {
			return err
		}
	}
	if !exists(dir) {
		return nil
	}
	if _, err := p.private(dir, true); err != nil {
		return err
	}
	var err error
	if p.journal, err = readJournal(p.h); err != nil || p.journal == "" {
		return err
	}
	if run := filepath.Join(dir, p.journal); exists(run) {
		_, err = p.private(run, true)
	}
	return err
}

// scanState plans the wake queue, its mark, and the markers beside it.
func (p *plan) scanState() error {
	s := p.h.State
	names, err := readNames(s)
	if err != nil {
		return err
	}
	for _, n := range names {
		switch {
		case strings.HasPrefix(n, markerPrefix):
			p.sawMarker(n, "watcher marker "+filepath.Join(s, n))
			p.removals = append(p.removals, filepath.Join(s, n))
		case n == ".wake-queue.lock":
			p.removals = append(p.removals, filepath.Join(s, n))
		case ownTemp(s, n):
			p.temps = append(p.temps, filepath.Join(s, n))
		}
	}
	queue := p.h.WakeQueue()
	var high int64
	if exists(queue) {
		if _, err := p.private(queue, false); err != nil {
			return err
		}
		if high, err = highestWake(queue); err != nil {
			return err
		}
		if err := p.scanQueue(queue); err != nil {
			return err
		}
	}
	// The mark is made private even when its value stays: wake.Append
	// reads it on every append.
	if path := filepath.Join(s, wake.MarkName); exists(path) {
		if _, err := p.private(path, false); err != nil {
			return err
		}
	}
	p.mark, err = wakeMark(s, high)
	return err
}

// highestWake is the highest queue-seq of the queue: that of its last
// well-formed line (wake.LastSeq reads only the tail, so fm doctor's look at
// a home with a long history stays cheap).
func highestWake(queue string) (int64, error) {
	f, err := fsutil.OpenNoFollow(queue)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return wake.LastSeq(f)
}

// wakeMark plans the high-water mark (wake.MarkName) in the state root s: at
// least its present value and at least high, the highest queue-seq in the
// queue. wake.Append takes it as a floor, so the next wake fm appends takes
// a queue-seq above every one the earlier implementation issued, even those
// no longer in the queue (it kept the same file, in the same format). nil:
// nothing to change.
func wakeMark(s string, high int64) (*markFix, error) {
	path := filepath.Join(s, wake.MarkName)
	m := &markFix{path: path}
	data, err := readSmall(path)
	switch {
	case err == nil:
		n, perr := wake.ParseMark(path, string(data))
		if perr != nil {
			return nil, perr
		}
		m.from, m.exists = n, true
	case os.IsNotExist(err):
		if high == 0 {
			return nil, nil
		}
	default:
		return nil, err
	}
	m.to = max(m.from, high)
	if m.exists && m.to == m.from {
		return nil, nil
	}
	return m, nil
}

func (m *markFix) data() []byte { return wake.FormatMark(m.to) }

// scanReceipts plans every unit of staging with a receipt of the earlier
// schema.
func (p *plan) scanReceipts() error {
	staging := p.h.Staging()
	ids, err := readNames(staging)
	if err != nil {
		return err
	}
	for _, id := range ids {
		versions, err := readNames(filepath.Join(staging, id))
		if err != nil {
			return err
		}
		for _, v := range versions {
			vdir := filepath.Join(staging, id, v)
			units, err := readNames(vdir)
			if err != nil {
				return err
			}
			for _, u := range units {
				unit := filepath.Join(vdir, u)
				if ownTemp(vdir, u) {
					p.temps = append(p.temps, unit)
					continue
				}
				if err := p.scanUnit(unit, id, v); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (p *plan) scanUnit(unit, id, version string) error {
	path := filepath.Join(unit, transfer.ReceiptFile)
	if !exists(path) {
		return nil
	}
	if _, err := fileCheck(path); err != nil {
		return err
	}
	data, err := readSmall(path)
	if err != nil {
		return err
	}
	if !transfer.IsLegacyReceipt(data) {
		return nil
	}
	out, err := transfer.ConvertReceipt(unit, data)
	if err != nil {
		return err
	}
	for _, d := range []string{p.h.Staging(), filepath.Dir(filepath.Dir(unit)), filepath.Dir(unit), unit} {
		if _, err := p.private(d, true); err != nil {
			return err
		}
	}
	p.receipts = append(p.receipts, receiptFix{unit: unit, id: id, version: version, digest: "sha256:" + filepath.Base(unit), data: out})
	return nil
}

// scanInbox plans the results, sidecars, handled markers and counters.
func (p *plan) scanInbox() error {
	inbox := p.h.Inbox()
	names, err := readNames(inbox)
	if err != nil {
		return err
	}
	sort.Strings(names)
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	key := func(id string, seq int64, suffix string) string {
		return id + "." + strconv.FormatInt(seq, 10) + suffix
	}
	for _, n := range names {
		p.sawEntry(n)
		id, seq, suffix, ok := splitName(n)
		if !ok {
			if strings.HasSuffix(n, resultSuffix) {
				p.warnings = append(p.warnings, Line{"ignored", display(p.h, filepath.Join(inbox, n)), "not a result name fm reads (<source-id>.<seq>.result, seq 1 or more without a leading zero); left as it is, not in fm's inbox"})
			}
			continue
		}
		path := filepath.Join(inbox, n)
		st, err := p.private(path, false)
		if gone(err) {
			continue
		}
		if err != nil {
			return err
		}
		switch suffix {
		case resultSuffix:
			if have[key(id, seq, metaSuffix)] || seq > procevent.MaxSeq { // past the bound: p.pastBound
				continue
			}
			r, err := p.legacyResult(id, seq, st, have)
			if err != nil {
				return err
			}
			p.results = append(p.results, *r)
		case handledSuffix:
			if st.Size == 0 {
				p.handled = append(p.handled, path)
			}
		case adapterSuffix, extensionSuffix, generationSuffix:
			switch {
			case !have[key(id, seq, resultSuffix)]:
				p.sidecars = append(p.sidecars, path) // of no result: nothing to convert
			case have[key(id, seq, metaSuffix)]:
				if suffix == adapterSuffix {
					if err := p.checkLeftover(id, seq, have); err != nil {
						return err
					}
				}
				p.sidecars = append(p.sidecars, path)
			}
		}
	}
	return nil
}

// planCounters plans raising the counter of every source whose evidence
// (p.high) is above it.
func (p *plan) planCounters() error {
	ids := make([]string, 0, len(p.high))
	for id := range p.high {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		from, err := p.readCounter(id)
		if errcode.Is(err, errcode.SequenceExhausted) {
			p.pastBound = cmp.Or(p.pastBound, err) // a counter past the bound: as evidence past it
			continue
		}
		if err != nil {
			return err
		}
		if from < p.high[id] {
			p.counters = append(p.counters, counterFix{id, from, p.high[id]})
		}
	}
	return nil
}

// legacyResult plans the meta of a result that has none, from its
// sidecars.
func (p *plan) legacyResult(id string, seq int64, st *unix.Stat_t, have map[string]bool) (*resultFix, error) {
	base := filepath.Join(p.h.Inbox(), id+"."+strconv.FormatInt(seq, 10))
	m, err := p.owner(id, seq, have)
	if err != nil {
		return nil, err
	}
	// The capture time is the result's modification time: the file was
	// written once, at capture, and never since.
	m.CapturedAt = st.Mtim.Sec
	r := &resultFix{meta: m, handled: have[filepath.Base(base)+handledSuffix]}
	for _, s := range sidecars {
		if have[filepath.Base(base)+s] {
			r.names = append(r.names, base+s)
		}
	}
	return r, nil
}

// owner reads the sidecars of id.seq into a meta.
func (p *plan) owner(id string, seq int64, have map[string]bool) (*procevent.Meta, error) {
	base := id + "." + strconv.FormatInt(seq, 10)
	what := "captured result " + filepath.Join(p.h.Inbox(), base+resultSuffix)
	if !have[base+adapterSuffix] {
		return nil, errcode.New(errcode.SchemaInvalid, "%s has neither %s nor %s, so its owner is unknown: move it aside, then run fm home import again", what, metaSuffix, adapterSuffix)
	}
	adapter, err := readSmall(filepath.Join(p.h.Inbox(), base+adapterSuffix))
	if err != nil {
		return nil, err
	}
	var ext []byte
	if have[base+extensionSuffix] {
		if ext, err = readSmall(filepath.Join(p.h.Inbox(), base+extensionSuffix)); err != nil {
			return nil, err
		}
	}
	m := &procevent.Meta{Schema: procevent.MetaSchema, SourceID: id, Sequence: seq}
	if err := parseOwner(adapter, ext, have[base+extensionSuffix], m, what); err != nil {
		return nil, err
	}
	return m, nil
}

// checkLeftover proves that the sidecars left beside a meta (a run killed
// after it created the meta) name exactly the meta's owner before they are
// removed.
func (p *plan) checkLeftover(id string, seq int64, have map[string]bool) error {
	want, err := p.owner(id, seq, have)
	if err != nil {
		return err
	}
	path := filepath.Join(p.h.Inbox(), id+"."+strconv.FormatInt(seq, 10)+metaSuffix)
	data, err := readSmall(path)
	if err != nil {
		return err
	}
	var got procevent.Meta
	if err := strictjson.Decode(data, 4096, "result meta "+path, &got); err != nil {
		return err
	}
	want.CapturedAt, want.Evidence = got.CapturedAt, got.Evidence
	if got != *want {
		return errcode.New(errcode.IntegrityMismatch, "result meta %s does not name the owner its sidecars name; inspect both, then move the wrong one aside", path)
	}
	return nil
}

// readCounter reads the sequence counter of source id (0 when absent) by
// fm's own rule (procevent.ParseCounter).
func (p *plan) readCounter(id string) (int64, error) {
	path := filepath.Join(p.h.Registrations(), id+".seq")
	data, err := readSmall(path)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return procevent.ParseCounter(id, path, data)
}

// runtime reports whether n is a runtime file the earlier implementation
// left in its registry.
func runtime(n string) bool {
	dotted := strings.HasPrefix(n, ".")
	return strings.HasSuffix(n, ".runner") || strings.HasSuffix(n, ".last-launch") || n == ".owner-lease" || n == lifecycleLockName ||
		dotted && (strings.HasSuffix(n, ".output") || strings.HasSuffix(n, ".stranded") || strings.HasSuffix(n, ".launch-failed"))
}

// scanRegistry plans the registrations and the runtime files.
func (p *plan) scanRegistry() error {
	reg := p.h.Registrations()
	names, err := readNames(reg)
	if err != nil {
		return err
	}
	sort.Strings(names)
	var bs []*binding.Binding
	loaded := false
	for _, n := range names {
		path := filepath.Join(reg, n)
		if runtime(n) {
			if n == lifecycleLockName {
				p.lockOwner(path) // first: a re-run finds it only through the link
			}
			p.removals = append(p.removals, path)
			continue
		}
		id, ok := strings.CutSuffix(n, ".source")
		if !ok {
			if strings.HasSuffix(n, ".seq") || strings.HasSuffix(n, ".claim") || strings.HasSuffix(n, ".stop") || n == "serve.lock" {
				if _, err := p.private(path, false); err != nil && !gone(err) {
					return err
				}
			}
			continue
		}
		_, err := p.private(path, false)
		var data []byte
		if err == nil {
			data, err = readSmall(path)
		}
		if gone(err) {
			continue
		}
		if err != nil {
			return err
		}
		if !procevent.LegacyRegistration(data) {
			continue
		}
		r, err := parseSource(data, id, path)
		if err != nil {
			return err
		}
		s := sourceFix{reg: r}
		if r.External() {
			if !loaded {
				if bs, err = binding.Load(p.h); err != nil {
					return err
				}
				loaded = true
			}
			b, _ := binding.Find(bs, r.ExtensionID)
			if b == nil || b.Digest != r.BindingDigest {
				p.warnings = append(p.warnings, Line{"unbound", id, fmt.Sprintf("binding %s of %s is no longer enabled; imported as it is: restore that binding, or retire the source with fm procevent retire %s --if-owner <its token>", r.BindingDigest, r.Owner(), id)})
			}
		}
		p.sources = append(p.sources, s)
	}
	return nil
}

// lockOwner plans the removal of the owner directory a stale lock of the
// earlier implementation points to, only when it is what such an owner
// directory is: a real directory beside the lock, holding nothing but its
// pid file. Anything else the link may name (the registry itself, say) is
// left alone.
func (p *plan) lockOwner(lock string) {
	target, err := os.Readlink(lock)
	if err != nil {
		return
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(lock), target)
	}
	target = filepath.Clean(target)
	if filepath.Dir(target) != filepath.Dir(lock) || target == lock {
		return
	}
	if _, err := dirCheck(target); err != nil {
		return
	}
	if names, err := readNames(target); err != nil || len(names) > 1 || len(names) == 1 && names[0] != "pid" {
		return
	}
	p.removals = append(p.removals, target)
}

// execute runs the plan in the order of the package documentation.
func (p *plan) execute(rep *Report) error {
	point := func() {
		if crashPoint != nil {
			crashPoint()
		}
	}
	if beforeChange != nil {
		beforeChange()
	}
	// Serve's lock is held from before the first change, and only when there
	// are procevent records to write: serve takes no lifecycle lock, and
	// would otherwise start between the checks and the first change.
	writes := len(p.results)+len(p.handled)+len(p.counters)+len(p.sources) > 0
	var serve *procevent.ServeLock
	if writes {
		var err error
		if serve, err = procevent.LockServe(p.h); err != nil {
			return err
		}
		defer serve.Close()
	}
	// A package that worked in the earlier implementation ran with the
	// user's full rights: the imported home keeps running it so, until the
	// operator chooses (doctor suggests enforce) [CONF-2]. The first change,
	// so that an interrupted import has already made it.
	if _, set, err := confine.ReadMode(p.h.Config()); err != nil {
		return err
	} else if !set {
		if err := confine.WriteMode(p.h.Config(), confine.Off); err != nil {
			return err
		}
	}
	for _, m := range slices.Concat(p.files, p.dirs) {
		if err := os.Chmod(m.path, os.FileMode(m.to)); err != nil {
			return errcode.Wrap(errcode.Internal, err, "chmod %s", m.path)
		}
		point()
	}
	run, err := openRun(p.h)
	if err != nil {
		return err
	}
	rep.Backup = run
	point()
	// The records are written through directories pinned once they pass
	// fm's rules.
	if writes {
		im, err := procevent.OpenImporter(p.h, serve)
		if err != nil {
			return err
		}
		defer im.Close()
		p.im = im
	}
	// keepThen copies path to the run, then does change.
	keepThen := func(path string, change func() error) error {
		if err := keep(p.h, run, path); err != nil {
			return err
		}
		point()
		if err := change(); err != nil {
			return err
		}
		point()
		return nil
	}
	if m := p.mark; m != nil {
		change := func() error { return replaceFile(p.h.State, m.path, m.data()) }
		if !m.exists {
			if err := change(); err != nil {
				return err
			}
			point()
		} else if err := keepThen(m.path, change); err != nil {
			return err
		}
	}
	for _, r := range p.receipts {
		path := filepath.Join(r.unit, transfer.ReceiptFile)
		if err := keepThen(path, func() error { return replaceFile(filepath.Dir(r.unit), path, r.data) }); err != nil {
			return err
		}
	}
	remove := func(path string) error { return keepThen(path, func() error { return removePath(path) }) }
	for _, r := range p.results {
		if err := p.im.PublishMeta(r.meta); err != nil {
			return err
		}
		point()
		for _, n := range r.names {
			if err := remove(n); err != nil {
				return err
			}
		}
	}
	for _, n := range p.sidecars {
		if err := remove(n); err != nil {
			return err
		}
	}
	for _, n := range p.handled {
		id, seq, _, _ := splitName(filepath.Base(n))
		if err := keepThen(n, func() error { return p.im.PublishHandled(id, seq) }); err != nil {
			return err
		}
	}
	for _, c := range p.counters {
		if err := p.im.RaiseCounter(c.id, c.to); err != nil {
			return err
		}
		point()
	}
	for _, s := range p.sources {
		path := filepath.Join(p.h.Registrations(), s.reg.SourceID+".source")
		if err := keepThen(path, func() error { return p.im.PublishRegistration(s.reg) }); err != nil {
			return err
		}
	}
	for _, n := range p.removals {
		if err := remove(n); err != nil {
			return err
		}
	}
	for _, n := range p.temps {
		if err := removePath(n); err != nil {
			return err
		}
		point()
	}
	return closeRun(p.h)
}
