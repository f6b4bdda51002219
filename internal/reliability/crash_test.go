package reliability

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/transfer"
)

// The crash kinds: each is one fm command that is SIGKILLed at a random
// point, then the home is checked and the next command must resolve what it
// left.
const (
	kBind           = "bind"
	kRegister       = "register-extension"
	kStart          = "start"
	kServe          = "serve"
	kRetire         = "retire"
	kRetireBinding  = "retire-binding"
	kReceive        = "receive-transfer-bind"
	kRetireTransfer = "retire-transfer"
)

var crashKinds = []string{kBind, kRegister, kStart, kServe, kRetire, kRetireBinding, kReceive, kRetireTransfer}

// serveSpan is the window in which serve, which never ends by itself, is
// killed.
const serveSpan = time.Second

const (
	xferID      = "org.example.xfer"
	xferAdapter = "xfer"
)

// envInt reads a positive integer from the environment, or def.
func envInt(t testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q is not a positive integer", name, v)
	}
	return n
}

// TestCrashInjection SIGKILLs fm at randomized points (FM_CRASH_POINTS, at
// least 200 effective kills: the process died of the signal, not before it)
// in every mutating command: bind, register-extension, the runner during
// capture (start with a package that answers at once), serve, retire,
// retire-binding, receive-transfer-bind and retire-transfer. Each kill comes
// after a random delay, uniform over the command's measured duration (serve:
// over its first second), so every phase is hit; the seed is printed and
// FM_CRASH_SEED replays the same delays. After every kill:
//
//   - no partial or duplicated binding: the registry loads or is absent, so
//     no half file and no second record is there ([BND-4], [BIND-6]), and a
//     retired binding is enabled or retained, never lost ([LIFE-2], [XFER-6]);
//   - no capture lost after it was reported: every "captured: <path>" a
//     killed command printed is on disk with its meta, every wake names a
//     captured result, and a result never changes ([CAP-1], [CAP-2]);
//   - no sequence reused: every captured result holds the output of the
//     poll with exactly its sequence's request id, no path is reported twice,
//     and the next capture takes a sequence above every one in the inbox
//     ([CAP-1], [RID-1]);
//   - no live orphan group: fm extension cleanup-invocations exits 0 and
//     leaves no owner record, every group recorded before it is gone, and no
//     process of the home's packages is alive ([GRP-3], [GRP-4]);
//   - every left-over is resolved by the next command: the same command run
//     again completes (or reports that the killed one already did).
func TestCrashInjection(t *testing.T) {
	t.Parallel()
	points := envInt(t, "FM_CRASH_POINTS", 200)
	workers := envInt(t, "FM_CRASH_WORKERS", 2)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FM_CRASH_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("FM_CRASH_SEED=%q: %v", s, err)
		}
	}
	t.Logf("crash seed %d (replay with FM_CRASH_SEED=%d)", seed, seed)
	var (
		killed atomic.Int64
		mu     sync.Mutex
		total  = newCrashStats()
	)
	start := time.Now()
	t.Run("workers", func(t *testing.T) {
		for i := range workers {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				c := newCrasher(t, seed, i, &killed)
				defer func() {
					c.stats.debris = c.debris()
					mu.Lock()
					total.add(c.stats)
					mu.Unlock()
				}()
				for cycle := 0; killed.Load() < int64(points); cycle++ {
					if cycle > points {
						t.Fatalf("seed %d: %d cycles did not reach %d effective kills", seed, cycle, points)
					}
					c.cycle()
				}
			})
		}
	})
	if t.Failed() {
		return
	}
	report := total.report(time.Since(start))
	t.Log("\n" + report)
	if testing.Verbose() {
		fmt.Print(report)
	}
}

// crashStats counts kill points per kind.
type crashStats struct {
	tried, killed map[string]int
	deciles       map[string]*[10]int       // where the effective kills fell, in tenths of the run
	outcomes      map[string]map[string]int // what each effective kill left behind
	cleaned       int                       // owner records resolved by the next cleanup
	captures      int                       // captures reported by killed or recovery commands
	debris        map[string]int            // temp files and directories of killed writers at the end, by where
}

func newCrashStats() *crashStats {
	return &crashStats{tried: map[string]int{}, killed: map[string]int{}, deciles: map[string]*[10]int{}, outcomes: map[string]map[string]int{}, debris: map[string]int{}}
}

func (s *crashStats) add(o *crashStats) {
	for _, k := range crashKinds {
		s.tried[k] += o.tried[k]
		s.killed[k] += o.killed[k]
		if o.deciles[k] != nil {
			if s.deciles[k] == nil {
				s.deciles[k] = &[10]int{}
			}
			for i, n := range o.deciles[k] {
				s.deciles[k][i] += n
			}
		}
		for name, n := range o.outcomes[k] {
			s.outcome(k, name, n)
		}
	}
	s.cleaned += o.cleaned
	s.captures += o.captures
	for where, n := range o.debris {
		s.debris[where] += n
	}
}

func (s *crashStats) outcome(kind, name string, n int) {
	if s.outcomes[kind] == nil {
		s.outcomes[kind] = map[string]int{}
	}
	s.outcomes[kind][name] += n
}

func (s *crashStats) report(took time.Duration) string {
	var b strings.Builder
	all := 0
	for _, k := range crashKinds {
		all += s.killed[k]
	}
	fmt.Fprintf(&b, "crash-injection: %d kill points, 0 invariant violations, %d owner records resolved by the next cleanup, %d captures checked, %s\n", all, s.cleaned, s.captures, took.Round(time.Second))
	for _, k := range crashKinds {
		var outs []string
		for name, n := range s.outcomes[k] {
			outs = append(outs, fmt.Sprintf("%s=%d", name, n))
		}
		sort.Strings(outs)
		d := s.deciles[k]
		if d == nil {
			d = &[10]int{}
		}
		fmt.Fprintf(&b, "  %-22s killed %3d of %3d tries; by tenth of run %v; left %s\n", k, s.killed[k], s.tried[k], d[:], strings.Join(outs, " "))
	}
	var debris []string
	for where, n := range s.debris {
		debris = append(debris, fmt.Sprintf("%s=%d", where, n))
	}
	sort.Strings(debris)
	fmt.Fprintf(&b, "  debris: temp files and directories of killed writers that remain (no command reads them): %s\n", strings.Join(debris, " "))
	return b.String()
}

// crasher is one worker: one home, cycling through every crash kind.
type crasher struct {
	*world
	seed   uint64
	id     int
	rng    *rand.Rand
	killed *atomic.Int64
	stats  *crashStats
	// calib is each kind's measured duration when not killed: the span over
	// which kill delays are drawn.
	calib    map[string]time.Duration
	pkg      string
	cycleN   int
	tokens   []string          // every generation of source "s", in order
	reported map[string]bool   // result paths printed as captured
	contents map[string]string // result path -> its bytes when first seen
	pkgDig   string
}

func newCrasher(t *testing.T, seed uint64, id int, killed *atomic.Int64) *crasher {
	c := &crasher{world: newWorld(t), seed: seed, id: id, rng: rand.New(rand.NewPCG(seed, uint64(id))), killed: killed,
		stats: newCrashStats(), calib: map[string]time.Duration{kServe: serveSpan}, reported: map[string]bool{}, contents: map[string]string{}}
	c.pkg = c.makePackage("pkg", fakeID, `["fake"]`)
	c.mode(fakeID, "invoke", "", "echo")
	c.mode(fakeID, "invoke", "slow", "signal:30")
	return c
}

// kill runs one command and SIGKILLs it after a random delay over its
// calibrated duration. A kind's first run is not killed: it calibrates.
func (c *crasher) kill(kind string, stdin []byte, args ...string) *run {
	c.t.Helper()
	span, ok := c.calib[kind]
	delay := time.Duration(-1)
	if ok {
		delay = time.Duration(c.rng.Int64N(int64(span)*11/10 + 1))
	}
	when := "after " + delay.String()
	if delay < 0 {
		when = "not sent (calibration run)"
	}
	c.note = fmt.Sprintf("seed %d worker %d cycle %d: SIGKILL of %s %s (replay with FM_CRASH_SEED=%d)", c.seed, c.id, c.cycleN, kind, when, c.seed)
	r := c.fmKill(delay, stdin, args...)
	c.stats.tried[kind]++
	switch {
	case r.killed:
		c.stats.killed[kind]++
		c.killed.Add(1)
		if c.stats.deciles[kind] == nil {
			c.stats.deciles[kind] = &[10]int{}
		}
		c.stats.deciles[kind][min(9, int(10*delay/span))]++
	case r.code != 0:
		c.failf("the unkilled run failed: %s", r)
	case kind != kServe:
		// A completed run measures the kind again.
		c.calib[kind] = (3*c.calib[kind] + r.took) / 4
		if !ok {
			c.calib[kind] = r.took
		}
	}
	c.afterCrash(kind, r)
	return r
}

// left records what an effective kill left behind.
func (c *crasher) left(r *run, kind, what string) {
	if r.killed {
		c.stats.outcome(kind, what, 1)
	}
}

// afterCrash checks the invariants, then runs the next command's cleanup.
func (c *crasher) afterCrash(kind string, r *run) {
	c.t.Helper()
	c.reportCaptures(r)
	c.invariants()
	rs := c.records()
	if r.killed && len(rs) > 0 {
		c.stats.outcome(kind, "owner-records", 1)
	}
	c.stats.cleaned += c.cleanedUp(groupsOf(rs), r.ended)
}

// reportCaptures notes every "captured: <path>" line of r: a path reported
// twice is a sequence used twice.
func (c *crasher) reportCaptures(r *run) {
	c.t.Helper()
	for _, l := range strings.Split(r.stdout, "\n") {
		p, ok := strings.CutPrefix(l, "captured: ")
		if !ok {
			continue
		}
		if c.reported[p] {
			c.failf("[CAP-1] %s was reported captured twice: a sequence was reused", p)
		}
		c.reported[p] = true
		c.stats.captures++
	}
}

// invariants checks the registry, the source registry, the inbox against
// everything reported, and the wake queue.
func (c *crasher) invariants() {
	c.t.Helper()
	c.bindings()
	c.sources()
	present := map[string]bool{}
	for _, res := range c.inbox() {
		present[res.Path] = true
		data, err := os.ReadFile(res.Path)
		if err != nil {
			c.failf("read %s: %v", res.Path, err)
		}
		if old, seen := c.contents[res.Path]; seen && old != string(data) {
			c.failf("[CAP-1] captured result %s changed", res.Path)
		} else if !seen {
			c.contents[res.Path] = string(data)
		}
		if res.SourceID != "s" || res.Evidence || res.ExtensionID != fakeID || res.PackageDigest != c.pkgDig {
			c.failf("[CAP-1] unexpected result %+v: %s", res, data)
		}
		if !c.pollOf(string(data), res.Sequence) {
			c.failf("[RID-1] result %s holds %q, the output of no poll with sequence %d", res.Path, data, res.Sequence)
		}
	}
	for p := range c.reported {
		if !present[p] {
			c.failf("[CAP-1] %s was reported captured but is not in the inbox with its meta", p)
		}
	}
	for _, wk := range c.wakes() {
		id, seq, ok := wakeResult(wk.Key)
		if !ok || !present[filepath.Join(c.h.Inbox(), fmt.Sprintf("%s.%d.result", id, seq))] {
			c.failf("[CAP-1] wake %q announces no captured result", wk.Line())
		}
	}
}

// pollOf reports whether content is the echo answer to the poll of source s
// with sequence seq under some generation of it.
func (c *crasher) pollOf(content string, seq int64) bool {
	for _, tok := range c.tokens {
		if content == pollContent("event s", "s", seq, tok, c.pkgDig) {
			return true
		}
	}
	return false
}

// wakeResult splits a wake key procevent:<id>:<seq>.
func wakeResult(key string) (string, int64, bool) {
	rest, ok := strings.CutPrefix(key, "procevent:")
	i := strings.LastIndexByte(rest, ':')
	if !ok || i < 0 {
		return "", 0, false
	}
	seq, err := strconv.ParseInt(rest[i+1:], 10, 64)
	return rest[:i], seq, err == nil
}

// maxSeq is the highest captured sequence of source id in the inbox (results
// and handled markers). The meta (and pending marker) of a capture
// interrupted before its result was published name a sequence that was not
// captured: the next capture takes it again [RID-1].
func (c *crasher) maxSeq(id string) int64 {
	ents, _ := os.ReadDir(c.h.Inbox())
	var m int64
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), id+".")
		if !ok || !(strings.HasSuffix(rest, ".result") || strings.HasSuffix(rest, ".handled")) {
			continue
		}
		if n, err := strconv.ParseInt(strings.SplitN(rest, ".", 2)[0], 10, 64); err == nil && n > m {
			m = n
		}
	}
	return m
}

// registered reads the current token of source id (a killed register may
// have published a generation without printing it).
func (c *crasher) registered(id string) string {
	for _, r := range c.sources() {
		if r.SourceID == id {
			return r.Token
		}
	}
	return ""
}

func (c *crasher) noteToken(tok string) {
	if tok != "" && (len(c.tokens) == 0 || c.tokens[len(c.tokens)-1] != tok) {
		c.tokens = append(c.tokens, tok)
	}
}

// startOnce is the next command after a crash of a runner or of serve: one
// start of s must capture, with a sequence above every one in the inbox.
func (c *crasher) startOnce() {
	c.t.Helper()
	above := c.maxSeq("s")
	r := c.ok(nil, "procevent", "start", "s")
	c.reportCaptures(r)
	p := field(r.stdout, "captured")
	want := filepath.Join(c.h.Inbox(), fmt.Sprintf("s.%d.result", above+1))
	if p != want {
		c.failf("[CAP-1] the next start captured %q, want %q (the sequence after every one in the inbox)", p, want)
	}
	c.invariants()
}

// cycle runs every crash kind once, in an order that lets each one start
// from a consistent home, and leaves the home without bindings or sources.
func (c *crasher) cycle() {
	c.cycleN++
	c.t.Helper()

	// bind [BIND-5], [BIND-6], [LIFE-1]. Each cycle binds with another
	// timeout, so each retire-binding below retains a binding of its own.
	bind := []string{"extension", "bind", c.pkg, "--adapter", fakeAdapter, "--trust-same-user-code", "--timeout-ms", strconv.Itoa(20000 + c.cycleN)}
	r := c.kill(kBind, nil, bind...)
	b := c.binding(fakeID)
	if b != nil {
		c.left(r, kBind, "published")
	} else {
		c.left(r, kBind, "nothing")
	}
	rr := c.okOr(nil, []string{"binding-exists"}, bind...)
	if b = c.binding(fakeID); b == nil {
		c.failf("[BIND-6] no binding after the next bind: %s", rr)
	}
	if rr.code == 0 && field(rr.stdout, "binding-digest") != b.Digest {
		c.failf("[BIND-7] bind printed digest %s, the registry holds %s", field(rr.stdout, "binding-digest"), b.Digest)
	}
	c.pkgDig = b.PackageDigest

	// register-extension [REG-2], [REG-3].
	reg := func(id string) []string {
		return []string{"procevent", "register-extension", fakeAdapter, id, "--config-ref", "ref-" + id}
	}
	before := c.registered("s")
	r = c.kill(kRegister, nil, reg("s")...)
	if now := c.registered("s"); now != before {
		c.noteToken(now)
		c.left(r, kRegister, "published")
	} else {
		c.left(r, kRegister, "nothing")
	}
	rr = c.ok(nil, reg("s")...)
	c.noteToken(field(rr.stdout, "owner-token"))
	if got := c.registered("s"); got != field(rr.stdout, "owner-token") {
		c.failf("[REG-2] registered generation %s, printed %s", got, field(rr.stdout, "owner-token"))
	}
	c.ok(nil, reg("slow")...)

	// The runner during capture [CAP-1], [RID-1], [RUN-4].
	for range 2 {
		n := len(c.reported)
		above := c.maxSeq("s")
		r = c.kill(kStart, nil, "procevent", "start", "s")
		switch {
		case len(c.reported) > n:
			c.left(r, kStart, "reported")
		case c.maxSeq("s") > above:
			c.left(r, kStart, "captured-unreported")
		default:
			c.left(r, kStart, "nothing")
		}
		c.startOnce()
	}

	// serve, with s capturing continuously and slow in a long poll [RUN-2].
	n := len(c.reported)
	r = c.kill(kServe, nil, "procevent", "serve", "--min-gap", "20ms", "--max-backoff", "200ms", "--rescan", "50ms")
	c.left(r, kServe, fmt.Sprintf("reported-%s", bucket(len(c.reported)-n)))
	c.startOnce()

	// Handle everything, then retire the sources [REG-4].
	for _, res := range c.inbox() {
		if !res.Handled {
			c.ok(nil, "procevent", "handled", res.SourceID, strconv.FormatInt(res.Sequence, 10))
		}
	}
	tok := c.registered("s")
	retire := []string{"procevent", "retire", "s", "--if-owner", tok}
	r = c.kill(kRetire, nil, retire...)
	if c.registered("s") == "" {
		c.left(r, kRetire, "retired")
	} else {
		c.left(r, kRetire, "registered")
	}
	c.ok(nil, retire...)
	c.ok(nil, "procevent", "retire", "slow", "--if-owner", c.registered("slow"))
	if len(c.sources()) != 0 {
		c.failf("[REG-4] sources remain after retire: %+v", c.sources())
	}

	// retire-binding [LIFE-2]: enabled or retained, never neither.
	rb := []string{"extension", "retire-binding", fakeID, "--if-binding-digest", b.Digest}
	r = c.kill(kRetireBinding, nil, rb...)
	kept := filepath.Join(c.h.RetiredBindings(), fakeID, binding.Hex(b.Digest)+".json")
	retained := c.digestOf(kept) == b.Digest
	switch now := c.binding(fakeID); {
	case now != nil && now.Digest != b.Digest:
		c.failf("[LIFE-2] the enabled binding changed to %s", now.Digest)
	case now != nil:
		c.left(r, kRetireBinding, "enabled")
	case retained:
		c.left(r, kRetireBinding, "retained")
	default:
		c.failf("[LIFE-2] binding %s is neither enabled nor retained at %s", b.Digest, kept)
	}
	c.okOr(nil, []string{"binding-missing"}, rb...)
	if c.binding(fakeID) != nil || c.digestOf(kept) != b.Digest {
		c.failf("[LIFE-2] after the next retire-binding the binding is still enabled or not retained at %s", kept)
	}

	c.transferCycle()
}

// transferCycle receives a package of its own by transfer and retires it,
// killing both commands [XFER-3], [XFER-6].
func (c *crasher) transferCycle() {
	c.t.Helper()
	p, unit := c.receive()
	b := c.binding(xferID)
	rt := []string{"extension", "retire-transfer", xferID, "--if-transfer-digest", p.Digest, "--if-binding-digest", b.Digest}
	r := c.kill(kRetireTransfer, nil, rt...)
	kept := filepath.Join(unit(c.h.RetiredStaging()), transfer.BindingFile)
	switch now := c.binding(xferID); {
	case now != nil:
		c.left(r, kRetireTransfer, "enabled")
	case c.digestOf(filepath.Join(unit(c.h.Staging()), transfer.BindingFile)) == b.Digest:
		c.left(r, kRetireTransfer, "between-moves")
		c.doctorSays("[XFER-6] a retire-transfer killed between its moves", "fm "+strings.Join(rt, " "))
	case c.digestOf(kept) == b.Digest:
		c.left(r, kRetireTransfer, "retired")
	default:
		c.failf("[XFER-6] binding %s is neither enabled nor retained", b.Digest)
	}
	c.okOr(nil, []string{"transfer-missing"}, rt...)
	if c.binding(xferID) != nil || c.digestOf(kept) != b.Digest {
		c.failf("[XFER-6] after the next retire-transfer the binding is enabled or not retained at %s", kept)
	}
}

// doctorSays requires fm doctor --json to report a "transfer" finding
// whose message or fix holds want: a half-finished operation is never called healthy.
func (c *crasher) doctorSays(what, want string) {
	c.t.Helper()
	r := c.fm(nil, "doctor", "--json")
	type finding struct{ Check, Message, Fix string }
	var rep struct{ Findings []finding }
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		c.failf("%s: fm doctor --json: %v\n%s", what, err, r.stdout)
		return
	}
	if !slices.ContainsFunc(rep.Findings, func(f finding) bool {
		return f.Check == "transfer" && strings.Contains(f.Message+"\n"+f.Fix, want)
	}) {
		c.failf("%s: fm doctor --json does not report it with %q:\n%s", what, want, r.stdout)
	}
}

// receive packs a new package of its own, receives it by transfer (killed,
// then received again, which must complete it) and returns the transfer and
// its unit path in an area.
func (c *crasher) receive() (p *transfer.Package, unit func(area string) string) {
	c.t.Helper()
	dir := c.makePackage(fmt.Sprintf("xfer-%d", c.cycleN), xferID, `["xfer"]`)
	if err := os.WriteFile(filepath.Join(dir, "cycle"), []byte(dir), 0o644); err != nil {
		c.t.Fatal(err)
	}
	env := []byte(c.ok(nil, "extension", "pack-transfer", dir).stdout)
	p, err := transfer.Open(env)
	if err != nil {
		c.t.Fatal(err)
	}
	unit = func(area string) string {
		return filepath.Join(area, xferID, "1.0.0", binding.Hex(p.Digest))
	}
	receive := []string{"extension", "receive-transfer-bind", "--adapter", xferAdapter, "--trust-same-user-code"}
	r := c.kill(kReceive, env, receive...)
	_, staged := os.Lstat(unit(c.h.Staging()))
	switch {
	case c.binding(xferID) != nil:
		c.left(r, kReceive, "bound")
	case staged == nil:
		c.left(r, kReceive, "staged-unbound(resumed)")
		c.doctorSays("[XFER-3] a receive-transfer-bind killed before its bind", "no binding names it")
	default:
		c.left(r, kReceive, "nothing")
	}
	rr := c.okOr(env, []string{"binding-exists", "transfer-exists"}, receive...)
	if c.binding(xferID) == nil {
		// A receive killed between publishing its unit and its binding is
		// completed by the resend [XFER-3]: no unit is left unbound.
		c.failf("[XFER-3] after the next receive-transfer-bind the transfer is not bound: %s", rr)
	}
	return p, unit
}

// debris counts what killed writers left in the home under temp names, by
// where: .tmp-* (a store copy or a binding not yet renamed into place) and
// .receiving-* (a transfer being rebuilt, swept by the next receive).
func (c *crasher) debris() map[string]int {
	out := map[string]int{}
	filepath.WalkDir(c.h.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		for _, prefix := range []string{".tmp-", ".receiving-"} {
			if strings.HasPrefix(d.Name(), prefix) {
				rel, _ := filepath.Rel(c.h.Dir, filepath.Dir(p))
				out[filepath.Join(rel, prefix+"*")]++
				if d.IsDir() {
					return filepath.SkipDir
				}
			}
		}
		return nil
	})
	return out
}

// digestOf is the binding digest of the file at path, or "".
func (c *crasher) digestOf(path string) string {
	data, err := fsutil.ReadPrivateFile(path, binding.MaxBytes)
	if err != nil {
		return ""
	}
	return binding.Digest(data)
}

// bucket names a count coarsely, for the outcome table.
func bucket(n int) string {
	switch {
	case n == 0:
		return "0"
	case n < 5:
		return "1-4"
	}
	return "5+"
}
