package wake_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"firstmate.dev/fm/internal/cli"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/wake"
)

// "fm" is this test binary (testscript.Main installs it in PATH), and so is
// "wake-appender" (group_process_test.go).
func TestMain(m *testing.M) {
	launch.MaybeBarrier()
	testscript.Main(m, map[string]func(){
		"fm":            func() { os.Exit(cli.Run()) },
		"wake-appender": appender,
	})
}

// [WAKE-1]: `fm wake compact` is crash-safe. A real `fm wake compact`
// killed with SIGKILL at random points leaves the queue exactly as it was
// or exactly compacted, never torn or mixed, always a private 0600 file;
// the high-water mark never goes back, and the next wake continues after
// every queue-seq ever written.
func TestCompactKilledAtRandomPoints(t *testing.T) {
	work, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	home, root := filepath.Join(work, "home"), filepath.Join(work, "root")
	state := filepath.Join(home, "state")
	for _, d := range []string{state, root} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FM_") {
			env = append(env, kv)
		}
	}
	env = append(env, "FM_HOME="+home, "FM_ROOT_OVERRIDE="+root)
	queue := filepath.Join(state, wake.FileName)
	const n = 100_000
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(w, "1700000000\t%d\tcheck\tprocevent:s%d:%d\tcheck: procevent sig s%d %d\n", i, i%50, i, i%50, i)
	}
	w.Flush()
	old := b.Bytes()
	restore := func() {
		t.Helper()
		tmp := queue + ".test"
		if err := os.WriteFile(tmp, old, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, queue); err != nil {
			t.Fatal(err)
		}
	}
	compact := func() *exec.Cmd {
		cmd := exec.Command("fm", "wake", "compact", "--keep", "1000")
		cmd.Env = env
		return cmd
	}
	restore()
	begin := time.Now()
	if out, err := compact().CombinedOutput(); err != nil || string(out) != fmt.Sprintf("compacted: kept=1000 dropped=%d last-seq=%d\n", n-1000, n) {
		t.Fatalf("compact: %v %q", err, out)
	}
	full := time.Since(begin)
	compacted, err := os.ReadFile(queue)
	if err != nil || !bytes.Equal(compacted, old[bytes.Index(old, []byte(fmt.Sprintf("\n1700000000\t%d\t", n-999)))+1:]) {
		t.Fatalf("compacted queue is not the last 1000 lines (%d bytes, %v)", len(compacted), err)
	}
	var olds, news int
	for i := range 40 {
		restore()
		cmd := compact()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rand.Int64N(int64(full) + 1)))
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		data, err := os.ReadFile(queue)
		switch {
		case err != nil:
			t.Fatalf("kill %d: the queue is gone: %v", i, err)
		case bytes.Equal(data, old):
			olds++
		case bytes.Equal(data, compacted):
			news++
		default:
			t.Fatalf("kill %d: the queue is neither the old nor the compacted one (%d bytes)", i, len(data))
		}
		if fi, err := os.Lstat(queue); err != nil || fi.Mode() != 0o600 {
			t.Fatalf("kill %d: queue %v %v", i, fi, err)
		}
		if mark, err := os.ReadFile(filepath.Join(state, wake.MarkName)); err != nil || string(mark) != fmt.Sprint(n)+"\n" {
			t.Fatalf("kill %d: mark %q %v", i, mark, err)
		}
	}
	t.Logf("40 kills within %s: %d left the old queue, %d the compacted one", full.Round(time.Millisecond), olds, news)
	os.WriteFile(queue, compacted, 0o600) // what consumers last saw
	dir, err := os.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if got, err := wake.Append(context.Background(), dir, "check", "k", "p"); err != nil || got.Seq != n+1 {
		t.Fatalf("the next wake after the kills: %+v %v", got, err)
	}
	// A stale temporary file of a killed compaction is removed by the next.
	if out, err := compact().CombinedOutput(); err != nil {
		t.Fatalf("compact: %v %s", err, out)
	}
	names, _ := filepath.Glob(filepath.Join(state, ".wake-queue*"))
	for _, p := range names {
		if base := filepath.Base(p); base != wake.FileName && base != wake.MarkName {
			t.Fatalf("left behind: %s", base)
		}
	}
}

// [WAKE-1]: appends racing real `fm wake compact` processes lose nothing.
// Writers that wait for the lock while a compaction renames a new queue into
// place lock the new file, never append to the replaced one: every wake
// returned by Append is in the final queue, queue-seqs are unique and
// gap-free, and the file is in queue-seq order.
func TestAppendsRacingCompaction(t *testing.T) {
	work, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	home, root := filepath.Join(work, "home"), filepath.Join(work, "root")
	state := filepath.Join(home, "state")
	for _, d := range []string{state, root} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := os.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if _, err := wake.Append(context.Background(), dir, "check", "first", "p"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	compactions := make(chan int)
	go func() {
		n := 0
		defer func() { compactions <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			cmd := exec.Command("fm", "wake", "compact", "--keep", "1000000")
			cmd.Env = append(os.Environ(), "FM_HOME="+home, "FM_ROOT_OVERRIDE="+root)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("compact: %v %s", err, out)
				return
			}
			n++
		}
	}()
	const writers, each = 4, 150
	done := make(chan []int64)
	for w := range writers {
		go func() {
			var seqs []int64
			for i := range each {
				got, err := wake.Append(context.Background(), dir, "check", fmt.Sprintf("w%d-%d", w, i), "p")
				if err != nil {
					t.Error(err)
					break
				}
				seqs = append(seqs, got.Seq)
			}
			done <- seqs
		}()
	}
	appended := 0
	for range writers {
		appended += len(<-done)
	}
	close(stop)
	n := <-compactions
	ws, err := wake.List(state, 0)
	if err != nil {
		t.Fatal(err)
	}
	if appended != writers*each || len(ws) != appended+1 {
		t.Fatalf("%d appended, %d in the queue after %d compactions", appended, len(ws), n)
	}
	for i, w := range ws {
		if w.Seq != int64(i+1) {
			t.Fatalf("wake %d has queue-seq %d after %d compactions", i, w.Seq, n)
		}
	}
	t.Logf("%d appends from %d writers raced %d compactions: none lost", appended, writers, n)
	if n == 0 {
		t.Fatal("no compaction ran during the appends")
	}
}

// [WAKE-1] [WAKE-2] Readers racing compactions never fail: a compaction
// renames a new queue over the one a reader may just have opened, and the
// reader then holds a file with no link left. wake.Exhausted (which a
// runner calls before every poll), ReadStats (fm doctor), List (fm wake
// list) and Recent (a serve's reminders) read the queue now at the name
// instead of refusing it as a hard-linked one ("has 0 hard links").
func TestReadersRacingCompaction(t *testing.T) {
	dir, state := wake.StateDir(t)
	for i := range 20 {
		if _, err := wake.Append(context.Background(), state, "check", fmt.Sprint("k", i), "p"); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	compacted := make(chan int)
	go func() {
		n := 0
		defer func() { compacted <- n }()
		for ; n < 400; n++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := wake.Compact(context.Background(), state, 1000, func(string) bool { return true }); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	reads := 0
	for done := false; !done; reads++ {
		select {
		case n := <-compacted:
			t.Logf("%d reads across %d compactions", reads, n)
			done = true
			continue
		default:
		}
		err := wake.Exhausted(state)
		if err == nil {
			_, err = wake.ReadStats(dir)
		}
		if err == nil {
			_, err = wake.List(dir, 0)
		}
		if err == nil {
			err = wake.Recent(dir, func(wake.Wake) bool { return true })
		}
		if err != nil {
			close(stop)
			<-compacted
			t.Fatalf("read %d racing compactions: %v", reads, err)
		}
	}
}
