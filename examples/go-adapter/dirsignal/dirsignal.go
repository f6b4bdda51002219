// Package dirsignal is the dir-signal example adapter: it turns files dropped
// into a directory into Firstmate process-event results.
//
// config_ref is "dir:<absolute path>" naming an existing directory. Every
// regular file in it whose name does not start with "." is delivered once per
// source, oldest modification time first (then by name). source.poll waits up
// to 25 seconds for such a file and returns its contents, which must be 1 to
// 16,384 bytes of UTF-8; it returns no-result when nothing arrives in time.
// Empty files are ignored until they have content; files that are too large
// or not UTF-8 are skipped (once, with a log line). Write a signal file
// atomically: write ".name.tmp", then rename it to "name".
//
// result.classify answers "dir-signal"; result.terminal and result.silent
// answer false: a directory source runs until it is retired, and every file
// is announced.
//
// State lives in FIRSTMATE_EXTENSION_STATE: the SDK's Replay store (the last
// answer per source and the request id it went to) and, per source, the set
// of delivered file names. A poll stores its answer before marking the file
// delivered, and a replayed answer marks it again: when the host repeats a
// request id (it does until it has captured something for the source), the
// file is neither lost nor delivered twice. An answer the host refuses after
// the file was marked is not redelivered (no exactly-once promise).
package dirsignal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json"

	"firstmate.dev/fm/pkg/adapter"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// Identity of the example package; it must match firstmate-extension.json.
const (
	ExtensionID    = "org.firstmate.example.dir-signal"
	Version        = "0.1.0"
	AdapterName    = "dir-signal"
	Classification = "dir-signal"
)

// Defaults of Handler.
const (
	// MaxFileBytes bounds one signal file.
	MaxFileBytes = 16384
	// DefaultWait is how long a poll waits for a file: far inside the
	// binding's default 300 s timeout (bind with --timeout-ms of at least
	// 30000 if you change it).
	DefaultWait = 25 * time.Second
	// DefaultInterval is how often the directory is listed while waiting.
	DefaultInterval = 250 * time.Millisecond
)

// Handler implements adapter.Handler for dir-signal.
type Handler struct {
	Wait     time.Duration
	Interval time.Duration
}

// New returns a Handler with the default wait and interval.
func New() *Handler { return &Handler{Wait: DefaultWait, Interval: DefaultInterval} }

// Identity implements adapter.Handler.
func (h *Handler) Identity() adapter.Identity {
	return adapter.Identity{ExtensionID: ExtensionID, ExtensionVersion: Version, AdapterNames: []string{AdapterName}}
}

// ParseConfigRef returns the directory of a "dir:<absolute path>" reference.
// The path must be absolute and clean (no "." or ".." components, no
// trailing slash).
func ParseConfigRef(ref string) (string, error) {
	dir, ok := strings.CutPrefix(ref, "dir:")
	if !ok || !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return "", adapter.Errorf(adapter.InvalidRequest, false, "config_ref must be dir:<absolute clean path>")
	}
	return dir, nil
}

// Poll implements adapter.Handler.
func (h *Handler) Poll(ctx context.Context, call *adapter.Call, in adapter.PollInput) (adapter.PollResult, error) {
	dir, err := ParseConfigRef(in.ConfigRef)
	if err != nil {
		return adapter.PollResult{}, err
	}
	replay, err := call.Replay()
	if err != nil {
		return adapter.PollResult{}, err // internal: the host always sets the state directory
	}
	st := &deliveredSet{path: filepath.Join(call.Env.StateDir, "dir-signal", in.SourceID+".delivered.json")}
	if err := st.load(); err != nil {
		return adapter.PollResult{}, err
	}

	// The host repeats a request id until it has captured the answer: give
	// the same answer, and finish marking its file delivered in case the
	// process died before doing so.
	rec, ok, err := replay.Load(in.SourceID, call.RequestID)
	if err != nil {
		call.Logf("dir-signal: %v; polling afresh", err)
	} else if ok {
		if err := st.add(dir, rec.Key); err != nil {
			return adapter.PollResult{}, adapter.Errorf(adapter.Unavailable, true, "record delivery: %w", err)
		}
		return rec.Result, nil
	}

	deadline := time.Now().Add(h.Wait)
	for {
		name, content, err := h.next(call, dir, st)
		if err != nil {
			return adapter.PollResult{}, err
		}
		if name != "" {
			res := adapter.Output(content)
			// Store the answer first: until it is stored nothing is consumed,
			// so failing here loses nothing.
			if err := replay.Store(adapter.ReplayRecord{RequestID: call.RequestID, SourceID: in.SourceID, Result: res, Key: name}); err != nil {
				return adapter.PollResult{}, adapter.Errorf(adapter.Unavailable, true, "%w", err)
			}
			if err := st.add(dir, name); err != nil {
				// The host records this failure and moves to a new request
				// id; the file is still undelivered and is offered again.
				return adapter.PollResult{}, adapter.Errorf(adapter.Unavailable, true, "record delivery: %w", err)
			}
			return res, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return adapter.NoResult(), nil
		}
		t := time.NewTimer(min(h.Interval, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return adapter.NoResult(), nil
		case <-t.C:
		}
	}
}

// next returns the oldest undelivered signal file's name and contents, or ""
// when there is none. It skips (and marks delivered) files that can never be
// delivered.
func (h *Handler) next(call *adapter.Call, dir string, st *deliveredSet) (string, string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			return "", "", adapter.Errorf(adapter.Unavailable, true, "directory %s: %w", dir, err)
		}
		return "", "", adapter.Errorf(adapter.Unavailable, true, "list %s: %w", dir, err)
	}
	type cand struct {
		name string
		info fs.FileInfo
	}
	var cands []cand
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !e.Type().IsRegular() || st.has(name) || !goodName(name) {
			continue
		}
		info, err := e.Info()
		if err != nil || info.Size() == 0 {
			continue // vanished, or not written yet
		}
		cands = append(cands, cand{name, info})
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if c := a.info.ModTime().Compare(b.info.ModTime()); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	for _, c := range cands {
		content, ok, err := readSignal(filepath.Join(dir, c.name), c.info)
		if err != nil {
			continue // vanished or replaced meanwhile: look again next time
		}
		if !ok {
			call.Logf("dir-signal: skipping %q: not 1..%d bytes of utf-8", c.name, MaxFileBytes)
			if err := st.add(dir, c.name); err != nil {
				return "", "", adapter.Errorf(adapter.Unavailable, true, "record skip: %w", err)
			}
			continue
		}
		return c.name, content, nil
	}
	return "", "", nil
}

// goodName: names are stored in JSON and logged, so they must be UTF-8
// without control characters.
func goodName(name string) bool {
	if !utf8.ValidString(name) {
		return false
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// readSignal reads a regular file that must still be the one listed. ok is
// false when its contents can never be delivered.
func readSignal(path string, listed fs.FileInfo) (content string, ok bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", false, err
	}
	if !fi.Mode().IsRegular() || !os.SameFile(fi, listed) {
		return "", false, errors.New("file replaced")
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return "", false, err
	}
	if len(data) == 0 {
		return "", false, errors.New("empty")
	}
	if len(data) > MaxFileBytes || !utf8.Valid(data) {
		return "", false, nil
	}
	return string(data), true, nil
}

// Classify implements adapter.Handler: every result of this adapter,
// host-written failure evidence included, is a dir-signal.
func (h *Handler) Classify(ctx context.Context, call *adapter.Call, in adapter.ResultInput) (adapter.ClassifyResult, error) {
	return adapter.ClassifyResult{Classification: Classification}, nil
}

// Terminal implements adapter.Handler: a directory source never ends by itself.
func (h *Handler) Terminal(ctx context.Context, call *adapter.Call, in adapter.ResultInput) (adapter.BoolResult, error) {
	return adapter.BoolResult{Value: false}, nil
}

// Silent implements adapter.Handler: every signal is announced.
func (h *Handler) Silent(ctx context.Context, call *adapter.Call, in adapter.ResultInput) (adapter.BoolResult, error) {
	return adapter.BoolResult{Value: false}, nil
}

// deliveredSet is the per-source set of file names already delivered (or
// skipped), kept in one small JSON file. Names no longer present in the
// directory are dropped when the set is written, so it stays as small as the
// directory; a file deleted and re-created under the same name is new.
type deliveredSet struct {
	path  string
	names map[string]bool
}

type deliveredFile struct {
	Schema    string   `json:"schema"`
	Delivered []string `json:"delivered"`
}

const deliveredSchema = "org.firstmate.example.dir-signal.delivered.v1"

func (s *deliveredSet) load() error {
	s.names = map[string]bool{}
	data, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return adapter.Errorf(adapter.Unavailable, true, "read state: %w", err)
	}
	var f deliveredFile
	if err := json.Unmarshal(data, &f, json.RejectUnknownMembers(true)); err != nil || f.Schema != deliveredSchema {
		return adapter.Errorf(adapter.Internal, false, "state file %s is corrupt; remove it to redeliver the directory", s.path)
	}
	for _, n := range f.Delivered {
		s.names[n] = true
	}
	return nil
}

func (s *deliveredSet) has(name string) bool { return s.names[name] }

// add marks name delivered and writes the set durably (temporary file, sync,
// rename, directory sync), keeping only names still present in dir.
func (s *deliveredSet) add(dir, name string) error {
	if name == "" {
		return nil
	}
	s.names[name] = true
	present := map[string]bool{name: true}
	if entries, err := os.ReadDir(dir); err == nil {
		for _, e := range entries {
			present[e.Name()] = true
		}
	} else {
		present = s.names // cannot list: keep everything
	}
	var keep []string
	for n := range s.names {
		if present[n] {
			keep = append(keep, n)
		}
	}
	slices.Sort(keep)
	data, err := wire.Canonical(deliveredFile{Schema: deliveredSchema, Delivered: keep})
	if err != nil {
		return err
	}
	return writeFileDurably(s.path, data)
}

func writeFileDurably(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	_, werr := io.Copy(tmp, bytes.NewReader(data))
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("publish %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
