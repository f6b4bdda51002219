package adapter

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// ReplaySchema is the schema string of a Replay record file.
const ReplaySchema = "firstmate.adapter-sdk-replay.v1"

// Replay makes source.poll idempotent on the request id.
//
// The host derives a poll's request id from the registration generation and
// the source's next sequence number (spec [RID-1]). The sequence advances
// only when the host durably captures something for the source: your output,
// or failure evidence when your answer was refused (timeout, crash, invalid
// or oversize response, leaked process). Until then every poll of the source
// carries the same id: after a no-result answer, and after the host was
// stopped or crashed between receiving your answer and capturing it. In the
// second case your answer was lost on the host's side; if producing it
// consumed an event (from a queue, a directory, a cursor), the retried id
// must get the same answer back, or the event is gone.
//
// Replay keeps, per source id, the last status=result answer and the request
// id it answered, in one small file under a directory (normally
// FIRSTMATE_EXTENSION_STATE/replay, see Call.Replay). Because the host moves
// to a new id only after capturing something for the previous one (or after
// the source was re-registered, which starts a new generation), one record
// per source is enough: a new id for a source means the stored answer is no
// longer needed. no-result answers are never stored: a poll that found
// nothing is repeated with the same id and must look again.
//
// An answer the host refused is not retried: the host captures failure
// evidence instead and moves on, so what that answer consumed is not
// delivered (Firstmate promises no exactly-once delivery). Answer well inside
// the bounds to avoid this.
//
// A direct operator call (fm extension process-event … source.poll) uses a
// fresh random id; if it returns a result it replaces the record of its
// source, like any other new id.
type Replay struct {
	dir string
}

// ReplayRecord is one stored answer.
type ReplayRecord struct {
	// RequestID is the request id the answer was given to.
	RequestID string `json:"request_id"`
	// SourceID is the source the answer belongs to.
	SourceID string `json:"source_id"`
	// Result is the answer: always status "result".
	Result PollResult `json:"result"`
	// Key is free for the adapter: typically what the answer consumed (a
	// file name, a queue offset), so that a replay can finish committing
	// that consumption if the process died before doing so. At most 4,096
	// bytes of UTF-8.
	Key string `json:"key"`
}

type replayFile struct {
	Schema    string     `json:"schema"`
	RequestID string     `json:"request_id"`
	SourceID  string     `json:"source_id"`
	Result    PollResult `json:"result"`
	Key       string     `json:"key"`
}

// maxReplayKeyBytes bounds ReplayRecord.Key.
const maxReplayKeyBytes = 4096

// OpenReplay returns the Replay store kept in dir, creating dir (mode 0700)
// if needed. dir must be an absolute path to a directory, not a symlink,
// owned by the adapter's user and not group- or world-writable.
func OpenReplay(dir string) (*Replay, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("replay: directory %q is not absolute", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	r := &Replay{dir: dir}
	if err := r.at(func(*os.File) error { return nil }); err != nil {
		return nil, err
	}
	return r, nil
}

// Replay opens the Replay store of this package: the directory "replay"
// inside FIRSTMATE_EXTENSION_STATE. It fails when the host gave no state
// directory.
func (c *Call) Replay() (*Replay, error) {
	if c.Env.StateDir == "" {
		return nil, errors.New("replay: FIRSTMATE_EXTENSION_STATE is not set")
	}
	return OpenReplay(filepath.Join(c.Env.StateDir, "replay"))
}

// Dir returns the store's directory.
func (r *Replay) Dir() string { return r.dir }

func (r *Replay) path(sourceID string) (string, error) {
	if !wire.ValidSourceID(sourceID) {
		return "", fmt.Errorf("replay: source id %q is not valid", wire.Clip(sourceID, 64))
	}
	return filepath.Join(r.dir, sourceID+".json"), nil
}

// Load returns the stored answer for sourceID if it was given to requestID.
// ok is false when nothing is stored for the source or the stored answer was
// given to another request id.
func (r *Replay) Load(sourceID, requestID string) (rec ReplayRecord, ok bool, err error) {
	p, err := r.path(sourceID)
	if err != nil {
		return ReplayRecord{}, false, err
	}
	var data []byte
	err = r.at(func(d *os.File) (err error) {
		data, err = fsutil.ReadAt(d, filepath.Base(p), 2*wire.MaxEnvelopeBytes)
		return err
	})
	if errors.Is(err, fs.ErrNotExist) {
		return ReplayRecord{}, false, nil
	}
	if err != nil {
		return ReplayRecord{}, false, err
	}
	var f replayFile
	if err := wire.Decode(data, 2*wire.MaxEnvelopeBytes, "replay record", &f); err != nil {
		return ReplayRecord{}, false, fmt.Errorf("replay: %s: %v", p, errMessageOf(err))
	}
	if f.Schema != ReplaySchema || f.SourceID != sourceID || !wire.ValidRequestID(f.RequestID) ||
		f.Result.Status != wire.StatusResult || f.Result.Validate() != nil || len(f.Key) > maxReplayKeyBytes {
		return ReplayRecord{}, false, fmt.Errorf("replay: %s: not a valid replay record", p)
	}
	if f.RequestID != requestID {
		return ReplayRecord{}, false, nil
	}
	return ReplayRecord{RequestID: f.RequestID, SourceID: f.SourceID, Result: f.Result, Key: f.Key}, true, nil
}

// Store durably records rec as the answer for rec.SourceID, replacing the
// source's previous record (fsutil.ReplaceAt: written and synced in the
// store's directory, renamed into place, directory synced), mode 0600. Only
// status "result" answers are stored.
func (r *Replay) Store(rec ReplayRecord) error {
	if _, err := r.path(rec.SourceID); err != nil {
		return err
	}
	if !wire.ValidRequestID(rec.RequestID) {
		return fmt.Errorf("replay: request id is not sha256:<64 lowercase hex>")
	}
	if rec.Result.Status != wire.StatusResult {
		return fmt.Errorf("replay: only status %q answers are stored", wire.StatusResult)
	}
	if err := rec.Result.Validate(); err != nil {
		return fmt.Errorf("replay: %v", errMessageOf(err))
	}
	if len(rec.Key) > maxReplayKeyBytes {
		return fmt.Errorf("replay: key is larger than %d bytes", maxReplayKeyBytes)
	}
	data, err := wire.Canonical(replayFile{Schema: ReplaySchema, RequestID: rec.RequestID, SourceID: rec.SourceID, Result: rec.Result, Key: rec.Key})
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return r.at(func(d *os.File) error { return fsutil.ReplaceAt(d, rec.SourceID+".json", data) })
}

// Forget removes the record of sourceID, if any.
func (r *Replay) Forget(sourceID string) error {
	p, err := r.path(sourceID)
	if err != nil {
		return err
	}
	return r.at(func(d *os.File) error { return fsutil.RemoveAt(d, filepath.Base(p)) })
}

// Poll answers call.RequestID from the store when it was answered before;
// otherwise it calls poll and, when poll returns a status=result answer,
// stores it durably before returning it. Errors and no-result answers are not
// stored. If the answer cannot be stored it is still returned (poll has
// already consumed the event; losing the answer would lose the event) and the
// failure is logged.
//
// Poll suits adapters whose poll function consumes an event as it reads it.
// When consumption can be deferred, use Load and Store directly: store the
// answer with a Key first, then commit the consumption, and on a replayed
// Load commit rec.Key again (idempotently). That way a crash between the two
// steps neither loses nor repeats the event.
func (r *Replay) Poll(call *Call, in PollInput, poll func() (PollResult, error)) (PollResult, error) {
	rec, ok, err := r.Load(in.SourceID, call.RequestID)
	if err != nil {
		call.Logf("adapter: replay lookup failed, polling afresh: %v", err)
	} else if ok {
		return rec.Result, nil
	}
	res, err := poll()
	if err != nil || res.Status != wire.StatusResult || res.Validate() != nil {
		return res, err
	}
	if err := r.Store(ReplayRecord{RequestID: call.RequestID, SourceID: in.SourceID, Result: res}); err != nil {
		call.Logf("adapter: %v", err)
	}
	return res, nil
}

// at runs op on the store's directory, pinned (fsutil.OpenDir: a real
// directory owned by the adapter's user), so that every write goes through
// the handle and the layer's durability rule. Its mode and its records'
// modes and links are the adapter's own business, as they always were: a
// record kept under another umask, or with a second link for a backup, is
// still replayed (fsutil.ReadAt), because refusing it would lose its event.
func (r *Replay) at(op func(*os.File) error) error {
	d, err := fsutil.OpenDir(r.dir, replayDirRule)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	defer d.Close()
	if err := op(d); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}

var replayDirRule = fsutil.DirRule{What: "replay directory", Perm: fsutil.AnyPerm}
