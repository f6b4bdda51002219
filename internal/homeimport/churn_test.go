package homeimport

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"firstmate.dev/fm/internal/home"
)

// [HOME-4] fm doctor looks for what the earlier implementation left while a
// serve runs: serve creates and removes pending markers (and retires
// registrations) in the inbox and registry all the time, so an entry listed
// by the scan may be gone when it is checked. Such an entry is not the
// earlier implementation's and not a failure: Pending must not answer an
// error for it (doctor printed "FAIL import [internal] stat ...pending: no
// such file or directory" under a running serve).
func TestPendingWhileEntriesComeAndGo(t *testing.T) {
	dir := t.TempDir()
	h := &home.Home{Root: dir, Dir: dir, State: filepath.Join(dir, "state")}
	for _, d := range []string{h.State, h.Registrations(), h.Inbox(), h.Invocations()} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := filepath.Join(h.Inbox(), "src."+strconv.Itoa(i)+".pending")
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Error(err)
				return
			}
			os.Remove(p)
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	for n := 0; time.Now().Before(deadline); n++ {
		pending, err := Pending(h)
		if err != nil {
			t.Errorf("scan %d: %v", n, err)
			break
		}
		if len(pending) > 0 {
			t.Errorf("scan %d: %v in a home of fm's", n, pending)
			break
		}
	}
	close(stop)
	<-done
}
