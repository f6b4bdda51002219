package reliability

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/testpkg"
)

// soakConfig sizes one soak run.
type soakConfig struct {
	duration   time.Duration
	sources    int
	reannounce time.Duration // serve's --reannounce-after
	longPoll   int           // seconds a poll waits for a signal
	killEvery  [2]time.Duration
	tick       [2]time.Duration // the driver's pause between two actions
}

// TestSoak is the long soak (bench/soak.sh): FM_SOAK=1, FM_SOAK_DURATION
// (default 10m), FM_SOAK_SOURCES (default 100). See soak for what it checks:
// [RUN-2], [CAP-1], [CAP-2], [CAP-3], [RID-1], [REG-3], [REG-4], [GRP-3].
func TestSoak(t *testing.T) {
	if os.Getenv("FM_SOAK") == "" {
		t.Skip("the long soak runs with FM_SOAK=1 (bench/soak.sh)")
	}
	d := 10 * time.Minute
	if s := os.Getenv("FM_SOAK_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("FM_SOAK_DURATION=%q: %v", s, err)
		}
	}
	soak(t, soakConfig{duration: d, sources: envInt(t, "FM_SOAK_SOURCES", 100), reannounce: 20 * time.Second, longPoll: 5,
		killEvery: [2]time.Duration{15 * time.Second, 45 * time.Second}, tick: [2]time.Duration{50 * time.Millisecond, 250 * time.Millisecond}})
}

// TestSoakSmoke is the soak in small, for every test run: 10 sources for
// 12 s with a serve kill every 3-5 s; it checks the same ([RUN-2], [CAP-1],
// [CAP-2], [RID-1], [GRP-3]).
func TestSoakSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	t.Parallel()
	soak(t, soakConfig{duration: 12 * time.Second, sources: 10, reannounce: 3 * time.Second, longPoll: 2,
		killEvery: [2]time.Duration{3 * time.Second, 5 * time.Second}, tick: [2]time.Duration{30 * time.Millisecond, 120 * time.Millisecond}})
}

// soak runs fm procevent serve over cfg.sources extension sources for
// cfg.duration while a driver, at random, writes signals for the sources
// (the fake's replaying long poll takes them), marks results handled,
// retires a source and registers another (or the same one again: a new
// generation), and SIGKILLs serve and starts it again. Then it stops
// writing, lets serve drain, stops it with TERM and checks:
//
//   - zero lost captures: every signal written is captured exactly once,
//     and every "captured: <path>" serve printed is on disk with its meta
//     ([CAP-1]); the driver retires a source only when every signal written
//     for it was captured, so no signal is excused;
//   - no sequence reused: every result holds its signal and the request id
//     of exactly its sequence and generation ([RID-1]);
//   - zero duplicate wakes without a reason: a second check wake for a
//     result is the re-announcement of docs/procevent.md, so it must come
//     when the result was unhandled and neither its capture nor the
//     previous wake was younger than --reannounce-after ([CAP-2]); every
//     wake names a result captured no later than the wake;
//   - zero orphan groups: within seconds of each restart no owner record of
//     a dead serve remains and every group they named is gone, and at the
//     end cleanup-invocations finds nothing and no package process is
//     alive ([GRP-3]).
func soak(t *testing.T, cfg soakConfig) {
	s := newSoaker(t, cfg)
	s.run()
	s.drain()
	s.verify()
	report := s.report()
	t.Log("\n" + report)
	if testing.Verbose() {
		fmt.Print(report)
	}
}

// soaker is the driver's state.
type soaker struct {
	*world
	cfg   soakConfig
	rng   *rand.Rand
	seed  uint64
	pkg   string // the package digest
	serve *serveProc
	logs  []string // the output of every ended serve

	registered map[string]string   // source -> current owner token
	tokens     map[string][]string // source -> every generation's token
	written    map[string]string   // signal text -> source
	pending    map[string]int      // source -> signals written and not yet seen captured
	captured   map[string]string   // signal text -> result path
	seen       map[string]bool     // result paths already read
	handledAt  map[string]time.Time
	unhandled  []procevent.Result // from the last scan
	orphans    []orphanCheck      // what killed serves left, to be resolved by a deadline
	wakes      wakeStats

	signals, handled, rotations, kills, orphanGroups, deadRecords int
	start                                                         time.Time
}

// orphanCheck is what a killed serve left: by deadline no record of that
// serve may remain and each group its records named must be gone.
type orphanCheck struct {
	serve    int    // its pid
	killed   uint64 // when, in clock ticks since boot (testpkg.Now)
	groups   []int
	deadline time.Time
}

type serveProc struct {
	cmd  *exec.Cmd
	out  *testpkg.SyncBuffer
	done chan struct{}
}

func newSoaker(t *testing.T, cfg soakConfig) *soaker {
	seed := uint64(time.Now().UnixNano())
	s := &soaker{world: newWorld(t), cfg: cfg, seed: seed, rng: rand.New(rand.NewPCG(seed, 7)),
		registered: map[string]string{}, tokens: map[string][]string{}, written: map[string]string{}, pending: map[string]int{},
		captured: map[string]string{}, seen: map[string]bool{}, handledAt: map[string]time.Time{}}
	s.note = fmt.Sprintf("soak seed %d", seed)
	dir := s.makePackage("pkg", fakeID, `["fake"]`)
	out := s.ok(nil, "extension", "bind", dir, "--adapter", fakeAdapter, "--trust-same-user-code").stdout
	s.pkg = field(out, "package-digest")
	s.mode(fakeID, "invoke", "", fmt.Sprintf("signal:%d", cfg.longPoll))
	for i := range cfg.sources {
		s.register(s.sourceName(i))
	}
	return s
}

// sourceName names source i; the pool is a tenth larger than the number
// registered, so rotation registers fresh ids as well as old ones.
func (s *soaker) sourceName(i int) string { return fmt.Sprintf("src-%03d", i) }

func (s *soaker) register(id string) {
	s.t.Helper()
	out := s.ok(nil, "procevent", "register-extension", fakeAdapter, id, "--config-ref", "ref-"+id).stdout
	tok := field(out, "owner-token")
	s.registered[id] = tok
	s.tokens[id] = append(s.tokens[id], tok)
}

func (s *soaker) startServe() {
	s.t.Helper()
	cmd := exec.Command(fmBin, "procevent", "serve", "--min-gap", "1s", "--rescan", "1s", "--reannounce-after", s.cfg.reannounce.String())
	cmd.Env = s.env
	p := &serveProc{cmd: cmd, out: &testpkg.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	s.serve = p
}

// stopServe ends serve with sig and keeps its output.
func (s *soaker) stopServe(sig syscall.Signal) {
	s.t.Helper()
	s.serve.cmd.Process.Signal(sig)
	select {
	case <-s.serve.done:
	case <-time.After(30 * time.Second):
		s.failf("serve did not end within 30 s of %v", sig)
	}
	if sig == syscall.SIGTERM && s.serve.cmd.ProcessState.ExitCode() != 0 {
		s.failf("[RUN-2] serve exited %d on TERM:\n%s", s.serve.cmd.ProcessState.ExitCode(), s.serve.out.String())
	}
	s.logs = append(s.logs, s.serve.out.String())
}

// run is the driver loop.
func (s *soaker) run() {
	s.start = time.Now()
	deadline := s.start.Add(s.cfg.duration)
	s.startServe()
	nextKill := s.start.Add(s.between(s.cfg.killEvery))
	var nextScan time.Time
	for time.Now().Before(deadline) {
		now := time.Now()
		if now.After(nextKill) {
			s.killServe()
			nextKill = now.Add(s.between(s.cfg.killEvery))
		}
		if now.After(nextScan) {
			s.scan()
			nextScan = now.Add(time.Second)
		}
		switch r := s.rng.IntN(100); {
		case r < 50:
			s.signal()
		case r < 85:
			s.handle()
		default:
			s.rotate()
		}
		time.Sleep(s.between(s.cfg.tick))
	}
}

func (s *soaker) between(r [2]time.Duration) time.Duration {
	return r[0] + time.Duration(s.rng.Int64N(int64(r[1]-r[0])+1))
}

// killServe SIGKILLs serve, notes what its polls left, and starts another.
func (s *soaker) killServe() {
	s.t.Helper()
	pid, killed := s.serve.cmd.Process.Pid, testpkg.Now()
	s.stopServe(syscall.SIGKILL)
	s.kills++
	var groups []int
	for _, r := range s.records() {
		if !r.HostLive && r.Host.PID == pid {
			s.deadRecords++
			if r.GroupPID != nil {
				groups = append(groups, *r.GroupPID)
			}
		}
	}
	s.orphanGroups += len(groups)
	s.startServe()
	s.orphans = append(s.orphans, orphanCheck{serve: pid, killed: killed, groups: groups, deadline: time.Now().Add(10 * time.Second)})
}

// checkOrphans applies every due orphan check: the new serve must have
// resolved what the killed one left ([GRP-3]).
func (s *soaker) checkOrphans(force bool) {
	s.t.Helper()
	var keep []orphanCheck
	for _, o := range s.orphans {
		if !force && time.Now().Before(o.deadline) {
			keep = append(keep, o)
			continue
		}
		for _, r := range s.records() {
			if !r.HostLive && r.Host.PID == o.serve {
				s.failf("[GRP-3] an owner record of the serve killed as pid %d is still there 10 s after serve restarted: %+v", o.serve, r)
			}
		}
		for _, g := range o.groups {
			if testpkg.GroupAlive(g, o.killed) {
				s.failf("[GRP-3] group %d of a killed serve is alive 10 s after serve restarted", g)
			}
		}
	}
	s.orphans = keep
}

// scan reads the inbox: new results are matched to their signals.
func (s *soaker) scan() {
	s.t.Helper()
	s.unhandled = s.unhandled[:0]
	for _, r := range s.inbox() {
		if !r.Handled {
			s.unhandled = append(s.unhandled, r)
		}
		if s.seen[r.Path] {
			continue
		}
		s.seen[r.Path] = true
		data, err := os.ReadFile(r.Path)
		if err != nil {
			s.failf("read %s: %v", r.Path, err)
		}
		sig, ok := s.match(r, string(data))
		if !ok {
			s.failf("[RID-1] result %s (evidence %v) holds %q: no signal of %s with the request id of sequence %d", r.Path, r.Evidence, data, r.SourceID, r.Sequence)
		}
		if _, dup := s.captured[sig]; dup {
			s.failf("[CAP-1] signal %q captured twice: %s and %s", sig, s.captured[sig], r.Path)
		}
		s.captured[sig] = r.Path
		s.pending[r.SourceID]--
	}
	s.checkOrphans(false)
}

// match checks a result against the signals written for its source and the
// request ids of its sequence under every generation of the source.
func (s *soaker) match(r procevent.Result, content string) (string, bool) {
	sig, _, ok := strings.Cut(content, " ")
	if !ok || s.written[sig] != r.SourceID || r.Evidence {
		return "", false
	}
	for _, tok := range s.tokens[r.SourceID] {
		if content == pollContent(sig, r.SourceID, r.Sequence, tok, s.pkg) {
			return sig, true
		}
	}
	return "", false
}

// signal writes one signal for a registered source that has none waiting.
func (s *soaker) signal() {
	s.t.Helper()
	id := s.pick(func(id string) bool {
		_, err := os.Lstat(filepath.Join(s.fakeState(fakeID), "signal."+id))
		return os.IsNotExist(err)
	})
	if id == "" {
		return
	}
	s.signals++
	sig := fmt.Sprintf("sig-%s-%d", id, s.signals)
	dir := s.fakeState(fakeID)
	tmp := filepath.Join(dir, ".signal-tmp")
	if err := os.WriteFile(tmp, []byte(sig), 0o600); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "signal."+id)); err != nil {
		s.t.Fatal(err)
	}
	s.written[sig] = id
	s.pending[id]++
}

// handle marks one unhandled result handled ([CAP-3]).
func (s *soaker) handle() {
	s.t.Helper()
	if len(s.unhandled) == 0 {
		return
	}
	i := s.rng.IntN(len(s.unhandled))
	r := s.unhandled[i]
	s.unhandled = append(s.unhandled[:i], s.unhandled[i+1:]...)
	out := s.ok(nil, "procevent", "handled", r.SourceID, strconv.FormatInt(r.Sequence, 10)).stdout
	if !strings.HasPrefix(out, "handled: ") {
		s.failf("[CAP-3] handled printed %q", out)
	}
	s.handledAt[r.Path] = time.Now()
	s.handled++
}

// rotate retires one source with nothing pending and registers another id
// of the pool (possibly the same: a new generation) [REG-3], [REG-4].
func (s *soaker) rotate() {
	s.t.Helper()
	id := s.pick(func(id string) bool { return s.pending[id] == 0 })
	if id == "" {
		return
	}
	out := s.ok(nil, "procevent", "retire", id, "--if-owner", s.registered[id]).stdout
	if out != "retired: "+id+"\n" {
		s.failf("[REG-4] retire printed %q", out)
	}
	delete(s.registered, id)
	pool := s.cfg.sources + s.cfg.sources/10 + 1
	for {
		next := s.sourceName(s.rng.IntN(pool))
		if _, taken := s.registered[next]; !taken {
			s.register(next)
			break
		}
	}
	s.rotations++
}

// pick returns a random registered source that ok accepts, or "".
func (s *soaker) pick(ok func(string) bool) string {
	ids := make([]string, 0, len(s.registered))
	for id := range s.registered {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for range 10 {
		if id := ids[s.rng.IntN(len(ids))]; ok(id) {
			return id
		}
	}
	return ""
}

// drain waits until every written signal is captured, stops serve cleanly,
// runs the cleanup and, one re-announce interval later, one reconcile.
func (s *soaker) drain() {
	s.t.Helper()
	deadline := time.Now().Add(time.Duration(s.cfg.longPoll)*time.Second + time.Minute)
	for {
		s.scan()
		if len(s.captured) == len(s.written) {
			break
		}
		if time.Now().After(deadline) {
			var lost []string
			for sig := range s.written {
				if _, ok := s.captured[sig]; !ok {
					lost = append(lost, sig)
				}
			}
			sort.Strings(lost)
			s.failf("[CAP-1] %d signals lost (not captured a minute after the last was written): %v\nserve's last lines about their sources:\n%s", len(lost), lost, s.serveLines(lost))
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.stopServe(syscall.SIGTERM)
	s.checkOrphans(true)
	s.cleanedUp(nil, 0)
	// One interval later a reconcile must announce whatever a killed
	// runner left unannounced ([CAP-2]); the polls now answer at once.
	s.mode(fakeID, "invoke", "", "no-result")
	time.Sleep(s.cfg.reannounce + time.Second)
	out := s.ok(nil, "procevent", "reconcile", "--reannounce-after", s.cfg.reannounce.String()).stdout
	if !strings.Contains(out, " failed=0 ") {
		s.failf("[RUN-2] the final reconcile failed a source: %s", out)
	}
}

// serveLines returns, for a failure's message, the last lines every serve
// printed about the sources of the signals sigs, the owner records of
// their invocations still there and their registry files.
func (s *soaker) serveLines(sigs []string) string {
	srcs := map[string]bool{}
	for _, sig := range sigs {
		srcs[s.written[sig]] = true
	}
	var lines []string
	for _, out := range append(slices.Clone(s.logs), s.serve.out.String()) {
		for _, l := range strings.Split(out, "\n") {
			for src := range srcs {
				if strings.Contains(l, src) {
					lines = append(lines, l)
					break
				}
			}
		}
	}
	lines = lines[max(0, len(lines)-30):]
	for _, r := range s.records() {
		if srcs[r.SourceID] {
			lines = append(lines, fmt.Sprintf("owner record: %s %s created at %d, host live %v", r.SourceID, r.Operation, r.CreatedAt, r.HostLive))
		}
	}
	for src := range srcs {
		ents, _ := filepath.Glob(filepath.Join(s.h.Registrations(), src+".*"))
		lines = append(lines, fmt.Sprintf("registry files of %s: %v", src, ents))
	}
	return strings.Join(lines, "\n")
}

// verify checks every serve log line and the wake queue.
func (s *soaker) verify() {
	s.t.Helper()
	results := map[string]procevent.Result{}
	for _, r := range s.inbox() {
		results[fmt.Sprintf("procevent:%s:%d", r.SourceID, r.Sequence)] = r
	}
	byPath := map[string]bool{}
	for _, r := range results {
		byPath[r.Path] = true
	}
	reported := map[string]bool{}
	for _, log := range s.logs {
		for _, l := range strings.Split(log, "\n") {
			p, ok := strings.CutPrefix(l, "captured: ")
			if !ok {
				continue
			}
			if reported[p] || !byPath[p] {
				s.failf("[CAP-1] serve reported %s twice, or it is not in the inbox", p)
			}
			reported[p] = true
		}
	}
	s.checkWakes(results)
}

// wakeStats counts the check wakes by reason.
type wakeStats struct{ first, late, reannounced, unannouncedHandled int }

// checkWakes applies the re-announce rule to every check wake: each wake
// names a result captured no later than it; each one after the first for a
// result came while the result was unhandled, and when neither the capture
// nor the previous wake was younger than the interval ([CAP-2]).
func (s *soaker) checkWakes(results map[string]procevent.Result) {
	s.t.Helper()
	iv := int64(s.cfg.reannounce / time.Second)
	last := map[string]int64{}
	for _, w := range s.world.wakes() {
		if w.Kind != procevent.WakeKind {
			continue
		}
		r, ok := results[w.Key]
		if !ok || w.Time < r.CapturedAt {
			s.failf("[CAP-1] wake %q announces no result captured before it", w.Line())
		}
		prev, again := last[w.Key]
		last[w.Key] = w.Time
		switch {
		case !again && w.Time-r.CapturedAt < iv:
			s.wakes.first++
		case !again:
			// A first announcement only after the interval: the runner died
			// between capture and wake, and a later serve re-announced it.
			s.wakes.late++
		case w.Time-prev < iv || w.Time-r.CapturedAt < iv:
			s.failf("[CAP-2] wake %q repeats the one of %d within the re-announce interval", w.Line(), prev)
		default:
			s.wakes.reannounced++
		}
		if at, ok := s.handledAt[r.Path]; ok && w.Time > at.Unix()+1 {
			s.failf("[CAP-2] wake %q came after the result was handled at %d", w.Line(), at.Unix())
		}
	}
	for key, r := range results {
		switch _, ok := last[key]; {
		case ok:
		case r.Handled:
			// Its runner died before the wake and the driver handled it
			// before the re-announcement was due.
			s.wakes.unannouncedHandled++
		default:
			s.failf("[CAP-2] unhandled result %s was never announced, not even by the final reconcile", r.Path)
		}
	}
}

func (s *soaker) report() string {
	var b strings.Builder
	took := time.Since(s.start).Round(time.Second)
	fmt.Fprintf(&b, "soak: %s, %d sources, serve SIGKILLed and restarted %d times (seed %d)\n", took, s.cfg.sources, s.kills, s.seed)
	fmt.Fprintf(&b, "soak: %d signals written, %d captured exactly once, %d lost, 0 captured twice\n", s.signals, len(s.captured), len(s.written)-len(s.captured))
	fmt.Fprintf(&b, "soak: %d handled, %d retire+register rotations, %d generations registered\n", s.handled, s.rotations, s.generations())
	fmt.Fprintf(&b, "soak: %d check wakes: %d first announcements, %d first announced late by re-announcement (runner killed before its wake), %d re-announcements with a reason, 0 without; %d results handled before any wake\n",
		s.wakes.first+s.wakes.late+s.wakes.reannounced, s.wakes.first, s.wakes.late, s.wakes.reannounced, s.wakes.unannouncedHandled)
	fmt.Fprintf(&b, "soak: %d owner records left by killed serves (%d process groups), all resolved by the next serve; 0 orphan groups at the end\n", s.deadRecords, s.orphanGroups)
	return b.String()
}

func (s *soaker) generations() int {
	n := 0
	for _, ts := range s.tokens {
		n += len(ts)
	}
	return n
}
