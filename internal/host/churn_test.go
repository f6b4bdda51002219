package host_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/procstat"
	"firstmate.dev/fm/internal/strictjson"
)

// [LIFE-2] [RUN-3] retire-binding's release of invocations under churn: an
// invocation of a live host that pins the binding and ends between the
// cleanup (which keeps its record: its host is alive) and the second look
// at the pins no longer pins anything, so the release succeeds; while the
// record is there it is binding-in-use. Never process-cleanup-failed for a
// record that is gone. Here this test process is the live host, and its
// record comes and goes without pause.
func TestReleaseInvocationsUnderChurn(t *testing.T) {
	boot, err := launch.BootID()
	if err != nil {
		t.Skip("no boot id:", err)
	}
	st, err := procstat.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	self := launch.Identity{PID: os.Getpid(), StartTime: st.Start, BootID: boot}
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h := &home.Home{Root: base, Dir: base, State: filepath.Join(base, "state")}
	if err := home.EnsurePrivate(h.Invocations(), true); err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + strings.Repeat("b", 64)
	pid := 4242
	rec := launch.Record{Schema: launch.RecordSchema, Phase: launch.PhaseGroup, GroupPID: &pid,
		Leader: &launch.Identity{PID: pid, StartTime: 123456, BootID: self.BootID}, Host: self,
		ExtensionID: "org.example.a", BindingDigest: digest, RequestID: "sha256:" + strings.Repeat("c", 64),
		SourceID: "src", Operation: "source.poll", CreatedAt: 1700000000}
	data, err := strictjson.Canonical(&rec)
	if err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(h.Invocations(), strings.ReplaceAll(self.BootID, "-", "")+fmt.Sprintf("%032x", 1)+".owner.json")
	tmp := filepath.Join(base, "record")
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			if err := os.WriteFile(tmp, data, 0o600); err != nil {
				panic(err)
			}
			if err := os.Rename(tmp, name); err != nil {
				panic(err)
			}
			os.Remove(name)
		}
	}()
	outcomes := map[string]int{}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		err := host.ReleaseInvocations(h, digest)
		if err == nil {
			outcomes["released"]++
		} else {
			outcomes[string(errcode.Of(err))]++
		}
		if err != nil && !errcode.Is(err, errcode.BindingInUse) {
			stop.Store(true)
			<-done
			t.Fatalf("after %v: %v", outcomes, err)
		}
	}
	stop.Store(true)
	<-done
	t.Logf("releases: %v", outcomes)
}
