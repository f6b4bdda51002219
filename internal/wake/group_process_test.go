package wake_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/wake"
)

// appender is the command wake-appender <state-dir> <goroutines> <each>
// <prefix>: its goroutines append <each> wakes apiece (0: until killed),
// keys <prefix>-<goroutine>-<i>, and print "<queue-seq> <key>" for each
// wake the moment Append returns it.
func appender() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	state, err := os.Open(os.Args[1])
	if err != nil {
		fail(err)
	}
	workers, err1 := strconv.Atoi(os.Args[2])
	each, err2 := strconv.Atoi(os.Args[3])
	if err1 != nil || err2 != nil {
		fail(fmt.Errorf("usage: wake-appender <state-dir> <goroutines> <each> <prefix>"))
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for i := 0; each == 0 || i < each; i++ {
				key := fmt.Sprintf("%s-%d-%d", os.Args[4], g, i)
				w, err := wake.Append(context.Background(), state, "check", key, "p")
				if err != nil {
					fail(err)
				}
				mu.Lock()
				fmt.Fprintf(os.Stdout, "%d %s\n", w.Seq, key)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	os.Exit(0)
}

// startAppender starts wake-appender on dir and returns it with a scanner
// of its printed lines.
func startAppender(t *testing.T, dir string, workers, each int, prefix string) (cmd *exec.Cmd, lines *bufio.Scanner) {
	t.Helper()
	cmd = exec.Command("wake-appender", dir, strconv.Itoa(workers), strconv.Itoa(each), prefix)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, bufio.NewScanner(out)
}

// queued lists the queue in dir by key, failing on a queue-seq given twice.
func queued(t *testing.T, dir string) (map[string]wake.Wake, []wake.Wake) {
	t.Helper()
	ws, err := wake.List(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]wake.Wake{}
	for i, w := range ws {
		if i > 0 && w.Seq <= ws[i-1].Seq {
			t.Fatalf("queue-seq %d follows %d", w.Seq, ws[i-1].Seq)
		}
		byKey[w.Key] = w
	}
	return byKey, ws
}

// [WAKE-1]: a process killed with SIGKILL in the middle of its batches
// loses no wake an Append of it returned: 32 goroutines of a real child
// process append until it is killed at a random moment; every wake it
// printed is in the queue with its queue-seq, the mark is at least the last
// of them, and the next append, after any torn tail, continues past every
// queue-seq the queue and the mark hold.
func TestAppendKilledMidBatchLosesNoReturnedWake(t *testing.T) {
	dir, state := wake.StateDir(t)
	returned, torn := 0, 0
	for kill := range 12 {
		cmd, lines := startAppender(t, dir, 32, 0, fmt.Sprintf("kill%d", kill))
		printed := map[string]int64{}
		want := 1 + rand.IntN(300)
		for len(printed) < want && lines.Scan() {
			f := strings.Fields(lines.Text())
			seq, _ := strconv.ParseInt(f[0], 10, 64)
			printed[f[1]] = seq
		}
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		cmd.Process.Signal(syscall.SIGKILL)
		for lines.Scan() { // printed before the kill
			f := strings.Fields(lines.Text())
			seq, _ := strconv.ParseInt(f[0], 10, 64)
			printed[f[1]] = seq
		}
		cmd.Wait()
		if len(printed) < want {
			t.Fatalf("kill %d: the appender printed %d wakes before it ended", kill, len(printed))
		}
		byKey, ws := queued(t, dir)
		top := int64(0)
		for key, seq := range printed {
			if w, ok := byKey[key]; !ok || w.Seq != seq {
				t.Fatalf("kill %d: returned wake %s (queue-seq %d) is not in the queue (%+v)", kill, key, seq, w)
			}
			top = max(top, seq)
		}
		mark, err := os.ReadFile(dir + "/" + wake.MarkName)
		m, _ := strconv.ParseInt(strings.TrimSpace(string(mark)), 10, 64)
		if err != nil || m < top || m < ws[len(ws)-1].Seq {
			t.Fatalf("kill %d: mark %q %v below the last returned %d or the last line %d", kill, mark, err, top, ws[len(ws)-1].Seq)
		}
		data, _ := os.ReadFile(dir + "/" + wake.FileName)
		if len(data) > 0 && data[len(data)-1] != '\n' {
			torn++
		}
		w, err := wake.Append(context.Background(), state, "check", fmt.Sprintf("after%d", kill), "p")
		if err != nil || w.Seq != m+1 {
			t.Fatalf("kill %d: the next append gave %+v %v, want queue-seq %d", kill, w, err, m+1)
		}
		returned += len(printed)
	}
	t.Logf("12 kills: %d returned wakes all kept; %d kills left a torn tail", returned, torn)
}

// [WAKE-1]: another process's appends interleave with this process's
// batches: each holds the same lock, so the queue-seqs of both are unique
// and consecutive, every line is the wake its append returned, and the mark
// is the last.
func TestAppendBatchesInterleaveWithOtherProcess(t *testing.T) {
	dir, state := wake.StateDir(t)
	const workers, each = 16, 15
	cmd, lines := startAppender(t, dir, 4, 60, "child")
	var mu sync.Mutex
	mine := map[string]wake.Wake{}
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("parent-%d-%d", g, i)
				w, err := wake.Append(context.Background(), state, "check", key, "p")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				mine[key] = w
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	child := map[string]int64{}
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		seq, _ := strconv.ParseInt(f[0], 10, 64)
		child[f[1]] = seq
	}
	if err := cmd.Wait(); err != nil || len(child) != 240 || len(mine) != workers*each {
		t.Fatalf("child %v printed %d wakes; %d of ours", err, len(child), len(mine))
	}
	byKey, ws := queued(t, dir)
	if len(ws) != 240+workers*each {
		t.Fatalf("%d wakes in the queue", len(ws))
	}
	interleaved := false
	for i, w := range ws {
		if w.Seq != int64(i+1) {
			t.Fatalf("line %d has queue-seq %d", i+1, w.Seq)
		}
		if i > 0 && strings.HasPrefix(w.Key, "child") != strings.HasPrefix(ws[i-1].Key, "child") {
			interleaved = true
		}
	}
	for key, w := range mine {
		if byKey[key] != w {
			t.Fatalf("our append returned %+v, the queue holds %+v", w, byKey[key])
		}
	}
	for key, seq := range child {
		if byKey[key].Seq != seq {
			t.Fatalf("the child's append returned %s at %d, the queue holds %+v", key, seq, byKey[key])
		}
	}
	if mark, err := os.ReadFile(dir + "/" + wake.MarkName); err != nil || string(mark) != fmt.Sprintf("%d\n", len(ws)) {
		t.Fatalf("mark %q %v", mark, err)
	}
	t.Logf("interleaved: %v", interleaved)
}
