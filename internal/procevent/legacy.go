package procevent

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/strictjson"
)

// Homes of the earlier Firstmate implementation ([HOME-4]).
//
// That implementation kept registrations as text records and the owner of a
// captured result in .adapter/.extension sidecars instead of a .meta.json
// (docs/configuration.md, "Moving a home onto fm"). The readers here detect
// exactly those two shapes and refuse with home-import-needed, so a home that
// was never imported, or whose import was interrupted, is never misread as a
// damaged fm home (schema-invalid): the fix is `fm home import` (package
// homeimport), which converts it with the Importer below.

// LegacyAdapterSuffix names the earlier implementation's owner sidecar of a
// captured result: <source-id>.<seq>.adapter.
const LegacyAdapterSuffix = ".adapter"

// LegacyRegistration reports whether data is a registration record in the
// earlier implementation's text format, whose first line is adapter=<name>.
// fm's records are JSON objects and never start so.
func LegacyRegistration(data []byte) bool { return bytes.HasPrefix(data, []byte("adapter=")) }

// ImportNeeded is the refusal of a reader that found what the earlier
// implementation wrote.
func ImportNeeded(format string, args ...any) error {
	return errcode.New(errcode.HomeImportNeeded, format+"; this home was written by the earlier Firstmate implementation: stop it, then run fm home import", args...)
}

// CheckRegistration applies fm's record rules to a registration built by the
// import, its size bound included; what names it in errors.
func CheckRegistration(r *Registration, what string) error {
	if err := r.validate(what); err != nil {
		return err
	}
	data, err := strictjson.Canonical(r)
	if err != nil {
		return notJSON(what)
	}
	if len(data) > maxRegistration {
		return errcode.New(errcode.JSONOversized, "%s: as fm's record it would be %d bytes, more than the %d fm reads", what, len(data), maxRegistration)
	}
	return nil
}

// notJSON refuses a record built by the import whose values cannot be JSON
// strings (an argument of the earlier record that is not UTF-8, say).
func notJSON(what string) error {
	return errcode.New(errcode.SchemaInvalid, "%s: a value is not valid UTF-8, so it cannot be fm's JSON record; fix or move the file aside", what)
}

// CheckMeta applies fm's rules to a result meta built by the import, and
// requires that fm's record of it reads back as itself: canonical JSON keeps
// an integer exact only up to 2^53, so a result whose sequence is above that
// would get a meta that every reader of the inbox refuses.
func CheckMeta(m *Meta, what string) error {
	if err := m.validate(what); err != nil {
		return err
	}
	data, err := strictjson.Canonical(m)
	if err != nil {
		return notJSON(what)
	}
	var back Meta
	if err := strictjson.Decode(data, maxMeta, what, &back); err != nil || back != *m {
		return errcode.New(errcode.SchemaInvalid, "%s: sequence %d or capture time %d is above 2^53, the largest integer fm records exactly; move the result and its sidecars aside", what, m.Sequence, m.CapturedAt)
	}
	return nil
}

// Held lists the locks of fm's own runners that are held in the registry of
// h right now: the serve lock and the claims of sources. It creates nothing;
// an absent registry holds none.
func Held(h *home.Home) ([]string, error) {
	reg, err := openRegistryLoose(h)
	if reg == nil || err != nil {
		return nil, err
	}
	defer reg.Close()
	return heldIn(reg, true)
}

// openRegistryLoose opens h's registry without following a link but without
// checking its mode (the import tightens it afterwards); nil when absent.
func openRegistryLoose(h *home.Home) (*os.File, error) {
	f, err := fsutil.OpenDir(h.Registrations(), fsutil.DirRule{Perm: fsutil.AnyPerm})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return f, err
}

// heldIn lists the held claims in the registry reg, and with serve the
// serve lock too.
func heldIn(reg *os.File, serve bool) ([]string, error) {
	names, err := fsutil.NamesAt(reg)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		if !(serve && n == "serve.lock") && !strings.HasSuffix(n, claimSuffix) {
			continue
		}
		busy, err := held(reg, n)
		if err != nil {
			return nil, err
		}
		if busy {
			out = append(out, filepath.Join(reg.Name(), n))
		}
	}
	return out, nil
}

// ServeLock is the serve lock of a home held by fm home import from before
// its first change to its end, so that no fm procevent serve starts in
// between (serve takes no lifecycle lock).
type ServeLock struct{ l *fsutil.Locked }

// LockServe takes the serve lock of h without waiting and checks that no fm
// runner holds a source's claim: home-busy otherwise. The registry is opened
// without following a link, but its mode is not checked: the import tightens
// it afterwards. nil when there is no registry (OpenImporter then takes the
// lock itself).
func LockServe(h *home.Home) (*ServeLock, error) {
	reg, err := openRegistryLoose(h)
	if reg == nil || err != nil {
		return nil, err
	}
	defer reg.Close()
	l, err := takeServe(reg, h)
	if err != nil {
		return nil, err
	}
	return &ServeLock{l}, nil
}

// Close releases the lock (nil: nothing held).
func (l *ServeLock) Close() {
	if l != nil {
		l.l.Release()
	}
}

// takeServe takes the serve lock in the registry reg without waiting, then
// checks that no runner holds a claim there.
func takeServe(reg *os.File, h *home.Home) (*fsutil.Locked, error) {
	lock, err := fsutil.Lock(context.Background(), reg, "serve.lock", fsutil.LockOptions{Try: true})
	if errors.Is(err, fsutil.ErrLocked) {
		return nil, errcode.New(errcode.HomeBusy, "fm procevent serve is running for home %q (it holds %s); stop it, then run fm home import again", h.Dir, filepath.Join(reg.Name(), "serve.lock"))
	}
	if err != nil {
		return nil, err
	}
	if busy, err := heldIn(reg, false); err != nil || len(busy) > 0 {
		lock.Release()
		if err == nil {
			err = errcode.New(errcode.HomeBusy, "an fm runner holds %s; wait for its poll to end (or stop fm procevent start), then run fm home import again", strings.Join(busy, ", "))
		}
		return nil, err
	}
	return lock, nil
}

// Importer writes fm's procevent records for `fm home import` while the
// serve lock of the home is held, so no fm procevent serve runs meanwhile;
// it was opened only while no source's claim was held.
type Importer struct {
	d     *dirs
	serve *fsutil.Locked // its own lock, or nil when the caller holds one
}

// OpenImporter pins the state root, the registry and the inbox of h
// (creating the registry and the inbox 0700 when absent). With held (from
// LockServe, still held by the caller) it checks that held is the serve lock
// of the pinned registry; without, it takes the serve lock itself. home-busy
// while serve runs or a runner holds a claim.
func OpenImporter(h *home.Home, held *ServeLock) (*Importer, error) {
	d, err := openDirs(h, false, true)
	if err != nil {
		return nil, err
	}
	if err := d.openInbox(true); err != nil {
		d.close()
		return nil, err
	}
	im := &Importer{d: d}
	if held == nil {
		im.serve, err = takeServe(d.reg, h)
	} else if ok, lerr := held.l.At(d.reg, "serve.lock"); lerr != nil || !ok {
		err = lerr
		if err == nil {
			err = errcode.New(errcode.HomeBusy, "the serve lock %s was removed or replaced during the import; stop whatever did it, then run fm home import again", filepath.Join(d.reg.Name(), "serve.lock"))
		}
	}
	if err != nil {
		d.close()
		return nil, err
	}
	return im, nil
}

// Close releases the directory handles, and the serve lock it took.
func (im *Importer) Close() {
	im.serve.Release()
	im.d.close()
}

// PublishRegistration checks r and durably replaces the record of its source
// with it (atomic rename: a reader sees the earlier record or r).
func (im *Importer) PublishRegistration(r *Registration) error {
	what := "imported registration " + filepath.Join(im.d.reg.Name(), r.SourceID+sourceSuffix)
	if err := CheckRegistration(r, what); err != nil {
		return err
	}
	data, err := strictjson.Canonical(r)
	if err != nil {
		return err
	}
	if err := im.d.recheck(); err != nil {
		return err
	}
	return fsutil.ReplaceAt(im.d.reg, r.SourceID+sourceSuffix, data)
}

// PublishMeta checks m and durably creates the meta of its result, which
// must exist; it never replaces a meta.
func (im *Importer) PublishMeta(m *Meta) error {
	n := name(m.SourceID, m.Sequence, metaSuffix)
	if err := m.validate("imported result meta " + filepath.Join(im.d.inbox.Name(), n)); err != nil {
		return err
	}
	if !fsutil.ExistsAt(im.d.inbox, name(m.SourceID, m.Sequence, resultSuffix)) {
		return errcode.New(errcode.SourceMissing, "no captured result %s in %q", name(m.SourceID, m.Sequence, resultSuffix), im.d.inbox.Name())
	}
	data, err := strictjson.Canonical(m)
	if err != nil {
		return err
	}
	if err := im.d.recheck(); err != nil {
		return err
	}
	if err := fsutil.CreateAt(im.d.inbox, n, data); err != nil {
		if errors.Is(err, fsutil.ErrExists) {
			return errcode.New(errcode.Internal, "result meta %s appeared during the import", filepath.Join(im.d.inbox.Name(), n))
		}
		return err
	}
	return nil
}

// PublishHandled durably replaces the handled marker of id/seq (the earlier
// implementation's empty one) with fm's marker. The marker exists throughout:
// the result never reads as unhandled.
func (im *Importer) PublishHandled(id string, seq int64) error {
	data, err := strictjson.Canonical(Handled{Schema: HandledSchema, By: HandledByOperator})
	if err != nil {
		return err
	}
	return fsutil.ReplaceAt(im.d.inbox, name(id, seq, handledSuffix), data)
}

// RaiseCounter makes the sequence counter of source id at least seq, so the
// next capture of id takes a sequence above every imported one [CAP-1]. A
// counter already at or above seq is left as it is.
func (im *Importer) RaiseCounter(id string, seq int64) error {
	last, err := im.d.counter(id)
	if err != nil || last >= seq {
		return err
	}
	return fsutil.ReplaceAt(im.d.reg, id+seqSuffix, []byte(strconv.FormatInt(seq, 10)+"\n"))
}
