package procevent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/shown"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
	"firstmate.dev/fm/pkg/fmjson"
)

// The inbox <state>/procevent-inbox holds, per captured result,
//
//	<source-id>.<seq>.meta.json  the immutable owner of the result
//	<source-id>.<seq>.pending    present while the capturing runner decides
//	                             the result's announcement (announce.go)
//	<source-id>.<seq>.result     the captured bytes (poll output or evidence)
//	<source-id>.<seq>.handled    present once the result is handled
//
// all 0600. Files are published by linking a fully written, fsynced unnamed
// file (O_TMPFILE) under its final name, which never replaces anything, and
// then fsyncing the directory [CAP-1]. The meta and the pending marker are
// published before the result, so a .result never exists without its owner,
// and never unmarked before its announcement is decided. A result is
// captured once its .result exists: a .meta.json (and .pending) without a
// .result is the trace of a capture that failed or was cut short, and
// nothing was captured. Such a sequence is not used up: the next capture of
// the source takes that sequence again (so its poll repeats the request id
// [RID-1]) and replaces the orphaned meta, the one exception to "never
// replaces", made under the source's claim and only while no .result of that
// sequence exists.

// MetaSchema is the schema of a result's meta file.
const MetaSchema = "firstmate.procevent-result-meta.v1"

// HandledSchema is the schema of a handled marker.
const HandledSchema = "firstmate.procevent-handled.v1"

// Handled-marker reasons.
const (
	HandledByOperator = "handled"
	HandledBySilent   = "silent"
)

const (
	resultSuffix  = ".result"
	metaSuffix    = ".meta.json"
	handledSuffix = ".handled"
	pendingSuffix = ".pending"
	seqSuffix     = ".seq"
	maxMeta       = 4096
	maxSeqFile    = 32
)

// Meta is the immutable owner of one captured result [CAP-1]. For an
// extension result it names the exact extension identity and binding that
// produced it: verdicts and classification ask that owner, never whatever
// binding or built-in holds the adapter name later [CAP-4]. Its fields and
// their JSON form are fmjson.Meta's: the file stored beside a result and the
// entry `fm procevent inbox --json` lists for it have one definition.
type Meta fmjson.Meta

// Owner is "<extension id>@<version>" or "built-in".
func (m *Meta) Owner() string {
	if m.Kind == KindExtension {
		return m.ExtensionID + "@" + m.ExtensionVersion
	}
	return "built-in"
}

// metaFor returns the meta of the next result of r.
func metaFor(r *Registration, seq int64, evidence bool) *Meta {
	m := &Meta{Schema: MetaSchema, Kind: r.Kind, Adapter: r.Adapter, SourceID: r.SourceID, Sequence: seq, Evidence: evidence, CapturedAt: time.Now().Unix()}
	if r.External() {
		m.ExtensionID, m.ExtensionVersion, m.CapabilityVersion = r.ExtensionID, r.ExtensionVersion, r.CapabilityVersion
		m.PackageDigest, m.BindingDigest = r.PackageDigest, r.BindingDigest
	}
	return m
}

func (m *Meta) owner() owner {
	return owner{m.Kind, m.Adapter, m.SourceID, m.ExtensionID, m.ExtensionVersion, m.CapabilityVersion, m.PackageDigest, m.BindingDigest}
}

func (m *Meta) validate(what string) error {
	if m.Schema != MetaSchema || m.Sequence < 1 || m.Sequence > MaxSeq {
		return errcode.New(errcode.SchemaInvalid, "%s: schema must be %q with a sequence in 1..%d", what, MetaSchema, int64(MaxSeq))
	}
	return m.owner().check(what)
}

// Handled is the content of a handled marker.
type Handled struct {
	Schema string `json:"schema"`
	By     string `json:"by"`
}

func name(id string, seq int64, suffix string) string {
	return id + "." + strconv.FormatInt(seq, 10) + suffix
}

// parseName splits an inbox name into source id, sequence and suffix. ok is
// false for any name that is not an inbox entry of a sequence in 1..MaxSeq;
// outOfRange picks out, among those, the entries whose sequence is a decimal
// number past MaxSeq, which fm never writes.
func parseName(n string) (id string, seq int64, suffix string, ok bool) {
	id, digits, suffix, ok := splitName(n)
	if !ok {
		return "", 0, "", false
	}
	seq, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || seq < 1 || seq > MaxSeq || digits != strconv.FormatInt(seq, 10) {
		return "", 0, "", false
	}
	return id, seq, suffix, true
}

// splitName splits an inbox name into its source id, the text of its
// sequence and its suffix.
func splitName(n string) (id, digits, suffix string, ok bool) {
	for _, s := range []string{resultSuffix, metaSuffix, handledSuffix, pendingSuffix} {
		rest, found := strings.CutSuffix(n, s)
		if !found {
			continue
		}
		dot := strings.LastIndexByte(rest, '.')
		if dot < 0 || protocol.CheckSourceID(rest[:dot]) != nil {
			return "", "", "", false
		}
		return rest[:dot], rest[dot+1:], s, true
	}
	return "", "", "", false
}

// outOfRange reports whether the inbox name n is an entry of source id whose
// sequence is a decimal number past MaxSeq (any source id when id is "").
// Such a name holds no result fm can list or handle, and it says that the
// source's sequence cannot advance: the runner refuses the source with
// sequence-exhausted, and `fm doctor` reports the name. Inbox listings skip
// it, as they skip every name that is not an entry.
func outOfRange(n, id string) bool {
	sid, digits, _, ok := splitName(n)
	if !ok || (id != "" && sid != id) || digits == "" || digits[0] == '0' || strings.Trim(digits, "0123456789") != "" {
		return false
	}
	seq, err := strconv.ParseInt(digits, 10, 64)
	return err != nil || seq > MaxSeq
}

// MaxSeq is the greatest sequence of a source, 2^53-1: sequences run from 1
// to MaxSeq [CAP-1], and a source that used the last one is refused with
// sequence-exhausted before it is polled again. The bound is JSON's, not
// int64's: a result's meta and the protocol's requests carry the sequence as
// a JSON number, which canonical JSON (RFC 8785) writes as an IEEE double,
// exact only up to 2^53; a greater sequence would be written rounded and
// never read back.
const MaxSeq = 1<<53 - 1

// exhausted is the error for source id whose sequence cannot advance; why
// names the file that says so.
func exhausted(id, why string) error {
	return errcode.New(errcode.SequenceExhausted, "source %q cannot take another sequence (%s; sequences end at %d); nothing was polled: retire it (fm procevent retire %s --if-owner <owner token>) and register it under a new source id", id, why, int64(MaxSeq), id)
}

// nextSeq is the sequence the next capture of id will use: one more than the
// highest of the durable counter <state>/procevent/<id>.seq and every
// sequence captured in the inbox for id (a .result, or a .handled marker,
// which only a captured result gets). The counter keeps sequences unique
// when inbox files are deleted; the inbox scan keeps them unique when a crash
// came between a capture and the counter update. So a captured sequence
// never repeats for a source id in a home, across handling, retirement and
// re-registration; a sequence whose capture failed before its .result was
// published was never captured, and is used again [RID-1]. names holds at
// least id's inbox names, read under id's claim (sourceNames), or for a
// report the whole inbox, listed once for every source.
func (d *dirs) nextSeq(id string, names []string) (int64, error) {
	last, err := d.counter(id)
	if err != nil {
		return 0, err
	}
	why := fmt.Sprintf("counter %s holds %d", filepath.Join(d.reg.Name(), id+seqSuffix), last)
	for _, n := range names {
		if outOfRange(n, id) {
			return 0, exhausted(id, "inbox entry "+filepath.Join(d.inbox.Name(), n)+" has a sequence past the last one")
		}
		if sid, seq, suffix, ok := parseName(n); ok && sid == id && (suffix == resultSuffix || suffix == handledSuffix) && seq > last {
			last, why = seq, "inbox entry "+filepath.Join(d.inbox.Name(), n)+" used it"
		}
	}
	if last >= MaxSeq {
		return 0, exhausted(id, fmt.Sprintf("sequence %d is used: %s", last, why))
	}
	return last + 1, nil
}

// inboxNames lists the pinned inbox; none when it is not open (absent).
func (d *dirs) inboxNames() ([]string, error) {
	if d.inbox == nil {
		return nil, nil
	}
	return fsutil.NamesAt(d.inbox)
}

// counter reads the durable counter of id: the last sequence captured, 0
// when there is none.
func (d *dirs) counter(id string) (int64, error) {
	path := filepath.Join(d.reg.Name(), id+seqSuffix)
	data, err := fsutil.ReadPrivateAt(d.reg, id+seqSuffix, maxSeqFile)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return ParseCounter(id, path, data)
}

// ParseCounter reads data, the counter of source id at path: decimal digits
// and an optional newline (schema-invalid otherwise), at most MaxSeq
// (sequence-exhausted otherwise).
func ParseCounter(id, path string, data []byte) (int64, error) {
	digits := strings.TrimSuffix(string(data), "\n")
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, errcode.New(errcode.SchemaInvalid, "sequence counter %q is not a decimal number; fix or remove it", path)
	}
	n, perr := strconv.ParseInt(digits, 10, 64)
	if perr != nil || n > MaxSeq {
		return 0, exhausted(id, fmt.Sprintf("counter %s holds %s, past the last sequence", path, shown.Token(digits)))
	}
	return n, nil
}

// capture durably publishes one result of r with sequence seq: recheck the
// boundary, the meta first, then the pending marker, then the result, then
// the counter. Returns the meta and the result's path. The caller holds the
// claim, so nobody else captures for the source meanwhile.
func (d *dirs) capture(r *Registration, seq int64, content []byte, evidence bool) (*Meta, string, error) {
	if err := d.recheck(); err != nil {
		return nil, "", err
	}
	m := metaFor(r, seq, evidence)
	data, err := strictjson.Canonical(m)
	if err != nil {
		return nil, "", err
	}
	used := func() error {
		return errcode.New(errcode.Internal, "inbox entry %s already exists; sequence %d of %q was used before", name(r.SourceID, seq, resultSuffix), seq, r.SourceID)
	}
	if fsutil.ExistsAt(d.inbox, name(r.SourceID, seq, resultSuffix)) {
		return nil, "", used()
	}
	metaName := name(r.SourceID, seq, metaSuffix)
	err = fsutil.CreateAt(d.inbox, metaName, data)
	if errors.Is(err, fsutil.ErrExists) {
		// The orphaned meta of a capture of this sequence that failed
		// before its result was published: nothing was captured, so this
		// capture takes the sequence and the meta is its own.
		err = fsutil.ReplaceAt(d.inbox, metaName, data)
	}
	if err != nil {
		return nil, "", err
	}
	if err := fsutil.CreateAt(d.inbox, name(r.SourceID, seq, pendingSuffix), nil); err != nil && !errors.Is(err, fsutil.ErrExists) {
		return nil, "", err
	}
	if err := fsutil.CreateAt(d.inbox, name(r.SourceID, seq, resultSuffix), content); err != nil {
		if errors.Is(err, fsutil.ErrExists) {
			return nil, "", used()
		}
		return nil, "", err
	}
	// Its old file may be kept for reuse: the counter is read only by
	// ReadPrivateAt, which rechecks the name (fsutil: "Spare files").
	if err := fsutil.ReplaceKeepingAt(d.reg, r.SourceID+seqSuffix, []byte(strconv.FormatInt(seq, 10)+"\n")); err != nil {
		return nil, "", err
	}
	return m, filepath.Join(d.inbox.Name(), name(r.SourceID, seq, resultSuffix)), nil
}

// clearPending removes the pending markers of source id. The caller holds the
// claim, so every marker of id is stale: its runner died (or failed) before
// it decided the announcement, and the result falls under the re-announce
// rule (announce.go). names holds at least id's inbox names, read under the
// claim (sourceNames, or a listing).
func (d *dirs) clearPending(id string, names []string) error {
	for _, n := range names {
		if sid, _, suffix, ok := parseName(n); ok && sid == id && suffix == pendingSuffix {
			if err := fsutil.RemoveKeepingAt(d.inbox, n); err != nil { // no one reads a marker
				return err
			}
		}
	}
	return nil
}

// markHandled publishes the handled marker of id/seq; already reports that
// one existed. The result itself must exist.
func (d *dirs) markHandled(id string, seq int64, by string) (already bool, err error) {
	if !fsutil.ExistsAt(d.inbox, name(id, seq, resultSuffix)) {
		return false, errcode.New(errcode.SourceMissing, "no captured result %s in %q; see fm procevent inbox", name(id, seq, resultSuffix), d.inbox.Name())
	}
	data, err := strictjson.Canonical(Handled{Schema: HandledSchema, By: by})
	if err != nil {
		return false, err
	}
	err = fsutil.CreateAt(d.inbox, name(id, seq, handledSuffix), data)
	if errors.Is(err, fsutil.ErrExists) {
		return true, nil
	}
	return false, err
}

// HandleAll marks every unhandled captured result of source id handled
// ([UPG-3]) and returns their sequence numbers, in order. Each is marked as
// MarkHandled marks one; a result captured meanwhile is not included.
func HandleAll(h *home.Home, id string) ([]int64, error) {
	if err := protocol.CheckSourceID(id); err != nil {
		return nil, err
	}
	results, err := Inbox(h)
	if err != nil {
		return nil, err
	}
	var done []int64
	for _, r := range results {
		if r.SourceID != id || r.Handled {
			continue
		}
		if _, err := MarkHandled(h, id, r.Sequence); err != nil {
			return done, err
		}
		done = append(done, r.Sequence)
	}
	return done, nil
}

// MarkHandled records that the result seq of source id is handled ([CAP-3]).
// already reports that it was handled before; nothing changes then.
func MarkHandled(h *home.Home, id string, seq int64) (already bool, err error) {
	if err := protocol.CheckSourceID(id); err != nil {
		return false, err
	}
	if seq < 1 || seq > MaxSeq {
		return false, errcode.New(errcode.Usage, "sequence %d is outside 1..%d, the sequences a source can have", seq, int64(MaxSeq))
	}
	d, err := openInboxReader(h)
	if err == nil {
		defer d.close()
	}
	if err == errAbsent {
		return false, errcode.New(errcode.SourceMissing, "no captured result %s: the inbox %q does not exist", name(id, seq, resultSuffix), h.Inbox())
	}
	if err != nil {
		return false, err
	}
	return d.markHandled(id, seq, HandledByOperator)
}

// openInboxReader pins the state root, the inbox and, when it exists, the
// registry for a reader: nothing is created; a missing state root or inbox is
// errAbsent. The inbox is pinned independently of the registry: captured
// results stay readable (and pin their bindings [LIFE-2]) when the registry
// is gone.
func openInboxReader(h *home.Home) (*dirs, error) {
	d, err := openDirs(h, false, false)
	if err != nil {
		return nil, err
	}
	if err := d.openInbox(false); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// Result is one captured result as listed by Inbox.
type Result struct {
	Meta
	Path    string `json:"path"`
	Handled bool   `json:"handled"`
}

// Inbox lists every captured result of h in source-id and sequence order
// ([CAP-8]). An absent inbox is empty and is not created.
func Inbox(h *home.Home) ([]Result, error) {
	d, err := openInboxReader(h)
	if err == nil {
		defer d.close()
	}
	if err == errAbsent {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return d.results()
}

func (d *dirs) results() ([]Result, error) {
	names, err := fsutil.NamesAt(d.inbox)
	if err != nil {
		return nil, err
	}
	handled := map[string]bool{}
	for _, n := range names {
		if id, seq, s, ok := parseName(n); ok && s == handledSuffix {
			handled[name(id, seq, "")] = true
		}
	}
	var out []Result
	for _, n := range names {
		id, seq, s, ok := parseName(n)
		if !ok || s != resultSuffix {
			continue
		}
		m, err := d.readMeta(id, seq)
		if err != nil {
			return nil, err
		}
		out = append(out, Result{Meta: *m, Path: filepath.Join(d.inbox.Name(), n), Handled: handled[name(id, seq, "")]})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].SourceID != out[j].SourceID {
			return out[i].SourceID < out[j].SourceID
		}
		return out[i].Sequence < out[j].Sequence
	})
	return out, nil
}

func (d *dirs) readMeta(id string, seq int64) (*Meta, error) {
	n := name(id, seq, metaSuffix)
	data, err := fsutil.ReadPrivateAt(d.inbox, n, maxMeta)
	if err != nil {
		if os.IsNotExist(err) && fsutil.ExistsAt(d.inbox, name(id, seq, LegacyAdapterSuffix)) {
			return nil, ImportNeeded("captured result %s has no %s but an owner sidecar %s", name(id, seq, resultSuffix), n, name(id, seq, LegacyAdapterSuffix))
		}
		if os.IsNotExist(err) {
			return nil, errcode.New(errcode.SchemaInvalid, "captured result %s has no %s", name(id, seq, resultSuffix), n)
		}
		return nil, err
	}
	var m Meta
	what := "result meta " + filepath.Join(d.inbox.Name(), n)
	if err := strictjson.Decode(data, maxMeta, what, &m); err != nil {
		return nil, err
	}
	if err := m.validate(what); err != nil {
		return nil, err
	}
	if m.SourceID != id || m.Sequence != seq {
		return nil, errcode.New(errcode.SchemaInvalid, "%s: names %s.%d", what, m.SourceID, m.Sequence)
	}
	return &m, nil
}

// loaded is one result read back from the inbox for classification.
type loaded struct {
	meta    *Meta
	path    string
	content []byte
}

// loadResult reads the result file path, which must sit directly inside the
// canonical inbox of h ([CAP-5], [OP-2]); anything else is path-unsafe.
func loadResult(h *home.Home, path string) (*loaded, error) {
	abs, err := filepath.Abs(path)
	if err != nil || filepath.Dir(abs) != h.Inbox() {
		return nil, errcode.New(errcode.PathUnsafe, "result file %q must sit directly inside the inbox %q", path, h.Inbox())
	}
	id, seq, suffix, ok := parseName(filepath.Base(abs))
	if !ok || suffix != resultSuffix {
		return nil, errcode.New(errcode.PathUnsafe, "%q is not a result file (<source-id>.<seq>.result)", path)
	}
	d, err := openInboxReader(h)
	if err == nil {
		defer d.close()
	}
	if err == errAbsent {
		return nil, errcode.New(errcode.PathUnsafe, "the inbox %q does not exist", h.Inbox())
	}
	if err != nil {
		return nil, err
	}
	content, err := fsutil.ReadPrivateAt(d.inbox, filepath.Base(abs), wire.MaxContentBytes)
	if os.IsNotExist(err) {
		return nil, errcode.New(errcode.SourceMissing, "no captured result %q; see fm procevent inbox", abs)
	}
	if err != nil {
		return nil, err
	}
	m, err := d.readMeta(id, seq)
	if err != nil {
		return nil, err
	}
	return &loaded{meta: m, path: abs, content: content}, nil
}

// dependsOn reports whether an unhandled result of m pins the binding b.
func (m *Meta) dependsOn(b *binding.Binding) bool {
	return m.Kind == KindExtension && m.BindingDigest == b.Digest
}
