package launch

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"testing"

	"firstmate.dev/fm/internal/launch/barrier"
)

// TestBarrierStartsBeforeTheRestOfFm: a barrier [GRP-1] initialises os and what os
// needs, then becomes the entrypoint; none of the packages the rest of fm
// needs (and this test binary holds) is initialised first. The runtime's
// init trace (GODEBUG=inittrace=1, one line per package initialised, on
// standard error) of this test binary run as a barrier is the evidence.
// Without package barrier's own small import set the barrier waited for
// reflect, unicode, crypto, both JSON packages and golang.org/x/sys/unix
// (docs/performance.md, "Ninth pass").
func TestBarrierStartsBeforeTheRestOfFm(t *testing.T) {
	cmd := exec.Command(os.Args[0], BarrierArg, "/bin/true", "verb")
	cmd.Env = barrier.Env([]string{"GODEBUG=inittrace=1"})
	cmd.ExtraFiles = []*os.File{releasedPipe(t)}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("barrier to /bin/true: %v; stderr:\n%s", err, stderr.String())
	}
	var inited []string
	for _, m := range regexp.MustCompile(`(?m)^init (\S+) @`).FindAllStringSubmatch(stderr.String(), -1) {
		inited = append(inited, m[1])
	}
	if !slices.Contains(inited, "os") {
		t.Fatalf("no init trace of os; stderr:\n%s", stderr.String())
	}
	for _, pkg := range []string{"reflect", "unicode", "golang.org/x/sys/unix", "crypto/sha256",
		"encoding/json", "github.com/go-json-experiment/json", "firstmate.dev/fm/internal/fsutil", "testing"} {
		if slices.Contains(inited, pkg) {
			t.Errorf("%s was initialised before the barrier ran; init order: %v", pkg, inited)
		}
	}
}

// releasedPipe is the read end of a pipe that holds the release byte and
// has no writer left: descriptor 3 of a barrier released at once. It is
// closed when the test ends.
func releasedPipe(t *testing.T) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	defer w.Close()
	if _, err := w.Write([]byte{barrier.ReleaseByte}); err != nil {
		t.Fatal(err)
	}
	return r
}
