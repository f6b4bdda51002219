package adapter_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/pkg/adapter"
	"firstmate.dev/fm/pkg/adapter/adaptertest"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// counter is a source of events: each poll consumes the next one.
type counter struct {
	next   int
	empty  bool
	failed bool
}

func (c *counter) poll() (adapter.PollResult, error) {
	if c.failed {
		return adapter.PollResult{}, adapter.Errorf(adapter.Unavailable, true, "source down")
	}
	if c.empty {
		return adapter.NoResult(), nil
	}
	c.next++
	return adapter.Output("event " + string(rune('0'+c.next))), nil
}

func replayFake(c *counter) *fake {
	f := newFake()
	f.poll = func(_ context.Context, call *adapter.Call, in adapter.PollInput) (adapter.PollResult, error) {
		r, err := call.Replay()
		if err != nil {
			return adapter.PollResult{}, err
		}
		return r.Poll(call, in, c.poll)
	}
	return f
}

func TestReplaySameRequestIDSameAnswer(t *testing.T) {
	c := &counter{}
	h := adaptertest.New(t, replayFake(c))
	id1 := adaptertest.NewRequestID()
	first, fail := h.PollID(id1, "alpha", pollIn)
	if fail != nil || first.Output != "event 1" {
		t.Fatalf("%+v %+v", first, fail)
	}
	// The host retries the same id until it has captured the result.
	for range 3 {
		again, _ := h.PollID(id1, "alpha", pollIn)
		if again != first {
			t.Fatalf("retry answered %+v, want %+v", again, first)
		}
	}
	if c.next != 1 {
		t.Fatalf("source consumed %d events, want 1", c.next)
	}
	// After capture the host sends the next id: a new event.
	second, _ := h.PollID(adaptertest.NewRequestID(), "alpha", pollIn)
	if second.Output != "event 2" {
		t.Fatalf("next id answered %+v", second)
	}
	// Another source keeps its own record.
	other := adapter.PollInput{SourceID: "src-2", ConfigRef: "main"}
	third, _ := h.PollID(id1, "alpha", other)
	if third.Output != "event 3" {
		t.Fatalf("other source answered %+v", third)
	}
	if again, _ := h.PollID(id1, "alpha", pollIn); again.Output == first.Output {
		t.Fatal("a superseded id was replayed")
	}
	fi, err := os.Stat(filepath.Join(h.Env.StateDir, "replay"))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("replay dir: %v %v", fi, err)
	}
}

func TestReplayDoesNotStoreNoResultOrErrors(t *testing.T) {
	c := &counter{empty: true}
	h := adaptertest.New(t, replayFake(c))
	id := adaptertest.NewRequestID()
	if res, _ := h.PollID(id, "alpha", pollIn); res.Status != wire.StatusNoResult {
		t.Fatalf("%+v", res)
	}
	c.empty, c.failed = false, true
	if _, fail := h.PollID(id, "alpha", pollIn); fail == nil || fail.Code != adapter.Unavailable || !fail.Retryable {
		t.Fatalf("%+v", fail)
	}
	// The same id polled again after no-result and after an error must look
	// again, not replay.
	c.failed = false
	if res, _ := h.PollID(id, "alpha", pollIn); res.Output != "event 1" {
		t.Fatalf("%+v", res)
	}
}

func TestReplayStoreLoadForget(t *testing.T) {
	r, err := adapter.OpenReplay(filepath.Join(t.TempDir(), "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	id := adaptertest.NewRequestID()
	rec := adapter.ReplayRecord{RequestID: id, SourceID: "s", Result: adapter.Output("x\ny"), Key: "file-7"}
	if err := r.Store(rec); err != nil {
		t.Fatal(err)
	}
	got, ok, err := r.Load("s", id)
	if err != nil || !ok || got != rec {
		t.Fatalf("load: %+v %v %v", got, ok, err)
	}
	if _, ok, _ := r.Load("s", adaptertest.NewRequestID()); ok {
		t.Fatal("another id hit")
	}
	if _, ok, _ := r.Load("t", id); ok {
		t.Fatal("another source hit")
	}
	fi, _ := os.Stat(filepath.Join(r.Dir(), "s.json"))
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("record mode %v", fi.Mode())
	}
	entries, _ := os.ReadDir(r.Dir())
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
	if err := r.Forget("s"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := r.Load("s", id); ok {
		t.Fatal("forgotten record hit")
	}
	if err := r.Forget("s"); err != nil {
		t.Fatal("forget is not idempotent:", err)
	}

	for name, bad := range map[string]adapter.ReplayRecord{
		"no-result":  {RequestID: id, SourceID: "s", Result: adapter.NoResult()},
		"bad id":     {RequestID: "sha256:1", SourceID: "s", Result: adapter.Output("x")},
		"bad source": {RequestID: id, SourceID: "../s", Result: adapter.Output("x")},
		"big key":    {RequestID: id, SourceID: "s", Result: adapter.Output("x"), Key: strings.Repeat("k", 4097)},
	} {
		if err := r.Store(bad); err == nil {
			t.Errorf("%s: stored", name)
		}
	}
	if _, err := adapter.OpenReplay("relative/dir"); err == nil {
		t.Error("relative directory accepted")
	}
	if _, err := (&adapter.Call{}).Replay(); err == nil {
		t.Error("Call.Replay without a state dir succeeded")
	}
}

func TestReplayCorruptRecordPollsAfresh(t *testing.T) {
	c := &counter{}
	h := adaptertest.New(t, replayFake(c))
	id := adaptertest.NewRequestID()
	h.PollID(id, "alpha", pollIn)
	p := filepath.Join(h.Env.StateDir, "replay", pollIn.SourceID+".json")
	if err := os.WriteFile(p, []byte(`{"schema":"x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	res, fail := h.PollID(id, "alpha", pollIn)
	if fail != nil || res.Output != "event 2" {
		t.Fatalf("%+v %+v", res, fail)
	}
	if _, ok, err := (mustOpen(t, filepath.Dir(p))).Load(pollIn.SourceID, id); !ok || err != nil {
		t.Fatalf("record not rewritten: %v %v", ok, err)
	}
}

func mustOpen(t *testing.T, dir string) *adapter.Replay {
	r, err := adapter.OpenReplay(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// [OP-3] The replay store reads its records as it always did: a record left
// read-only (written under umask 0277) with a second link (a backup), in a
// store directory an operator made group-writable, is still replayed, since
// refusing it after an SDK upgrade would lose its event. A symlinked record
// is still refused.
func TestReplayKeepsOldRecordsReadable(t *testing.T) {
	r, err := adapter.OpenReplay(filepath.Join(t.TempDir(), "replay"))
	if err != nil {
		t.Fatal(err)
	}
	id := adaptertest.NewRequestID()
	rec := adapter.ReplayRecord{RequestID: id, SourceID: "s", Result: adapter.Output("x")}
	if err := r.Store(rec); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(r.Dir(), "s.json")
	if err := os.Chmod(p, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(p, filepath.Join(t.TempDir(), "backup.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(r.Dir(), 0o770); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := r.Load("s", id); err != nil || !ok || got != rec {
		t.Fatalf("load of a 0400 record with two links: %+v %v %v", got, ok, err)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(t.TempDir(), "s.json")
	if err := os.WriteFile(elsewhere, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, p); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := r.Load("s", id); err == nil || ok {
		t.Fatalf("a symlinked record was read: ok %v err %v", ok, err)
	}
}
