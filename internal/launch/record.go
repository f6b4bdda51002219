package launch

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/strictjson"
)

// The owner record's fixed values [GRP-1].
const (
	RecordSchema  = "firstmate.extension-invocation-owner.v1"
	PhaseReserved = "reserved" // written before the barrier starts; no group yet
	PhaseGroup    = "group"    // the barrier's group is published; package code may run
)

const (
	recordSuffix = ".owner.json"
	tempSuffix   = ".tmp"
	// maxRecord bounds a record file; a real one is about 600 bytes.
	maxRecord = 4096
)

// Record is one owner record, <records>/<hex>.owner.json: canonical JSON, mode
// 0600, in a private 0700 directory [GRP-1], written and read by the strict
// JSON path (strictjson.Canonical, strictjson.Decode) and nothing else. <hex>
// is 80 lower-case hex digits: 16 that index the record by its source (see
// sourceKey), the boot id's 32 (see bootPrefix), then 32 of fresh randomness,
// not derived from the request id: a retry reuses its request id [RID-1] and
// may overlap a dying earlier attempt, and each attempt needs its own record.
// Versions of fm before the index named records <boot><random> (64 hex
// digits); such a record may be of any source, and every listing reads it.
type Record struct {
	Schema string `json:"schema"` // RecordSchema
	Phase  string `json:"phase"`  // PhaseReserved or PhaseGroup
	// GroupPID is the process group id, equal to Leader.PID; both are null
	// while Phase is PhaseReserved.
	GroupPID *int      `json:"group_pid"`
	Leader   *Identity `json:"leader"` // the launch barrier, later the entrypoint (same process)
	Host     Identity  `json:"host"`   // the fm process that supervises the invocation
	// SessionID is the session of the group (field 6 of /proc/<pid>/stat of
	// the barrier): the host's own, for fm makes every group with setpgid
	// inside its session and never a session leader. Null while reserved. A
	// group record without it (or whose leader now leads a session, or is in
	// another one) is never signalled [GRP-3].
	SessionID *int `json:"session_id"`

	ExtensionID   string `json:"extension_id"`
	BindingDigest string `json:"binding_digest"`
	RequestID     string `json:"request_id"`
	SourceID      string `json:"source_id"` // "" when the invocation serves no source
	Operation     string `json:"operation"`
	CreatedAt     int64  `json:"created_at"` // unix seconds

	// Path is the record file. It is not stored.
	Path string `json:"-"`
	// HostLive reports that Host was alive when the record was read: the
	// record belongs to a live invocation. It is not stored.
	HostLive bool `json:"-"`
}

// validate checks a record's values beyond its JSON shape.
func (r *Record) validate(what string) error {
	bad := func(field string) error {
		return errcode.New(errcode.SchemaInvalid, "%s: invalid %s", what, field)
	}
	if r.Schema != RecordSchema {
		return bad("schema")
	}
	switch r.Phase {
	case PhaseReserved:
		if r.GroupPID != nil || r.Leader != nil || r.SessionID != nil {
			return bad("group_pid/leader/session_id (must be null while reserved)")
		}
	case PhaseGroup:
		// A group id of 1 would make kill(-1, ...) mean "every process".
		if r.GroupPID == nil || r.Leader == nil || *r.GroupPID != r.Leader.PID || r.Leader.PID <= 1 || !validIdentity(*r.Leader) {
			return bad("group_pid/leader")
		}
		// 0 is a real session id: /proc reports it when the session
		// leader lives outside this PID namespace (a container whose
		// runtime made the session), so only a negative one is invalid.
		if r.SessionID != nil && *r.SessionID < 0 {
			return bad("session_id")
		}
	default:
		return bad("phase")
	}
	if !validIdentity(r.Host) {
		return bad("host")
	}
	if r.ExtensionID == "" || r.BindingDigest == "" || r.RequestID == "" || r.Operation == "" {
		return bad("owner (extension_id, binding_digest, request_id and operation are required)")
	}
	if r.CreatedAt <= 0 {
		return bad("created_at")
	}
	return nil
}

func validIdentity(id Identity) bool {
	return id.PID > 0 && validBootID(id.BootID)
}

// recordDir is an open handle on the records directory. Every file operation
// goes through it (openat, renameat, unlinkat), so a directory swapped for a
// link after the check is never followed.
type recordDir struct {
	fd   int
	path string
	dir  *os.File // the pinned handle; fd is its descriptor
}

// openRecordDir opens the records directory and checks that it is private:
// a real directory (not a link), owned by the effective user, with no group or
// other permission bits [HOME-4]. With create, an absent directory is made
// 0700 (its parent must exist). Without create, an absent directory yields
// (nil, nil).
func openRecordDir(path string, create bool) (*recordDir, error) {
	if !filepath.IsAbs(path) {
		return nil, errcode.New(errcode.PathUnsafe, "invocation records directory %q is not absolute", path)
	}
	if create {
		if err := os.Mkdir(path, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, errcode.Wrap(errcode.HomeInvalid, err, "create invocation records directory %s", path)
		}
	}
	dir, err := fsutil.OpenDir(path, recordDirRule)
	if errors.Is(err, os.ErrNotExist) && !create {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &recordDir{fd: int(dir.Fd()), path: path, dir: dir}, nil
}

// recordDirRule is the private-directory rule of the records directory
// [HOME-4]: no group or other permission bit at all.
var recordDirRule = fsutil.DirRule{What: "invocation records directory", Perm: fsutil.OwnerOnly, SameMount: true}

func (d *recordDir) close() { d.dir.Close() }

// newRecordName returns a fresh "<80 hex>.owner.json" for a record of
// source id (sourceID "" for an invocation that serves no source): the 16
// hex digits of its sourceKey, the 32 of this boot's id (see bootPrefix),
// then 32 of fresh randomness.
func newRecordName(sourceID string) (string, error) {
	boot, err := BootID()
	if err != nil {
		return "", err
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "random record name")
	}
	return sourceKey(sourceID) + bootPrefix(boot) + hex.EncodeToString(b[:]) + recordSuffix, nil
}

// sourceKey is how the name of a record of source id starts: 16 hex digits
// of the SHA-256 of id. A poll lists only the records whose name starts
// with its source's key (and those of the earlier, unkeyed form), instead of
// every record of the home: in a serve with hundreds of sources that was one
// read (or stat) of every in-flight record per poll, and the reason records
// once had a hand-written codec. The key is an index, not an identity: two
// sources may share one (2^-64 per pair), so a listing still selects by the
// record's own source_id.
func sourceKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:8])
}

// bootPrefix is the part of a record name that names the boot the record
// was written in: the boot id's 32 hex digits without dashes. A record
// whose name names another boot was written in an earlier boot (or by a
// version of fm that did not name records so), and nothing of an earlier
// boot still runs.
func bootPrefix(boot string) string { return strings.ReplaceAll(boot, "-", "") }

// The two forms of a record's <hex>: keyed (this version) and unkeyed
// (versions before the source index).
const (
	keyedHex   = 80
	unkeyedHex = 64
	keyHex     = 16
)

// recordHex returns the <hex> of a record file name of either form, or "" if
// name is not one.
func recordHex(name string) string {
	h, ok := strings.CutSuffix(name, recordSuffix)
	if len(h) != keyedHex && len(h) != unkeyedHex || !ok || strings.Trim(h, "0123456789abcdef") != "" {
		return ""
	}
	return h
}

// nameBoot returns the boot part of a record's <hex> h (see bootPrefix).
func nameBoot(h string) string {
	if len(h) == keyedHex {
		h = h[keyHex:]
	}
	return h[:32]
}

// scope selects the record names a listing looks at: those whose source
// key is key, and every unkeyed one, whose source only its content tells;
// with key "", every record.
type scope struct{ key string }

// everyRecord is the scope of every record.
var everyRecord = scope{}

// sourceScope is the scope of the records of source id.
func sourceScope(id string) scope { return scope{key: sourceKey(id)} }

// has reports whether the record <hex> h is in the scope.
func (sc scope) has(h string) bool {
	return sc.key == "" || len(h) == unkeyedHex || h[:keyHex] == sc.key
}

// tempName is the temporary file a record is written to before it is renamed
// into place: ".<hex>.<host pid>-<host start time>.tmp", <hex> the record's
// (so a temporary file is in its record's scope). The host identity in the
// name lets Cleanup delete a temporary file whose writer is dead without
// reading it (it may be partial). Temporary files carry no ownership: package
// code is released only after the record itself is renamed into place.
func tempName(record string, host Identity) string {
	return "." + recordHex(record) + "." + strconv.Itoa(host.PID) + "-" + strconv.FormatUint(host.StartTime, 10) + tempSuffix
}

// parseTempName returns the writer of a temporary file name and the <hex> of
// its record.
func parseTempName(name string) (writer Identity, record string, ok bool) {
	rest, ok := strings.CutPrefix(name, ".")
	if !ok {
		return Identity{}, "", false
	}
	rest, ok = strings.CutSuffix(rest, tempSuffix)
	if !ok {
		return Identity{}, "", false
	}
	h, owner, ok := strings.Cut(rest, ".")
	if !ok || recordHex(h+recordSuffix) == "" {
		return Identity{}, "", false
	}
	p, s, ok := strings.Cut(owner, "-")
	pid, err1 := strconv.Atoi(p)
	start, err2 := strconv.ParseUint(s, 10, 64)
	if !ok || err1 != nil || err2 != nil || pid <= 0 || strconv.Itoa(pid) != p || strconv.FormatUint(start, 10) != s {
		return Identity{}, "", false
	}
	return Identity{PID: pid, StartTime: start}, h, true
}

// write publishes rec as name: write a temporary file (or a spare: see
// "Spare record files"), rename it over name. A reader sees the old record
// or the new one, never a mix, and once write returns every later reader
// sees it, whatever happens to this process: the record lives in the
// kernel's page cache, which a process's death does not touch. Nothing is
// fsynced; see "Records and durability" in the package documentation for
// why that is the guarantee the record needs.
func (d *recordDir) write(name string, rec *Record) error {
	data, err := strictjson.Canonical(rec)
	if err != nil {
		return err
	}
	return d.publish(name, rec.Host, data)
}

// publish writes data to a new file of host and publishes it as name, not
// durably (fsutil.NewOptions.NoSync: see "Records and durability" in the
// package documentation). A record already at name (the reserved record,
// rewritten in phase group) is swapped out atomically
// (fsutil.Pending.ExchangeKeeping) rather than renamed over, and its file
// kept as a spare or unlinked: ext4 (auto_da_alloc) answers a rename over a name by
// allocating the new file's blocks at once, which makes the record's
// eventual unlink cost a block free (and a discard, where the file system
// is mounted so): about 0.1 ms of every invocation on the reference
// machines, against a few microseconds for a record that lives and dies in
// the page cache.
func (d *recordDir) publish(name string, host Identity, data []byte) error {
	p, err := d.newFile(name, host)
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "create %s", filepath.Join(d.path, tempName(name, host)))
	}
	if _, err = p.Write(data); err == nil {
		err = p.ExchangeKeeping(name)
	}
	p.Abort()
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err // the errno alone, as records have always said it
	}
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "write invocation record %s", filepath.Join(d.path, name))
	}
	return nil
}

// releaseErr releases this process's record name (see release) and returns
// only the error.
func (d *recordDir) releaseErr(name string) error {
	_, err := d.release(name)
	return err
}

// remove deletes name. It reports false if name was already gone. Like
// write, it does not fsync: a record that reappears after a machine crash
// names an earlier boot, and Cleanup clears it.
func (d *recordDir) remove(name string) (bool, error) {
	removed, err := fsutil.UnlinkAt(d.dir, name)
	if err != nil {
		return false, errcode.Wrap(errcode.Internal, err, "remove invocation record %s", filepath.Join(d.path, name))
	}
	return removed, nil
}

// errUnlinked is readOnce's answer for a record file that left its name
// while it was read: unlinked, or renamed away (a spare, see "Spare record
// files").
var errUnlinked = errors.New("record file left its name while it was read")

// afterRecordOpen, when set (by tests only), runs in readOnce between the
// checks of the open record file and its reading.
var afterRecordOpen func(name string)

// parseRecord reads and strictly parses the record file f at path.
func parseRecord(f *os.File, path string) (Record, error) {
	data, err := strictjson.Read(f, maxRecord, path)
	if err != nil {
		return Record{}, err
	}
	if rec, ok := parsed.get(path, data); ok {
		return rec, nil
	}
	var rec Record
	if err := strictjson.Decode(data, maxRecord, path, &rec); err != nil {
		return Record{}, err
	}
	if err := rec.validate(path); err != nil {
		return Record{}, err
	}
	parsed.put(path, data, rec) // a copy: rec stays the caller's own
	return rec, nil
}

// parsed remembers, per record path, the exact bytes of the last record read
// there that passed every check, with what they parsed to: a serve's
// maintenance lists every owner record every 30 s (launch.Cleanup), and at
// 1,000 idle sources parsing them again was a third of its idle CPU, with
// the garbage collections their garbage started (docs/performance.md,
// "Ninth pass"). Only the same bytes at the same path skip the parse; the
// file is still opened, checked and read, and whether its host lives is
// still looked up by every caller. It holds at most maxParsed paths and
// forgets all of them when full.
var parsed = parseCache{m: map[string]parsedRecord{}}

const maxParsed = 4096

type parsedRecord struct {
	data []byte
	rec  Record
}

type parseCache struct {
	mu sync.Mutex
	m  map[string]parsedRecord
}

// get returns a copy of the record data parsed to at path, if data are the
// bytes parsed there last.
func (c *parseCache) get(path string, data []byte) (Record, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.m[path]
	if !ok || !bytes.Equal(p.data, data) {
		return Record{}, false
	}
	return p.rec.clone(), true
}

func (c *parseCache) put(path string, data []byte, rec Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxParsed {
		clear(c.m)
	}
	c.m[path] = parsedRecord{data: data, rec: rec.clone()}
}

// clone copies r with its own copies of what its pointer fields point to.
func (r Record) clone() Record {
	if r.GroupPID != nil {
		r.GroupPID = new(*r.GroupPID)
	}
	if r.Leader != nil {
		r.Leader = new(*r.Leader)
	}
	if r.SessionID != nil {
		r.SessionID = new(*r.SessionID)
	}
	return r
}

// read reads and strictly parses one record: a regular file (not a link, not a
// FIFO), owned by the effective user, mode exactly 0600, one link, at most
// maxRecord bytes of canonical-schema JSON with exactly the record's keys.
//
// A file that has no link left once opened, or that name no longer names
// once it is read, was replaced (the reserved record rewritten in phase
// group) or removed (its invocation ended) meanwhile: the name is looked up again, so a reader gets the record that is
// there now, or ENOENT, never a refusal of a record for a race with its
// writer.
func (d *recordDir) read(name string) (Record, error) {
	for range 100 {
		rec, err := d.readOnce(name)
		if err != errUnlinked {
			return rec, err
		}
	}
	return Record{}, errcode.New(errcode.Internal, "invocation record %s kept being replaced while it was read", filepath.Join(d.path, name))
}

func (d *recordDir) readOnce(name string) (Record, error) {
	path := filepath.Join(d.path, name)
	fd, err := unix.Openat(d.fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == unix.ELOOP {
		return Record{}, errcode.New(errcode.LinkUnsafe, "invocation record %s is a symbolic link", path)
	}
	if err != nil {
		return Record{}, errcode.Wrap(errcode.Internal, err, "open invocation record %s", path)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Record{}, errcode.Wrap(errcode.Internal, err, "stat %s", path)
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 0:
		return Record{}, errUnlinked
	case st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1:
		return Record{}, errcode.New(errcode.PathUnsafe, "invocation record %s is not a plain file", path)
	case int(st.Uid) != os.Geteuid():
		return Record{}, errcode.New(errcode.OwnerMismatch, "invocation record %s is owned by uid %d, not %d", path, st.Uid, os.Geteuid())
	case st.Mode&0o7777 != 0o600:
		return Record{}, errcode.New(errcode.ModeUnsafe, "invocation record %s has mode %04o, not 0600", path, st.Mode&0o7777)
	}
	if afterRecordOpen != nil {
		afterRecordOpen(name)
	}
	rec, err := parseRecord(f, path)
	// The file may have left name and been rewritten as another record
	// while it was read (see "Spare record files"), torn or whole: only a
	// file still at name is name's record, whatever its bytes said.
	var now unix.Stat_t
	if serr := unix.Fstatat(d.fd, name, &now, unix.AT_SYMLINK_NOFOLLOW); serr == unix.ENOENT || serr == nil && (now.Ino != st.Ino || now.Dev != st.Dev) {
		return Record{}, errUnlinked
	} else if serr != nil {
		return Record{}, errcode.Wrap(errcode.Internal, serr, "stat %s", path)
	}
	if err != nil {
		return Record{}, err
	}
	if h := recordHex(name); len(h) == keyedHex && h[:keyHex] != sourceKey(rec.SourceID) {
		// Misplaced in the index, it would be hidden from its own
		// source's polls: refused like any record that breaks a rule.
		return Record{}, errcode.New(errcode.SchemaInvalid, "%s: invalid name (it does not carry the key of source_id %q)", path, rec.SourceID)
	}
	rec.Path = path
	return rec, nil
}

// scan lists the records (sorted by name) and the temporary files of the
// directory that are in sc. Any entry that is neither is refused, in or out
// of sc: the directory is private to fm.
func (d *recordDir) scan(sc scope) (records, temps []string, err error) {
	// A fresh descriptor: a dup would share the directory offset.
	dup, err := unix.Openat(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, errcode.Wrap(errcode.Internal, err, "read %s", d.path)
	}
	f := os.NewFile(uintptr(dup), d.path)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return nil, nil, errcode.Wrap(errcode.Internal, err, "read %s", d.path)
	}
	sort.Strings(names)
	for _, name := range names {
		if h := recordHex(name); h != "" {
			if sc.has(h) {
				records = append(records, name)
			}
		} else if _, h, ok := parseTempName(name); ok {
			if sc.has(h) {
				temps = append(temps, name)
			}
		} else {
			return nil, nil, errcode.New(errcode.PathUnsafe, "unexpected entry %s in invocation records directory", filepath.Join(d.path, name))
		}
	}
	return records, temps, nil
}

// List returns every owner record in records, strictly parsed, with HostLive
// set. It only reads: an absent directory means no records and is not
// created. Any malformed record fails the whole listing, because a record
// that cannot be read cannot be proved released; except one whose name says
// it was written in an earlier boot (see bootPrefix), which is skipped:
// nothing of that boot runs, so it owns nothing whatever its bytes, and an
// unsynced record can be torn by the machine crash that ended that boot.
func List(records string) ([]Record, error) {
	return listIn(records, everyRecord, nil)
}

// ListSource is List of the records of invocations for source id: it reads
// only the records whose name carries id's key, and those named before the
// index (see sourceKey), and returns those whose source_id is id.
func ListSource(records, id string) ([]Record, error) {
	return listIn(records, sourceScope(id), func(r Record) bool { return r.SourceID == id })
}

// listIn is List of the records in sc that match (nil: all of them).
func listIn(records string, sc scope, match func(Record) bool) ([]Record, error) {
	d, err := openRecordDir(records, false)
	if d == nil || err != nil {
		return nil, err
	}
	defer d.close()
	recs, err := d.list(sc)
	if err != nil || match == nil {
		return recs, err
	}
	var out []Record
	for _, r := range recs {
		if match(r) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (d *recordDir) list(sc scope) ([]Record, error) {
	recs, _, err := d.listScan(sc)
	return recs, err
}

// scanned is one scan of a records directory (recordDir.scan): the names
// of its records and of its temporary files.
type scanned struct{ records, temps []string }

// listScan is list, and returns the scan it read as well.
func (d *recordDir) listScan(sc scope) ([]Record, scanned, error) {
	boot, err := BootID()
	if err != nil {
		return nil, scanned{}, err
	}
	names, temps, err := d.scan(sc)
	if err != nil {
		return nil, scanned{}, err
	}
	seen := scanned{names, temps}
	self, err := selfIdentity()
	if err != nil {
		return nil, seen, err
	}
	hosts := map[Identity]bool{self: true} // this process is alive; others are looked up once
	var out []Record
	for _, name := range names {
		rec, err := d.read(name)
		if errors.Is(err, unix.ENOENT) {
			continue // removed since the scan: its invocation ended
		}
		if err != nil && nameBoot(recordHex(name)) != bootPrefix(boot) {
			continue // debris of an earlier boot: it owns nothing (Cleanup removes it)
		}
		if err != nil {
			return nil, seen, err
		}
		live, known := hosts[rec.Host]
		if !known {
			if live, err = alive(rec.Host); err != nil {
				return nil, seen, err
			}
			hosts[rec.Host] = live
		}
		rec.HostLive = live
		out = append(out, rec)
	}
	return out, seen, nil
}

// Pins returns the records that pin the binding with bindingDigest: live
// invocations and unresolved records of dead hosts alike. Retiring the
// binding must refuse while any remain after Cleanup [LIFE-2].
func Pins(records string, bindingDigest string) ([]Record, error) {
	all, err := List(records)
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, r := range all {
		if r.BindingDigest == bindingDigest {
			out = append(out, r)
		}
	}
	return out, nil
}
