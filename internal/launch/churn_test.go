package launch_test

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/strictjson"
)

// [GRP-1] [RUN-3] The owner-record reader under churn: while a writer keeps
// publishing records (a temp name renamed into place, over an older record
// too) and removing them, as invocations start and end, List never fails:
// a record gone between the listing and its read ended, and one replaced
// after its open is read again.
func TestListUnderChurn(t *testing.T) {
	dir, boot := recordsDir(t)
	rec := groupRecord(boot, 4242, "src")
	good, err := strictjson.Canonical(&rec)
	if err != nil {
		t.Fatal(err)
	}
	name := func(i int) string {
		return filepath.Join(dir, recordName(boot, i%16))
	}
	var stop atomic.Bool
	var changes atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		tmp := filepath.Join(t.TempDir(), "r")
		for i := 0; !stop.Load(); i++ {
			if err := os.WriteFile(tmp, good, 0o600); err != nil {
				panic(err)
			}
			if err := os.Rename(tmp, name(i)); err != nil { // new, or over an older record
				panic(err)
			}
			if i%3 == 0 {
				os.Remove(name(i + 7))
			}
			changes.Add(1)
		}
	}()
	lists := 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); lists++ {
		if _, err := launch.List(dir); err != nil {
			stop.Store(true)
			<-done
			t.Fatalf("list %d (after %d changes): %v", lists, changes.Load(), err)
		}
	}
	stop.Store(true)
	<-done
	t.Logf("%d listings during %d record changes, none failed", lists, changes.Load())
}
