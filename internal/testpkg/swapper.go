package testpkg

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// HostileCalls is how many calls a hostile-review test makes: ci (what CI
// runs, sized to its time), or FM_HOSTILE_CALLS (the review's runs use 1000;
// see docs/reliability.md).
func HostileCalls(t *testing.T, ci int) int {
	if v := os.Getenv("FM_HOSTILE_CALLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("FM_HOSTILE_CALLS=%q", v)
		}
		return n
	}
	return ci
}

// Swapper renames executables over an installed entrypoint until stopped:
// alternately a replacement, a shell script that proves it ran by appending
// to Marker, and a fresh copy of the verified bytes (so that calls keep being
// verified between swaps). It works from a scratch directory on the store's
// file system and, not being root, makes the 0555 directory writable for
// each rename.
type Swapper struct {
	Entrypoint, Marker string
	Swaps              atomic.Int64
	scratch            string
	good, evil         []byte
	mu                 sync.Mutex // held for each rename, and by Quiet
	stop               chan struct{}
	done               sync.WaitGroup
	err                error
}

// StartSwapper starts swapping over entrypoint; scratch is a private
// directory on the same file system.
func StartSwapper(t *testing.T, entrypoint, scratch string) *Swapper {
	t.Helper()
	good, err := os.ReadFile(entrypoint)
	if err != nil {
		t.Fatal(err)
	}
	sw := &Swapper{Entrypoint: entrypoint, Marker: filepath.Join(scratch, "replacement-ran"), scratch: scratch, good: good, stop: make(chan struct{})}
	sw.evil = []byte("#!/bin/sh\necho ran >>" + sw.Marker + "\nprintf '{\"replacement\":true}'\n")
	sw.done.Add(1)
	go func() {
		defer sw.done.Done()
		for k := 0; ; k++ {
			select {
			case <-sw.stop:
				return
			default:
			}
			sw.mu.Lock()
			err := sw.place(k%2 == 0)
			sw.mu.Unlock()
			if err != nil {
				sw.err = err
				return
			}
			// The replacement stays briefly, the verified bytes longer.
			pause := 1000
			if k%2 == 1 {
				pause = 15000
			}
			time.Sleep(time.Duration(rand.IntN(pause)) * time.Microsecond)
		}
	}()
	t.Cleanup(sw.Stop)
	return sw
}

// place renames a fresh copy of the replacement (evil) or of the verified
// bytes over the entrypoint.
func (sw *Swapper) place(evil bool) error {
	data := sw.good
	if evil {
		data = sw.evil
	}
	tmp := filepath.Join(sw.scratch, "swap")
	err := os.WriteFile(tmp, data, 0o555)
	if err == nil {
		err = os.Chmod(tmp, 0o555) // the umask must not decide
	}
	if err == nil {
		err = WithWritableDir(filepath.Dir(sw.Entrypoint), func() error { return os.Rename(tmp, sw.Entrypoint) })
	}
	if err == nil {
		sw.Swaps.Add(1)
	}
	return err
}

// Quiet runs fn with the swapper held and a copy of the verified bytes in
// place.
func (sw *Swapper) Quiet(fn func()) error {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if err := sw.place(false); err != nil {
		return err
	}
	fn()
	return nil
}

// Stop stops the swapper.
func (sw *Swapper) Stop() {
	select {
	case <-sw.stop:
		return
	default:
	}
	close(sw.stop)
	sw.done.Wait()
}

// Runs reports how many times the replacement ran, and the swapper's error.
func (sw *Swapper) Runs() (int, error) {
	b, err := os.ReadFile(sw.Marker)
	if os.IsNotExist(err) {
		return 0, sw.err
	}
	if err != nil {
		return 0, err
	}
	return strings.Count(string(b), "ran"), sw.err
}

// WithWritableDir runs fn with dir made writable by its owner, as the
// unprivileged owner of a 0555 store directory must before renaming in it
// (root needs no mode change: it runs fn as is).
func WithWritableDir(dir string, fn func() error) error {
	if os.Geteuid() == 0 {
		return fn()
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	defer os.Chmod(dir, 0o555)
	return fn()
}
