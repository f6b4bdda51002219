// Command fmbench times whole fm processes against their physical floor, for
// bench/run.sh. Each experiment runs its fm command and its floor
// alternately (A B, B A, A B, ...) many times in one run, so drift in the
// machine's load hits both sides alike, and reports medians.
//
//	fmbench -fm bin/fm -adapter floor -n 400 invoke
//	fmbench -fm bin/fm -adapter floor -n 400 barrier
//	fmbench -fm bin/fm -n 400 list
//	fmbench -fm bin/fm -adapter floor -sources 200 -seconds 10 serve-captures
//	fmbench -fm bin/fm -adapter floor -sources 200 -seconds 10 serve-idle
//	fmbench -fm old/fm -fm2 bin/fm -adapter floor -n 400 compare
//	fmbench -fm bin/fm -adapter floor -pkg <floor package> -files 1000 -size 113 -dirs 10 -n 20 bind
//
// The home is FM_HOME (or the usual resolution), holding one binding that
// enables the adapter, whose entrypoint is the trivial compiled entrypoint
// (internal/host/testdata/floor.c). The floor of one `fm extension
// process-event <adapter> source.poll` is two bare execs of that entrypoint,
// `handshake` then `invoke`, fed byte for byte the kind of request documents
// fm sends (built here with fm's own encoder), from the harness, with the
// entrypoint's working directory and environment.
//
// Processes are started with os.StartProcess. fm's own processes get files
// for their streams (/dev/null or a request file). The bare execs of the
// entrypoint get, by default (-floor-stdio pipes), the streams fm gives an
// entrypoint: stdin a pipe that holds the request and then ends, stdout and
// stderr pipes that the harness reads to their end. An interpreter does not
// start alike on a pipe and on /dev/null (Node builds a stream for a pipe;
// about 1 to 3 ms per exec here), and fm must give it pipes ([INV-2],
// [INV-4]), so only pipes make the difference fm's own cost.
// -floor-stdio files gives them files instead, as earlier rounds measured.
// Times are wall-clock from just before the start to just after the wait.
package main

import (
	"bufio"
	"cmp"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/launch/barrier"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/procstat"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

var (
	fmPath  = flag.String("fm", "bin/fm", "the fm binary")
	fmPath2 = flag.String("fm2", "", "compare: the second fm binary")
	adapter = flag.String("adapter", "floor", "the adapter the bound floor entrypoint enables")
	rounds  = flag.Int("n", 300, "rounds (each runs both sides once)")
	warm    = flag.Int("warm", 10, "untimed warm-up rounds")
	sources = flag.Int("sources", 200, "serve: registered sources")
	seconds = flag.Float64("seconds", 10, "serve: measured seconds")
	pkgDir  = flag.String("pkg", "", "bind: the floor package to extend with generated files")
	files   = flag.Int("files", 1000, "bind: generated files")
	size    = flag.Int("size", 113, "bind: bytes per generated file")
	dirs    = flag.Int("dirs", 10, "bind: directories the generated files are spread over")
	label   = flag.String("label", "", "the name (bind, invoke) or suffix (serve-idle, design) of the printed figures")
	busy    = flag.Int("busy", 0, "invoke, design, compare: busy loops (sh processes) competing for the CPU while it is timed")
	exitBin = flag.String("exit", "", "design: a static binary that exits 0 at once")
	floorIO = flag.String("floor-stdio", "pipes", "invoke, design: the streams of the bare execs of the entrypoint: pipes (as fm gives them) or files (the request file, /dev/null)")
)

func main() {
	flag.Parse()
	if *floorIO != "pipes" && *floorIO != "files" {
		check(fmt.Errorf("-floor-stdio %q: want pipes or files", *floorIO))
	}
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: fmbench [flags] invoke|barrier|list|compare|serve-captures|serve-idle|bind|design|confine")
		os.Exit(2)
	}
	fm, err := filepath.Abs(*fmPath)
	check(err)
	switch flag.Arg(0) {
	case "invoke":
		invoke(fm)
	case "barrier":
		barrierOverhead(fm)
	case "list":
		list(fm)
	case "compare":
		fm2, err := filepath.Abs(*fmPath2)
		check(err)
		compare(fm, fm2)
	case "serve-captures":
		serveCaptures(fm)
	case "serve-idle":
		serveIdle(fm)
	case "bind":
		bind(fm)
	case "design":
		design(fm)
	case "confine":
		confineCost(fm)
	default:
		fmt.Fprintln(os.Stderr, "fmbench: unknown experiment", flag.Arg(0))
		os.Exit(2)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "fmbench:", err)
		os.Exit(1)
	}
}

// proc is one process to time: argv, environment, working directory, the
// file to feed on stdin ("" for /dev/null), whether its streams are pipes
// (stdin holding that file's bytes, stdout and stderr read to their end),
// extra descriptors from 3 on (made fresh for every run by extra), and the
// exit status it must end with.
type proc struct {
	argv  []string
	env   []string
	dir   string
	stdin string
	pipes bool
	extra func() []*os.File
	want  int
}

// run starts p, waits for it and returns the wall time.
func (p proc) run() time.Duration {
	var files, readers []*os.File
	if p.pipes {
		req, err := os.ReadFile(p.stdin)
		check(err)
		inR, inW, err := os.Pipe()
		check(err)
		_, err = inW.Write(req) // a request fits an empty pipe (64 KiB)
		check(err)
		inW.Close()
		outR, outW, err := os.Pipe()
		check(err)
		errR, errW, err := os.Pipe()
		check(err)
		files, readers = []*os.File{inR, outW, errW}, []*os.File{outR, errR}
	} else {
		in := os.DevNull
		if p.stdin != "" {
			in = p.stdin
		}
		stdin, err := os.Open(in)
		check(err)
		null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		check(err)
		files = []*os.File{stdin, null, null}
	}
	if p.extra != nil {
		files = append(files, p.extra()...)
	}
	start := time.Now()
	pr, err := os.StartProcess(p.argv[0], p.argv, &os.ProcAttr{Dir: p.dir, Env: p.env, Files: files})
	check(err)
	for _, f := range files {
		f.Close()
	}
	if readers != nil {
		done := make(chan error)
		go func() { _, err := io.Copy(io.Discard, readers[1]); done <- err }()
		_, err := io.Copy(io.Discard, readers[0])
		check(err)
		check(<-done)
	}
	st, err := pr.Wait()
	d := time.Since(start)
	check(err)
	for _, f := range readers {
		f.Close()
	}
	if st.ExitCode() != p.want {
		check(fmt.Errorf("%s exited %d, want %d", strings.Join(p.argv, " "), st.ExitCode(), p.want))
	}
	return d
}

// seq runs ps one after the other and returns the total wall time.
func seq(ps ...proc) time.Duration {
	var d time.Duration
	for _, p := range ps {
		d += p.run()
	}
	return d
}

// stats summarises one side of an experiment.
type stats struct{ med, p10, p90 time.Duration }

func summarise(ds []time.Duration) stats {
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[int(q*float64(len(s)-1)+0.5)] }
	return stats{at(0.5), at(0.1), at(0.9)}
}

func (s stats) String() string {
	return fmt.Sprintf("median %s (p10 %s, p90 %s)", ms(s.med), ms(s.p10), ms(s.p90))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }

// alternate times a and b alternately and returns both samples and the
// per-round ratios a/b.
func alternate(a, b func() time.Duration) (as, bs []time.Duration, ratios []float64) {
	for range *warm {
		a()
		b()
	}
	for i := range *rounds {
		var da, db time.Duration
		if i%2 == 0 {
			da = a()
			db = b()
		} else {
			db = b()
			da = a()
		}
		as, bs = append(as, da), append(bs, db)
		ratios = append(ratios, float64(da)/float64(db))
	}
	return as, bs, ratios
}

func median(fs []float64) float64 {
	s := slices.Clone(fs)
	slices.Sort(s)
	return s[len(s)/2]
}

// floor is the bound floor entrypoint and the two request documents fm
// would send it.
type floor struct {
	entry, dir        string
	env               []string
	barrierEnv        []string // see barrierEnv
	handshake, invoke string   // request files
}

// barrierEnv is the environment fm's own host gives a barrier for an
// entrypoint whose environment is env: barrier.Env(env) for a build whose
// barrier takes barrier.RuntimeEnv out again (it refuses a start without
// it, exit 125), and env itself for an earlier build (FM=...), whose barrier
// execs /bin/true here and exits 0; that build's host starts its barriers
// without the entry, and so does its floor.
func barrierEnv(fm, dir string, env []string) []string {
	cmd := exec.Command(fm, launch.BarrierArg, "/bin/true", "invoke")
	cmd.Env, cmd.Dir, cmd.ExtraFiles = env, dir, releasedPipe()
	if cmd.Run() == nil {
		return env
	}
	return barrier.Env(env)
}

func setup(fm string) floor {
	h, err := home.Resolve()
	check(err)
	b, err := host.Resolve(h, *adapter)
	check(err)
	env, err := host.Environment(h, &b.Record)
	check(err)
	tmp, err := os.MkdirTemp("", "fmbench-")
	check(err)
	c := b.Capabilities[0]
	hs := wire.HandshakeRequest{
		Schema:           wire.HandshakeRequestSchema,
		RequestID:        protocol.NewRequestID(),
		HostProtocols:    protocol.HostProtocols,
		ExtensionID:      b.ExtensionID,
		ExtensionVersion: b.ExtensionVersion,
		PackageDigest:    b.PackageDigest,
		Capability:       wire.HandshakeCapability{Name: c.Name, Versions: []int64{c.Version}, AdapterNames: c.AdapterNames},
	}
	inv := wire.Request{
		Schema:            wire.RequestSchema,
		RequestID:         protocol.NewRequestID(),
		HostProtocol:      b.HostProtocol,
		ExtensionID:       b.ExtensionID,
		ExtensionVersion:  b.ExtensionVersion,
		PackageDigest:     b.PackageDigest,
		Capability:        wire.CapabilityName,
		CapabilityVersion: c.Version,
		Adapter:           *adapter,
		Operation:         wire.OpPoll,
		Input:             []byte(`{"config_ref":"bench","source_id":"bench"}`),
	}
	f := floor{
		entry: filepath.Join(b.PackageRoot, filepath.FromSlash(b.Entrypoint)),
		dir:   b.PackageRoot, env: env, barrierEnv: barrierEnv(fm, b.PackageRoot, env),
		handshake: filepath.Join(tmp, "handshake.json"),
		invoke:    filepath.Join(tmp, "invoke.json"),
	}
	for path, v := range map[string]any{f.handshake: hs, f.invoke: inv} {
		data, err := strictjson.Canonical(v)
		check(err)
		check(os.WriteFile(path, data, 0o600))
	}
	return f
}

func (f floor) bare(verb string) proc {
	in := f.invoke
	if verb == "handshake" {
		in = f.handshake
	}
	return proc{argv: []string{f.entry, verb}, env: f.env, dir: f.dir, stdin: in, pipes: *floorIO == "pipes"}
}

func report(name string, as, bs []time.Duration, ratios []float64, aName, bName string) float64 {
	sa, sb := summarise(as), summarise(bs)
	fmt.Printf("%s: %s: %s\n", name, aName, sa)
	fmt.Printf("%s: %s: %s\n", name, bName, sb)
	r := float64(sa.med) / float64(sb.med)
	fmt.Printf("%s: ratio of medians %.2f, median of per-round ratios %.2f, %d rounds\n", name, r, median(ratios), len(as))
	return r
}

// invoke: one real `fm extension process-event <adapter> source.poll` (exit
// 75, no result) against two bare execs of its entrypoint.
func invoke(fm string) {
	f := setup(fm)
	call := proc{
		argv: []string{fm, "extension", "process-event", *adapter, "source.poll", "--source-id", "bench", "--config-ref", "bench"},
		env:  os.Environ(), want: 75,
	}
	hs, inv := f.bare("handshake"), f.bare("invoke")
	defer busyLoops(*busy)()
	as, bs, ratios := alternate(call.run, func() time.Duration { return seq(hs, inv) })
	r := report("invoke", as, bs, ratios, "fm process-event", "two bare execs")
	fmt.Printf("invoke-vs-bare-exec: %.2f\n", r)
	diffs := make([]float64, len(as))
	for i := range as {
		diffs[i] = float64(as[i]-bs[i]) / 1e6
	}
	fmt.Printf("%s-overhead-ms: %.2f\n", cmp.Or(*label, "poll"), median(diffs))
}

// busyLoops starts n shell busy loops, each in its own process, and returns
// the function that stops them.
func busyLoops(n int) func() {
	var cmds []*exec.Cmd
	for range n {
		c := exec.Command("/bin/sh", "-c", "while :; do :; done")
		check(c.Start())
		cmds = append(cmds, c)
	}
	return func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}
}

// releasedPipe is descriptor 3 of a barrier released at once: the read end
// of a pipe holding the release byte.
func releasedPipe() []*os.File {
	r, w, err := os.Pipe()
	check(err)
	_, err = w.Write([]byte{'G'})
	check(err)
	w.Close()
	return []*os.File{r}
}

// design: the CLI call against its design floor, the processes the design
// mandates for one `fm extension process-event … source.poll`, each run and
// timed here in the same round: one fm start-up (`fm version`), two launch
// barriers (fm re-executed in its hidden mode, released at once, execve of a
// static binary that exits at once: -exit), and the two bare execs of the
// entrypoint (handshake, invoke). With -busy the same runs against busy
// loops; -label then suffixes the figures.
func design(fm string) {
	f := setup(fm)
	call := proc{
		argv: []string{fm, "extension", "process-event", *adapter, "source.poll", "--source-id", "bench", "--config-ref", "bench"},
		env:  os.Environ(), want: 75,
	}
	version := proc{argv: []string{fm, "version"}, env: os.Environ()}
	bar := proc{argv: []string{fm, launch.BarrierArg, *exitBin, "invoke"}, env: f.barrierEnv, dir: f.dir, extra: releasedPipe}
	hs, inv := f.bare("handshake"), f.bare("invoke")
	// The floor's start-ups (fm version and the two barriers) are also
	// kept apart: they are the least that any call adds to its two execs of
	// the entrypoint, so their figure quiet and under load bounds what the
	// call's overhead can be.
	var startups []time.Duration
	floor := func() time.Duration {
		s := seq(version, bar, bar)
		startups = append(startups, s)
		return s + seq(hs, inv)
	}
	defer busyLoops(*busy)()
	as, bs, ratios := alternate(call.run, floor)
	r := report("design", as, bs, ratios, "fm process-event", "design floor (fm version + 2 barriers + 2 bare execs)")
	suffix := ""
	if *label != "" {
		suffix = "-" + *label
	}
	fmt.Printf("design: start-ups of the floor (fm version + 2 barriers): %s\n", summarise(startups))
	fmt.Printf("invoke-vs-design-floor%s: %.2f\n", suffix, r)
	fmt.Printf("design-startups%s-ms: %.2f\n", suffix, float64(summarise(startups).med)/1e6)
}

// compare: one process-event call by fm against one by fm2, alternately (for
// before/after figures of a change).
func compare(fm, fm2 string) {
	call := func(bin string) proc {
		return proc{
			argv: []string{bin, "extension", "process-event", *adapter, "source.poll", "--source-id", "bench", "--config-ref", "bench"},
			env:  os.Environ(), want: 75,
		}
	}
	defer busyLoops(*busy)()
	as, bs, ratios := alternate(call(fm).run, call(fm2).run)
	report("compare", as, bs, ratios, fm, fm2)
}

// barrierOverhead: the launch barrier (bin/fm re-executed in its hidden mode, released
// at once, then execve of the entrypoint) against a bare exec of the
// entrypoint; and fm's bare start-up (the barrier mode with no entrypoint:
// runtime and package initialisation, then exit 125).
func barrierOverhead(fm string) {
	f := setup(fm)
	viaBarrier := proc{argv: []string{fm, launch.BarrierArg, f.entry, "invoke"}, env: f.barrierEnv, dir: f.dir, stdin: f.invoke, extra: releasedPipe}
	as, bs, ratios := alternate(viaBarrier.run, f.bare("invoke").run)
	report("barrier", as, bs, ratios, "fm barrier + entrypoint", "bare entrypoint")
	fmt.Printf("barrier-overhead: %s\n", ms(summarise(as).med-summarise(bs).med))
	startup := proc{argv: []string{fm, launch.BarrierArg}, env: f.barrierEnv, dir: f.dir, want: 125}
	as, bs, ratios = alternate(startup.run, f.bare("invoke").run)
	report("fm-startup", as, bs, ratios, "fm start-up and exit", "bare entrypoint")
}

// list: `fm extension list` from a fresh process (the page cache warm).
func list(fm string) {
	h, err := home.Resolve()
	check(err)
	bs, err := binding.Load(h)
	check(err)
	call := proc{argv: []string{fm, "extension", "list"}, env: os.Environ()}
	version := proc{argv: []string{fm, "version"}, env: os.Environ()}
	as, vs, ratios := alternate(call.run, version.run)
	report("list", as, vs, ratios, fmt.Sprintf("fm extension list (%d binding(s))", len(bs)), "fm version")
	fmt.Printf("list-cold-start-ms: %.3f\n", float64(summarise(as).med)/1e6)
}

// register makes sure sources src000.. are registered for the adapter.
func register(fm string) {
	for i := range *sources {
		id := fmt.Sprintf("src%03d", i)
		cmd := exec.Command(fm, "procevent", "register-extension", *adapter, id, "--config-ref", "bench")
		if out, err := cmd.CombinedOutput(); err != nil {
			check(fmt.Errorf("register %s: %v: %s", id, err, out))
		}
	}
}

// serveProc is a running `fm procevent serve` whose stdout lines are counted.
type serveProc struct {
	cmd      *exec.Cmd
	captures atomic.Int64
	done     chan struct{}
}

func startServe(fm string, args ...string) *serveProc {
	sp := &serveProc{cmd: exec.Command(fm, append([]string{"procevent", "serve"}, args...)...), done: make(chan struct{})}
	out, err := sp.cmd.StdoutPipe()
	check(err)
	sp.cmd.Stderr = os.Stderr
	check(sp.cmd.Start())
	go func() {
		defer close(sp.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "captured: ") {
				sp.captures.Add(1)
			}
		}
	}()
	return sp
}

// stop sends TERM and waits for serve to exit; it returns how long that took.
func (sp *serveProc) stop() time.Duration {
	start := time.Now()
	check(sp.cmd.Process.Signal(syscall.SIGTERM))
	<-sp.done
	err := sp.cmd.Wait()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fmbench: serve:", err)
	}
	return time.Since(start)
}

// cpuTicks returns utime+stime of pid, and cutime+cstime (its reaped
// children: barriers and entrypoints), in clock ticks.
func cpuTicks(pid int) (self, children int64) {
	st, err := procstat.Read(pid)
	check(err)
	return int64(st.UTime + st.STime), st.CUTime + st.CSTime
}

// status returns VmRSS in KiB and the thread count of pid.
func status(pid int) (rssKiB, threads int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB"))
		switch k {
		case "VmRSS":
			rssKiB, _ = strconv.ParseInt(v, 10, 64)
		case "Threads":
			threads, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return rssKiB, threads
}

// descendantsRSS sums VmRSS over the children of pid and their children.
func descendantsRSS(pid int) (kib int64, n int) {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			c, _ := strconv.Atoi(f)
			r, _ := status(c)
			kib, n = kib+r, n+1
			k2, n2 := descendantsRSS(c)
			kib, n = kib+k2, n+n2
		}
	}
	return kib, n
}

const ticksPerSecond = 100 // USER_HZ on Linux

// serveCaptures: serve with -sources registered sources of an adapter that
// answers a result at once; captures per second over -seconds, after a
// warm-up, and serve's CPU.
func serveCaptures(fm string) {
	register(fm)
	sp := startServe(fm, "--min-gap", "1ms", "--rescan", "1s")
	time.Sleep(3 * time.Second)
	pid := sp.cmd.Process.Pid
	c0, t0 := sp.captures.Load(), time.Now()
	s0, ch0 := cpuTicks(pid)
	time.Sleep(time.Duration(*seconds * float64(time.Second)))
	c1, t1 := sp.captures.Load(), time.Now()
	s1, ch1 := cpuTicks(pid)
	rss, threads := status(pid)
	d := t1.Sub(t0).Seconds()
	stopped := sp.stop()
	fmt.Printf("serve-captures: %d sources, %d captures in %.1f s\n", *sources, c1-c0, d)
	fmt.Printf("serve-captures-per-second: %.1f\n", float64(c1-c0)/d)
	fmt.Printf("serve-captures: serve CPU %.0f%% of one core, its barriers and entrypoints %.0f%%; RSS %d KiB, %d threads; stopped in %s\n",
		100*float64(s1-s0)/ticksPerSecond/d, 100*float64(ch1-ch0)/ticksPerSecond/d, rss, threads, ms(stopped))
	fmt.Printf("serve-cpu-per-child-cpu: %.2f\n", float64(s1-s0)/float64(max(ch1-ch0, 1)))
}

// serveIdle: serve with -sources registered sources of an adapter that
// long-polls (never answers): once every source's poll is in flight, serve's
// RSS, threads and CPU over -seconds, and the RSS of the entrypoints.
func serveIdle(fm string) {
	register(fm)
	h, err := home.Resolve()
	check(err)
	sp := startServe(fm)
	pid := sp.cmd.Process.Pid
	deadline := time.Now().Add(5 * time.Minute)
	for {
		recs, err := launch.List(h.Invocations())
		check(err)
		inFlight := 0
		for _, r := range recs {
			if r.Phase == launch.PhaseGroup && r.Operation == wire.OpPoll {
				inFlight++
			}
		}
		if inFlight >= *sources {
			break
		}
		if time.Now().After(deadline) {
			check(fmt.Errorf("only %d of %d polls in flight after 5 minutes", inFlight, *sources))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // settle
	s0, ch0 := cpuTicks(pid)
	t0 := time.Now()
	// serve maintains every procevent.MaintainEvery: a shorter window holds
	// one maintenance or none, and its CPU figure is either high or low; a
	// whole period is the average an operator's machine sees.
	time.Sleep(max(time.Duration(*seconds*float64(time.Second)), procevent.MaintainEvery))
	s1, ch1 := cpuTicks(pid)
	d := time.Since(t0).Seconds()
	rss, threads := status(pid)
	kids, n := descendantsRSS(pid)
	stopped := sp.stop()
	// -label 1000 names the figures serve-idle-1000-rss-kib, serve-stop-1000-ms, ...
	suffix := ""
	if *label != "" {
		suffix = "-" + *label
	}
	fmt.Printf("serve-idle%s: %d sources, every poll in flight (long-poll), measured %.1f s\n", suffix, *sources, d)
	fmt.Printf("serve-idle%s-rss-kib: %d\n", suffix, rss)
	fmt.Printf("serve-idle%s-cpu-percent: %.2f\n", suffix, 100*float64(s1-s0)/ticksPerSecond/d)
	fmt.Printf("serve-idle%s: %d threads; reaped children's CPU %.2f%%; %d entrypoint processes, %d KiB RSS in all\n",
		suffix, threads, 100*float64(ch1-ch0)/ticksPerSecond/d, n, kids)
	fmt.Printf("serve-stop%s-ms: %.0f (TERM until serve exited, every group proved gone)\n", suffix, float64(stopped)/1e6)
}

// bind: `fm extension bind` of the floor package extended with -files
// generated files of -size bytes over -dirs directories, each round into a
// fresh home, against its I/O floor: `cp -a` of the same tree into the same
// file system followed by `sync -f` on the copy. Both sides write the same
// bytes to the same file system and make them durable; bind also hashes the
// tree (scan, copy, rescan) and runs the handshake.
func bind(fm string) {
	if *pkgDir == "" {
		check(fmt.Errorf("bind needs -pkg"))
	}
	tmp, err := os.MkdirTemp(filepath.Dir(*pkgDir), "fmbench-bind-")
	check(err)
	defer removeTree(tmp)
	pkg := filepath.Join(tmp, "pkg")
	check(exec.Command("cp", "-a", *pkgDir, pkg).Run())
	payload := make([]byte, *size)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	for i := range *files {
		d := filepath.Join(pkg, "data", fmt.Sprintf("d%02d", i%max(*dirs, 1)))
		check(os.MkdirAll(d, 0o755))
		payload[0] = byte('a' + i%26) // files differ, as real ones do
		check(os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", i)), payload, 0o644))
	}
	check(exec.Command("chmod", "-R", "go-w", pkg).Run())
	n := 0
	fresh := func() string {
		n++
		return filepath.Join(tmp, fmt.Sprintf("r%04d", n))
	}
	bindOnce := func() time.Duration {
		h := fresh()
		check(os.Mkdir(h, 0o700))
		p := proc{
			argv: []string{fm, "extension", "bind", pkg, "--adapter", *adapter, "--trust-same-user-code"},
			env:  append(os.Environ(), "FM_HOME="+h),
		}
		d := p.run()
		removeTree(h)
		return d
	}
	floorOnce := func() time.Duration {
		dst := fresh()
		d := seq(proc{argv: []string{"/bin/cp", "-a", pkg, dst}}, proc{argv: []string{"/bin/sync", "-f", dst}})
		removeTree(dst)
		return d
	}
	as, bs, ratios := alternate(bindOnce, floorOnce)
	name := cmp.Or(*label, "bind")
	r := report(name, as, bs, ratios, fmt.Sprintf("fm extension bind (%d files of %d bytes)", *files, *size), "cp -a + sync -f")
	fmt.Printf("%s-vs-floor: %.2f\n", name, r)
}

// removeTree removes a tree that may hold a sealed (0555) store.
func removeTree(dir string) {
	exec.Command("chmod", "-R", "u+w", dir).Run()
	os.RemoveAll(dir)
}

// confineCost: what confinement adds to a launch [CONF-1]. The host side,
// building the bound package's ruleset (confine.Build), is timed in process
// (confine-build-us); the whole of it, host and barrier (no-new-privileges,
// landlock_restrict_self) and the package's path checks under the ruleset,
// is the per-round difference of one real call with the home's enforce and
// one with --confinement off, per launch (two per call): confine-cost-us.
func confineCost(fm string) {
	h, err := home.Resolve()
	check(err)
	b, err := host.Resolve(h, *adapter)
	check(err)
	c, err := host.HomeConfinement(h)
	check(err)
	if c.Mode != confine.Enforce || c.ABI < 1 {
		fmt.Printf("confine: skipped (%s)\n", c.Describe())
		return
	}
	var builds []float64
	for range *rounds {
		t0 := time.Now()
		p := host.BindingPlan(h, &b.Record, c)
		builds = append(builds, float64(time.Since(t0))/1e3)
		if !p.Confined() {
			check(fmt.Errorf("the binding would not be confined: %s", p))
		}
	}
	call := func(mode string) proc {
		return proc{argv: []string{fm, "extension", "process-event", *adapter, "source.poll", "--source-id", "bench", "--config-ref", "bench", "--confinement", mode}, env: os.Environ(), want: 75}
	}
	on, off := call("enforce"), call("off")
	defer busyLoops(*busy)()
	as, bs, ratios := alternate(on.run, off.run)
	report("confine", as, bs, ratios, "enforce", "off")
	diffs := make([]float64, len(as))
	for i := range as {
		diffs[i] = float64(as[i]-bs[i]) / 1e3 / 2
	}
	fmt.Printf("confine-build-us: %.1f\n", median(builds))
	fmt.Printf("confine-cost-us: %.1f\n", median(diffs))
}
