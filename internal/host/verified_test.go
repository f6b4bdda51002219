package host_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// [INV-1] an invoke that changes the installed package while it runs (here:
// its own entrypoint, in place, mode restored) has its answer refused with
// integrity-mismatch, and since the tree no longer matches its binding, every
// later call of the binding is refused before any package code runs. The
// home's confinement is off: under it the kernel refuses the write.
func TestInvokeTamperRefusesResultAndBinding(t *testing.T) {
	f := bound(t, 20000)
	if err := confine.WriteMode(f.h.Config(), confine.Off); err != nil {
		t.Fatal(err)
	}
	_, err := f.poll(t, "tamper")
	if errcode.Of(err) != errcode.IntegrityMismatch {
		t.Fatalf("tampering invoke: got %v, want integrity-mismatch", err)
	}
	before, _ := os.ReadFile(filepath.Join(f.state, "requests"))
	for range 3 {
		if _, err := f.poll(t, "good"); errcode.Of(err) != errcode.IntegrityMismatch {
			t.Fatalf("later invoke: got %v, want integrity-mismatch", err)
		}
		if err := host.Handshake(context.Background(), f.h, &f.b.Record, f.b.Digest); errcode.Of(err) != errcode.IntegrityMismatch {
			t.Fatalf("later handshake: got %v, want integrity-mismatch", err)
		}
	}
	if after, _ := os.ReadFile(filepath.Join(f.state, "requests")); string(after) != string(before) {
		t.Fatal("package code ran after the tree stopped matching its binding")
	}
	assertNoRecords(t, f.h)
}

// [INV-1] a file of the tree replaced during a call by another inode with the
// very same bytes (the digest still matches) is tamper evidence as well: the
// call's answer is refused. A copy put in place between two calls is not:
// the next call verifies the tree afresh, and runs.
func TestSameBytesReplacementDuringCallRefused(t *testing.T) {
	f := bound(t, 20000)
	manifest := filepath.Join(f.b.PackageRoot, "firstmate-extension.json")
	scratch := filepath.Join(f.h.Root, "scratch")
	if err := os.Mkdir(scratch, 0o700); err != nil {
		t.Fatal(err)
	}
	replace := func() {
		data, err := os.ReadFile(manifest)
		if err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(scratch, "m")
		if err := os.WriteFile(tmp, data, 0o444); err != nil {
			t.Fatal(err)
		}
		if err := testpkg.WithWritableDir(filepath.Dir(manifest), func() error { return os.Rename(tmp, manifest) }); err != nil {
			t.Fatal(err)
		}
	}
	replace()
	if _, err := f.poll(t, "keep"); err != nil {
		t.Fatalf("a same-bytes copy installed between calls: %v", err)
	}
	// During a call: the poll waits for its signal file; the copy is put in
	// place while it waits, then the signal is given.
	requests := filepath.Join(f.state, "requests")
	os.Remove(requests)
	done := make(chan error, 1)
	if err := testpkg.SetMode(f.state, "invoke", "signal:10"); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := host.Invoke(context.Background(), f.h, f.b, host.Poll,
			wire.PollInput{SourceID: "src", ConfigRef: "main"}, host.Call{Adapter: "fake"})
		done <- err
	}()
	deadline := time.Now().Add(20 * time.Second)
	for b, _ := os.ReadFile(requests); !strings.Contains(string(b), wire.RequestSchema); b, _ = os.ReadFile(requests) {
		if time.Now().After(deadline) {
			t.Fatal("the invoke never started")
		}
		time.Sleep(2 * time.Millisecond)
	}
	replace()
	if err := os.WriteFile(filepath.Join(f.state, "signal.src"), []byte("go"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := <-done; errcode.Of(err) != errcode.IntegrityMismatch {
		t.Fatalf("got %v, want integrity-mismatch", err)
	}
	assertNoRecords(t, f.h)
}

// tally counts the outcomes of hostile calls by code ("ok" for success).
type tally map[string]int

func (ty tally) String() string {
	var parts []string
	for _, k := range []string{"ok", string(errcode.IntegrityMismatch), string(errcode.ModeUnsafe)} {
		parts = append(parts, fmt.Sprintf("%s %d", k, ty[k]))
	}
	for k, n := range ty {
		if k != "ok" && k != string(errcode.IntegrityMismatch) && k != string(errcode.ModeUnsafe) {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	return strings.Join(parts, ", ")
}

// [INV-1] hostile review: while another process keeps renaming a different
// executable over the installed entrypoint, no call ever runs it. Each
// invoke (handshake, then invoke) and each bare handshake either runs the
// verified bytes and answers, or is refused: integrity-mismatch, or, for an
// unprivileged owner caught with the directory made writable for a rename,
// mode-unsafe, both before any package code runs or as tamper evidence after.
func TestSwapperNeverRunsReplacement(t *testing.T) {
	for _, verb := range []string{"invoke", "handshake"} {
		t.Run(verb, func(t *testing.T) {
			f := bound(t, 20000)
			scratch := filepath.Join(f.h.Root, "scratch")
			if err := os.Mkdir(scratch, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := testpkg.SetMode(f.state, "invoke", "good"); err != nil {
				t.Fatal(err)
			}
			sw := testpkg.StartSwapper(t, filepath.Join(f.b.PackageRoot, f.b.Entrypoint), scratch)
			call := func() error {
				if verb == "handshake" {
					return host.Handshake(context.Background(), f.h, &f.b.Record, f.b.Digest)
				}
				res, err := host.Invoke(context.Background(), f.h, f.b, host.Poll,
					wire.PollInput{SourceID: "src", ConfigRef: "main"}, host.Call{Adapter: "fake"})
				if err == nil && res.Output != "hello from fake" {
					t.Fatalf("an answer that is not the verified entrypoint's: %+v", res)
				}
				return err
			}
			n := testpkg.HostileCalls(t, 200)
			ty := tally{}
			for i := range n {
				if i%10 == 9 {
					// Every tenth call runs with the swapper held: it must
					// run the verified bytes and answer.
					var err error
					if qerr := sw.Quiet(func() { err = call() }); qerr != nil {
						t.Fatal(qerr)
					}
					if err != nil {
						t.Fatalf("a call without a swap failed: %v", err)
					}
					ty["ok"]++
					continue
				}
				err := call()
				switch c := errcode.Of(err); {
				case err == nil:
					ty["ok"]++
				case c == errcode.IntegrityMismatch || c == errcode.ModeUnsafe:
					ty[string(c)]++
				default:
					t.Fatalf("a call failed otherwise: %v", err)
				}
			}
			sw.Stop()
			runs, err := sw.Runs()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("uid %d, %s: %d calls, %d swaps: %s; replacement ran %d times", os.Geteuid(), verb, n, sw.Swaps.Load(), ty, runs)
			if runs != 0 {
				t.Fatalf("the replacement ran %d times", runs)
			}
			if ty["ok"] == n {
				t.Errorf("no call raced a swap: %s", ty)
			}
			assertNoRecords(t, f.h)
		})
	}
}
