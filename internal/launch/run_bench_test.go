package launch

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// buildFloor compiles ../host/testdata/floor.c, the trivial compiled
// entrypoint of the invocation benchmarks, into dir, or skips when gcc is
// absent.
func buildFloor(tb testing.TB, dir string) string {
	tb.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		tb.Skip("gcc is not installed: the trivial compiled entrypoint (internal/host/testdata/floor.c) cannot be built")
	}
	src, err := filepath.Abs(filepath.Join("..", "host", "testdata", "floor.c"))
	if err != nil {
		tb.Fatal(err)
	}
	var flagSets [][]string
	if runtime.GOARCH == "amd64" {
		flagSets = append(flagSets, []string{"-Os", "-static", "-nostdlib", "-ffreestanding", "-fno-stack-protector", "-fno-pie", "-no-pie",
			"-fno-tree-loop-distribute-patterns", "-fno-asynchronous-unwind-tables", "-DFLOOR_NOLIBC",
			"-Wl,--build-id=none,-z,noseparate-code", "-s"})
	}
	flagSets = append(flagSets, []string{"-Os", "-static", "-s"}, []string{"-Os", "-s"})
	out := filepath.Join(dir, "floor")
	var msgs []byte
	for _, flags := range flagSets {
		msg, err := exec.Command(gcc, append(flags, "-o", out, src)...).CombinedOutput()
		if err == nil {
			return out
		}
		msgs = append(msgs, msg...)
	}
	tb.Skipf("gcc cannot build floor.c: %s", msgs)
	return ""
}

// runSteps are the crashHook steps of a successful Run, in order, and the
// name of the span that ends at each; "return" is Run's return.
var runSteps = []struct{ step, span string }{
	{"reserve", "prepare"},           // subreaper, identities, records dir, name
	{"reserved", "record-reserve"},   // write the reserved record
	{"started", "barrier-start"},     // fork + execve of the barrier (fm itself)
	{"grouped", "record-group"},      // read the leader's identity, rewrite the record
	{"released", "release"},          // write the release byte
	{"reading", "barrier-to-output"}, // barrier start-up, execve, entrypoint until its first byte
	{"proved", "exit-and-proof"},     // entrypoint exit, group proved gone, streams drained
	{"return", "record-remove"},      // remove the record
}

// BenchmarkRun times one launch.Run of the trivial compiled entrypoint (the
// barrier is this test binary) and breaks it down by the steps Run reports
// to crashHook, each as a median in ns/op.
//
//	go test -run '^$' -bench Run ./internal/launch/
func BenchmarkRun(b *testing.B) {
	floor := buildFloor(b, b.TempDir())
	f := fixture{records: filepath.Join(b.TempDir(), "extension-invocations")}
	stdin := []byte(`{"request_id":"sha256:` + strings.Repeat("ab", 32) + `"}`)
	s := Spec{
		Path: floor, Verb: "invoke", Dir: filepath.Dir(floor), Env: []string{"LANG=C"},
		Stdin: stdin, StdoutLimit: 65536, StderrLimit: 8192, Timeout: 30 * time.Second,
		Records: f.records, Owner: testOwner,
	}
	at := map[string]time.Time{}
	crashHook = func(step string) { at[step] = time.Now() }
	defer func() { crashHook = nil }()
	spans := map[string][]time.Duration{}
	for b.Loop() {
		clear(at)
		t0 := time.Now()
		res, err := Run(context.Background(), s)
		at["return"] = time.Now()
		if err != nil || !strings.Contains(string(res.Stdout), `"no-result"`) {
			b.Fatalf("run: %v %s", err, res.Stdout)
		}
		prev := t0
		for _, st := range runSteps {
			t, ok := at[st.step]
			if !ok {
				b.Fatalf("no step %s", st.step)
			}
			spans[st.span] = append(spans[st.span], t.Sub(prev))
			prev = t
		}
	}
	for _, st := range runSteps {
		d := slices.Clone(spans[st.span])
		slices.Sort(d)
		b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), st.span+"-ns/op")
	}
}

// BenchmarkRecordWrite times one durable record publication (write the
// temporary file, rename it into place) and its removal.
func BenchmarkRecordWrite(b *testing.B) {
	dir, err := openRecordDir(filepath.Join(b.TempDir(), "extension-invocations"), true)
	if err != nil {
		b.Fatal(err)
	}
	defer dir.close()
	host, err := selfIdentity()
	if err != nil {
		b.Fatal(err)
	}
	rec := &Record{
		Schema: RecordSchema, Phase: PhaseReserved, Host: host,
		ExtensionID: testOwner.ExtensionID, BindingDigest: testOwner.BindingDigest, RequestID: testOwner.RequestID,
		SourceID: testOwner.SourceID, Operation: testOwner.Operation, CreatedAt: time.Now().Unix(),
	}
	for b.Loop() {
		name, err := newRecordName(rec.SourceID)
		if err != nil {
			b.Fatal(err)
		}
		if err := dir.write(name, rec); err != nil {
			b.Fatal(err)
		}
		if err := dir.releaseErr(name); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMembers times one /proc scan for the members of a process group,
// which a group proof needs whenever the kernel cannot prove the group empty.
func BenchmarkMembers(b *testing.B) {
	for b.Loop() {
		if _, err := members(os.Getpid()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLookChildren times one look at the host's children
// (lookOnlyLeaderChildren), narrow (the main and the fork thread's files)
// and wide (every thread's), in a process of 90 threads, about what serve
// has with 200 sources answering at once.
func BenchmarkLookChildren(b *testing.B) {
	stop := make(chan struct{})
	defer close(stop)
	var started sync.WaitGroup
	for range 90 {
		started.Add(1)
		go func() {
			runtime.LockOSThread()
			started.Done()
			<-stop
		}()
	}
	started.Wait()
	defer wideDue.Store(0)
	for _, c := range []struct {
		name string
		wide bool
	}{{"narrow", false}, {"wide", true}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if !lookAs(c.wide) {
					b.Fatal("this benchmark process has children that lead no invocation")
				}
			}
		})
	}
}
