package dirsignal_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"firstmate.dev/fm/examples/go-adapter/dirsignal"
	"firstmate.dev/fm/pkg/adapter"
	"firstmate.dev/fm/pkg/adapter/adaptertest"
)

// setup returns a harness for a dir-signal handler with a short wait, the
// watched directory, and the poll input for source "src".
func setup(t *testing.T) (*adaptertest.Harness, string, adapter.PollInput) {
	t.Helper()
	h := adaptertest.New(t, &dirsignal.Handler{Wait: 150 * time.Millisecond, Interval: 10 * time.Millisecond})
	dir := t.TempDir()
	return h, dir, adapter.PollInput{SourceID: "src", ConfigRef: "dir:" + dir}
}

func write(t *testing.T, dir, name, content string, age time.Duration) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	mt := time.Now().Add(-age)
	if err := os.Chtimes(p, mt, mt); err != nil {
		t.Fatal(err)
	}
}

func poll(t *testing.T, h *adaptertest.Harness, in adapter.PollInput) adapter.PollResult {
	t.Helper()
	res, fail := h.Poll(dirsignal.AdapterName, in)
	if fail != nil {
		t.Fatalf("poll failed: %+v", *fail)
	}
	return res
}

func TestManifestMatchesHandler(t *testing.T) {
	m := adaptertest.CheckManifest(t, filepath.Join("..", "firstmate-extension.json"), dirsignal.New())
	if m.Entrypoint != "bin/firstmate-extension" || len(m.RequiredConsents) != 1 || m.RequiredConsents[0] != "artifact-references" {
		t.Fatalf("manifest %+v", m)
	}
}

func TestHandshake(t *testing.T) {
	h := adaptertest.New(t, dirsignal.New())
	if resp, out := h.Handshake(h.HandshakeRequest(dirsignal.AdapterName)); resp == nil {
		t.Fatalf("handshake refused: %s", out.Stderr)
	}
	if resp, _ := h.Handshake(h.HandshakeRequest("file-signal")); resp != nil {
		t.Fatal("handshake accepted an adapter this package does not provide")
	}
}

func TestPollEmptyDirectoryIsNoResult(t *testing.T) {
	h, _, in := setup(t)
	start := time.Now()
	if res := poll(t, h, in); res != adapter.NoResult() {
		t.Fatalf("got %+v", res)
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 5*time.Second {
		t.Fatalf("waited %v, want about the handler's wait", d)
	}
}

func TestPollDeliversEachFileOnceOldestFirst(t *testing.T) {
	h, dir, in := setup(t)
	write(t, dir, "b-newer", "second\n", time.Minute)
	write(t, dir, "a-older", "first\n", time.Hour)
	write(t, dir, ".partial.tmp", "hidden", 2*time.Hour)
	if err := os.Mkdir(filepath.Join(dir, "subdir"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "a-older"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"first\n", "second\n"} {
		if res := poll(t, h, in); res != adapter.Output(want) {
			t.Fatalf("got %+v, want %q", res, want)
		}
	}
	if res := poll(t, h, in); res != adapter.NoResult() {
		t.Fatalf("got %+v after both files were delivered", res)
	}
	// Each source has its own delivered set.
	other := in
	other.SourceID = "other"
	if res := poll(t, h, other); res != adapter.Output("first\n") {
		t.Fatalf("other source got %+v", res)
	}
}

func TestPollPicksUpFileArrivingDuringWait(t *testing.T) {
	h, dir, in := setup(t)
	h.Handler = &dirsignal.Handler{Wait: 5 * time.Second, Interval: 10 * time.Millisecond}
	go func() {
		time.Sleep(100 * time.Millisecond)
		os.WriteFile(filepath.Join(dir, ".x.tmp"), []byte("arrived"), 0o600)
		os.Rename(filepath.Join(dir, ".x.tmp"), filepath.Join(dir, "x"))
	}()
	start := time.Now()
	if res := poll(t, h, in); res != adapter.Output("arrived") {
		t.Fatalf("got %+v", res)
	}
	if time.Since(start) > 4*time.Second {
		t.Fatal("the file was not picked up during the wait")
	}
}

func TestSameRequestIDReplaysAnswer(t *testing.T) {
	h, dir, in := setup(t)
	write(t, dir, "one", "1", time.Hour)
	id := adaptertest.NewRequestID()
	first, fail := h.PollID(id, dirsignal.AdapterName, in)
	if fail != nil || first != adapter.Output("1") {
		t.Fatalf("%+v %+v", first, fail)
	}
	// The file is gone and another arrived, but the host retries the same
	// id (it has not captured the answer yet): same answer.
	os.Remove(filepath.Join(dir, "one"))
	write(t, dir, "two", "2", 0)
	again, fail := h.PollID(id, dirsignal.AdapterName, in)
	if fail != nil || again != first {
		t.Fatalf("retry got %+v %+v, want %+v", again, fail, first)
	}
	// The next id gets the next file.
	if res := poll(t, h, in); res != adapter.Output("2") {
		t.Fatalf("got %+v", res)
	}
}

// A crash after the answer was stored but before the file was marked
// delivered: the retry with the same id replays the answer and marks the
// file, so the next id does not deliver it again.
func TestReplayFinishesDeliveryAfterCrash(t *testing.T) {
	h, dir, in := setup(t)
	write(t, dir, "one", "1", time.Hour)
	id := adaptertest.NewRequestID()
	r, err := adapter.OpenReplay(filepath.Join(h.Env.StateDir, "replay"))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Store(adapter.ReplayRecord{RequestID: id, SourceID: in.SourceID, Result: adapter.Output("1"), Key: "one"}); err != nil {
		t.Fatal(err)
	}
	if res, _ := h.PollID(id, dirsignal.AdapterName, in); res != adapter.Output("1") {
		t.Fatalf("got %+v", res)
	}
	if res := poll(t, h, in); res != adapter.NoResult() {
		t.Fatalf("file delivered twice: %+v", res)
	}
}

func TestFileBounds(t *testing.T) {
	h, dir, in := setup(t)
	write(t, dir, "a-too-big", strings.Repeat("x", dirsignal.MaxFileBytes+1), 5*time.Hour)
	write(t, dir, "b-not-utf8", "a\xffb", 4*time.Hour)
	write(t, dir, "c-empty", "", 3*time.Hour)
	write(t, dir, "d-exact", strings.Repeat("y", dirsignal.MaxFileBytes), 2*time.Hour)
	if res := poll(t, h, in); res != adapter.Output(strings.Repeat("y", dirsignal.MaxFileBytes)) {
		t.Fatalf("got %d bytes (%s)", len(res.Output), res.Status)
	}
	if res := poll(t, h, in); res != adapter.NoResult() {
		t.Fatalf("got %+v", res)
	}
	// An empty file is delivered once it has content.
	write(t, dir, "c-empty", "now full", 0)
	if res := poll(t, h, in); res != adapter.Output("now full") {
		t.Fatalf("got %+v", res)
	}
}

func TestConfigRef(t *testing.T) {
	h, dir, _ := setup(t)
	for _, ref := range []string{"file:" + dir, "dir:", "dir:relative/path", "dir:" + dir + "/", "dir:" + dir + "/../x", dir} {
		_, fail := h.Poll(dirsignal.AdapterName, adapter.PollInput{SourceID: "s", ConfigRef: ref})
		if fail == nil || fail.Code != adapter.InvalidRequest || fail.Retryable {
			t.Errorf("config_ref %q: got %+v, want invalid-request", ref, fail)
		}
	}
	_, fail := h.Poll(dirsignal.AdapterName, adapter.PollInput{SourceID: "s", ConfigRef: "dir:" + filepath.Join(dir, "missing")})
	if fail == nil || fail.Code != adapter.Unavailable || !fail.Retryable {
		t.Errorf("missing directory: got %+v, want unavailable, retryable", fail)
	}
}

func TestCancelledPollReturnsPromptly(t *testing.T) {
	h, _, in := setup(t)
	h.Handler = &dirsignal.Handler{Wait: time.Hour, Interval: 10 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	h.Context = ctx
	start := time.Now()
	if res := poll(t, h, in); res != adapter.NoResult() {
		t.Fatalf("got %+v", res)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("poll ignored cancellation")
	}
}

func TestVerdicts(t *testing.T) {
	h := adaptertest.New(t, dirsignal.New())
	for _, content := range []string{"deploy finished\n", `{"code":"timeout","extension_id":"org.firstmate.example.dir-signal","operation":"source.poll","schema":"firstmate.process-event-extension-error.v1"}`} {
		in := adapter.ResultInput{SourceID: "src", Sequence: 3, Content: content}
		if c, fail := h.Classify(dirsignal.AdapterName, in); fail != nil || c.Classification != "dir-signal" {
			t.Errorf("classify: %+v %+v", c, fail)
		}
		if v, fail := h.Terminal(dirsignal.AdapterName, in); fail != nil || v {
			t.Errorf("terminal: %v %+v", v, fail)
		}
		if v, fail := h.Silent(dirsignal.AdapterName, in); fail != nil || v {
			t.Errorf("silent: %v %+v", v, fail)
		}
	}
}

func TestStateIsPrivate(t *testing.T) {
	h, dir, in := setup(t)
	write(t, dir, "one", "1", 0)
	poll(t, h, in)
	for _, p := range []string{"replay", "replay/src.json", "dir-signal", "dir-signal/src.delivered.json"} {
		fi, err := os.Stat(filepath.Join(h.Env.StateDir, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s has mode %v", p, fi.Mode().Perm())
		}
	}
}
