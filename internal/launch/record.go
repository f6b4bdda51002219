package launch

import (
	"bytes"
	"crypto/rand"
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
// 0600, in a private 0700 directory [GRP-1]. <hex> is 64 lower-case hex
// digits: the boot id's 32 (see bootPrefix), then 32 of fresh randomness, not
// derived from the request id: a retry reuses its request id [RID-1] and may
// overlap a dying earlier attempt, and each attempt needs its own record.
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

// encode returns rec's canonical JSON, the bytes strictjson.Canonical
// gives. Every record is written twice on the path of every invocation, the
// first time in a fresh process, where the reflective encoder first has to
// learn the type; so when every string is plain printable ASCII (nothing to
// escape) and every number an integer below 2^53, which is always the case
// for the records fm writes, it is written directly, keys in bytewise order.
// Otherwise strictjson.Canonical encodes it.
func (r *Record) encode() ([]byte, error) {
	plain := func(ss ...string) bool {
		for _, s := range ss {
			for i := 0; i < len(s); i++ {
				if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
					return false
				}
			}
		}
		return true
	}
	const exact = 1 << 53
	small := func(id *Identity) bool {
		return id == nil || (id.PID > -exact && id.PID < exact && id.StartTime < exact)
	}
	if !plain(r.BindingDigest, r.ExtensionID, r.Operation, r.Phase, r.RequestID, r.Schema, r.SourceID, r.Host.BootID) ||
		(r.Leader != nil && !plain(r.Leader.BootID)) || !small(&r.Host) || !small(r.Leader) ||
		r.CreatedAt <= -exact || r.CreatedAt >= exact || (r.GroupPID != nil && (*r.GroupPID <= -exact || *r.GroupPID >= exact)) ||
		(r.SessionID != nil && (*r.SessionID <= -exact || *r.SessionID >= exact)) {
		return strictjson.Canonical(r)
	}
	str := func(b []byte, key, v string) []byte {
		b = append(b, '"')
		b = append(b, key...)
		b = append(b, `":"`...)
		b = append(b, v...)
		return append(b, '"')
	}
	identity := func(b []byte, key string, id *Identity) []byte {
		b = append(b, '"')
		b = append(b, key...)
		b = append(b, `":`...)
		if id == nil {
			return append(b, "null"...)
		}
		b = str(append(b, '{'), "boot_id", id.BootID)
		b = strconv.AppendInt(append(b, `,"pid":`...), int64(id.PID), 10)
		b = strconv.AppendUint(append(b, `,"start_time":`...), id.StartTime, 10)
		return append(b, '}')
	}
	b := make([]byte, 0, 640)
	b = str(append(b, '{'), "binding_digest", r.BindingDigest)
	b = strconv.AppendInt(append(b, `,"created_at":`...), r.CreatedAt, 10)
	b = str(append(b, ','), "extension_id", r.ExtensionID)
	b = append(b, `,"group_pid":`...)
	if r.GroupPID == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, int64(*r.GroupPID), 10)
	}
	b = identity(append(b, ','), "host", &r.Host)
	b = identity(append(b, ','), "leader", r.Leader)
	b = str(append(b, ','), "operation", r.Operation)
	b = str(append(b, ','), "phase", r.Phase)
	b = str(append(b, ','), "request_id", r.RequestID)
	b = str(append(b, ','), "schema", r.Schema)
	b = append(b, `,"session_id":`...)
	if r.SessionID == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, int64(*r.SessionID), 10)
	}
	b = str(append(b, ','), "source_id", r.SourceID)
	return append(b, '}'), nil
}

// decodeCanonical parses a record in exactly the form encode writes, without
// reflection: the records of every live invocation are read on every poll of
// a busy serve. It reports false for anything else, which the strict decoder
// then judges. It accepts only bytes equal to encode's output for the record
// it parsed, and the strict decoder yields that same record from them.
func decodeCanonical(data []byte) (Record, bool) {
	var r Record
	c := cursor{b: data, ok: true}
	c.lit(`{"binding_digest":`)
	r.BindingDigest = c.str()
	c.lit(`,"created_at":`)
	r.CreatedAt = c.num()
	c.lit(`,"extension_id":`)
	r.ExtensionID = c.str()
	c.lit(`,"group_pid":`)
	if !c.null() {
		pid := int(c.num())
		r.GroupPID = &pid
	}
	c.lit(`,"host":`)
	r.Host = c.identity()
	c.lit(`,"leader":`)
	if !c.null() {
		id := c.identity()
		r.Leader = &id
	}
	c.lit(`,"operation":`)
	r.Operation = c.str()
	c.lit(`,"phase":`)
	r.Phase = c.str()
	c.lit(`,"request_id":`)
	r.RequestID = c.str()
	c.lit(`,"schema":`)
	r.Schema = c.str()
	c.lit(`,"session_id":`)
	if !c.null() {
		sid := int(c.num())
		r.SessionID = &sid
	}
	c.lit(`,"source_id":`)
	r.SourceID = c.str()
	c.lit(`}`)
	if !c.ok || len(c.b) != 0 {
		return Record{}, false
	}
	if enc, err := r.encode(); err != nil || !bytes.Equal(enc, data) {
		return Record{}, false
	}
	return r, true
}

// cursor scans canonical record bytes; any surprise clears ok.
type cursor struct {
	b  []byte
	ok bool
}

func (c *cursor) lit(s string) {
	if c.ok && bytes.HasPrefix(c.b, []byte(s)) {
		c.b = c.b[len(s):]
		return
	}
	c.ok = false
}

func (c *cursor) null() bool {
	if c.ok && bytes.HasPrefix(c.b, []byte("null")) {
		c.b = c.b[4:]
		return true
	}
	return false
}

// str reads a string of plain printable ASCII without escapes.
func (c *cursor) str() string {
	if !c.ok || len(c.b) == 0 || c.b[0] != '"' {
		c.ok = false
		return ""
	}
	for i := 1; i < len(c.b); i++ {
		switch ch := c.b[i]; {
		case ch == '"':
			s := string(c.b[1:i])
			c.b = c.b[i+1:]
			return s
		case ch < 0x20 || ch > 0x7e || ch == '\\':
			c.ok = false
			return ""
		}
	}
	c.ok = false
	return ""
}

// num reads an optionally negative decimal integer; encode's re-check
// refuses any form it would not write (leading zeros, "-0", ...).
func (c *cursor) num() int64 {
	i := 0
	if i < len(c.b) && c.b[i] == '-' {
		i++
	}
	j := i
	for j < len(c.b) && '0' <= c.b[j] && c.b[j] <= '9' {
		j++
	}
	if !c.ok || j == i || j-i > 18 {
		c.ok = false
		return 0
	}
	n, err := strconv.ParseInt(string(c.b[:j]), 10, 64)
	if err != nil {
		c.ok = false
		return 0
	}
	c.b = c.b[j:]
	return n
}

func (c *cursor) identity() Identity {
	var id Identity
	c.lit(`{"boot_id":`)
	id.BootID = c.str()
	c.lit(`,"pid":`)
	id.PID = int(c.num())
	c.lit(`,"start_time":`)
	if n := c.num(); n >= 0 {
		id.StartTime = uint64(n)
	} else {
		c.ok = false
	}
	c.lit(`}`)
	return id
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
var recordDirRule = fsutil.DirRule{What: "invocation records directory", Perm: fsutil.OwnerOnly}

func (d *recordDir) close() { d.dir.Close() }

// newRecordName returns a fresh "<64 hex>.owner.json": the 32 hex digits of
// this boot's id (see bootPrefix), then 32 of fresh randomness.
func newRecordName() (string, error) {
	boot, err := bootID()
	if err != nil {
		return "", err
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "random record name")
	}
	return bootPrefix(boot) + hex.EncodeToString(b[:]) + recordSuffix, nil
}

// bootPrefix is how a record name starts when the record was written in the
// boot with id boot: its 32 hex digits without dashes. A record whose name
// starts otherwise was written in an earlier boot (or by a version of fm that
// did not name records so), and nothing of an earlier boot still runs.
func bootPrefix(boot string) string { return strings.ReplaceAll(boot, "-", "") }

// recordHex returns the <hex> of a record file name, or "" if name is not
// one.
func recordHex(name string) string {
	h, ok := strings.CutSuffix(name, recordSuffix)
	if !ok || len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		return ""
	}
	return h
}

// tempName is the temporary file a record is written to before it is renamed
// into place: ".<hex>.<host pid>-<host start time>.tmp". The host identity in
// the name lets Cleanup delete a temporary file whose writer is dead without
// reading it (it may be partial). Temporary files carry no ownership: package
// code is released only after the record itself is renamed into place.
func tempName(record string, host Identity) string {
	return "." + recordHex(record) + "." + strconv.Itoa(host.PID) + "-" + strconv.FormatUint(host.StartTime, 10) + tempSuffix
}

// parseTempName returns the writer of a temporary file name.
func parseTempName(name string) (Identity, bool) {
	rest, ok := strings.CutPrefix(name, ".")
	if !ok {
		return Identity{}, false
	}
	rest, ok = strings.CutSuffix(rest, tempSuffix)
	if !ok {
		return Identity{}, false
	}
	h, owner, ok := strings.Cut(rest, ".")
	if !ok || recordHex(h+recordSuffix) == "" {
		return Identity{}, false
	}
	p, s, ok := strings.Cut(owner, "-")
	pid, err1 := strconv.Atoi(p)
	start, err2 := strconv.ParseUint(s, 10, 64)
	if !ok || err1 != nil || err2 != nil || pid <= 0 || strconv.Itoa(pid) != p || strconv.FormatUint(start, 10) != s {
		return Identity{}, false
	}
	return Identity{PID: pid, StartTime: start}, true
}

// write publishes rec as name: write a temporary file, rename it over name.
// A reader sees the old record or the new one, never a mix, and once write
// returns every later reader sees it, whatever happens to this process: the
// record lives in the kernel's page cache, which a process's death does not
// touch. Nothing is fsynced; see "Records and durability" in the package
// documentation for why that is the guarantee the record needs.
func (d *recordDir) write(name string, rec *Record) error {
	data, err := rec.encode()
	if err != nil {
		return err
	}
	if err := d.publish(tempName(name, rec.Host), name, data); err != nil {
		return err
	}
	mine := ownRecord{rec: *rec}
	mine.rec.Path = filepath.Join(d.path, name)
	if unix.Fstatat(d.fd, name, &mine.st, unix.AT_SYMLINK_NOFOLLOW) == nil {
		own.Store(mine.rec.Path, mine)
	}
	return nil
}

// own holds the records this process wrote and has not removed, by path, with
// the file's identity once published: list takes a record from here instead
// of reading it back while the file at that name is still exactly the one
// written (same inode, same change time; any write, chmod or rename of it
// changes the latter). Every runner's pre-poll check lists the home's
// records; in a serve with hundreds of sources, reading every one of them
// back for every poll was most of its file reads.
var own sync.Map // string -> ownRecord

type ownRecord struct {
	rec Record
	st  unix.Stat_t
}

// mine returns the record at name if this process wrote it and the file is
// unchanged since.
func (d *recordDir) mine(name string) (Record, bool) {
	v, ok := own.Load(filepath.Join(d.path, name))
	if !ok {
		return Record{}, false
	}
	o := v.(ownRecord)
	var st unix.Stat_t
	if unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil ||
		st.Dev != o.st.Dev || st.Ino != o.st.Ino || st.Ctim != o.st.Ctim || st.Size != o.st.Size || st.Nlink != 1 {
		return Record{}, false
	}
	return o.rec, true
}

// publish writes data under the temporary name tmp and publishes it as
// name, not durably (fsutil.NewOptions.NoSync: see "Records and durability"
// in the package documentation). A record already at name (the reserved
// record, rewritten in phase group) is swapped out atomically
// (fsutil.Pending.Exchange) rather than renamed over: ext4 (auto_da_alloc)
// answers a rename over a name by allocating the new file's blocks at once,
// which makes the record's eventual unlink cost a block free (and a discard,
// where the file system is mounted so): about 0.1 ms of every invocation on
// the reference machines, against a few microseconds for a record that
// lives and dies in the page cache.
func (d *recordDir) publish(tmp, name string, data []byte) error {
	p, err := fsutil.NewAt(d.dir, fsutil.NewOptions{Temp: tmp, NoSync: true})
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "create %s", filepath.Join(d.path, tmp))
	}
	if _, err = p.Write(data); err == nil {
		err = p.Exchange(name)
	}
	p.Abort()
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "write invocation record %s", filepath.Join(d.path, name))
	}
	return nil
}

// removeErr removes name and returns only the error.
func (d *recordDir) removeErr(name string) error {
	_, err := d.remove(name)
	return err
}

// remove deletes name. It reports false if name was already gone. Like
// write, it does not fsync: a record that reappears after a machine crash
// names an earlier boot, and Cleanup clears it.
func (d *recordDir) remove(name string) (bool, error) {
	own.Delete(filepath.Join(d.path, name))
	removed, err := fsutil.UnlinkAt(d.dir, name)
	if err != nil {
		return false, errcode.Wrap(errcode.Internal, err, "remove invocation record %s", filepath.Join(d.path, name))
	}
	return removed, nil
}

// errUnlinked is readOnce's answer for a record file that lost its last
// link between the open and the fstat.
var errUnlinked = errors.New("record file unlinked while it was opened")

// read reads and strictly parses one record: a regular file (not a link, not a
// FIFO), owned by the effective user, mode exactly 0600, one link, at most
// maxRecord bytes of canonical-schema JSON with exactly the record's keys.
//
// A file that has no link left once opened was replaced (the reserved record
// rewritten in phase group) or removed (its invocation ended) just after the
// open: the name is looked up again, so a reader gets the record that is
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
	data, err := strictjson.Read(f, maxRecord, path)
	if err != nil {
		return Record{}, err
	}
	rec, ok := decodeCanonical(data)
	if !ok {
		if err := strictjson.Decode(data, maxRecord, path, &rec); err != nil {
			return Record{}, err
		}
	}
	if err := rec.validate(path); err != nil {
		return Record{}, err
	}
	rec.Path = path
	return rec, nil
}

// scan lists the records (sorted by name) and the temporary files of the
// directory. Any other entry is refused: the directory is private to fm.
func (d *recordDir) scan() (records, temps []string, err error) {
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
		if recordHex(name) != "" {
			records = append(records, name)
		} else if _, ok := parseTempName(name); ok {
			temps = append(temps, name)
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
	d, err := openRecordDir(records, false)
	if d == nil || err != nil {
		return nil, err
	}
	defer d.close()
	return d.list()
}

func (d *recordDir) list() ([]Record, error) {
	boot, err := bootID()
	if err != nil {
		return nil, err
	}
	names, _, err := d.scan()
	if err != nil {
		return nil, err
	}
	self, err := selfIdentity()
	if err != nil {
		return nil, err
	}
	hosts := map[Identity]bool{self: true} // this process is alive; others are looked up once
	var out []Record
	for _, name := range names {
		rec, ok := d.mine(name)
		if !ok {
			var err error
			rec, err = d.read(name)
			if errors.Is(err, unix.ENOENT) {
				continue // removed since the scan: its invocation ended
			}
			if err != nil && !strings.HasPrefix(name, bootPrefix(boot)) {
				continue // debris of an earlier boot: it owns nothing (Cleanup removes it)
			}
			if err != nil {
				return nil, err
			}
		}
		live, seen := hosts[rec.Host]
		if !seen {
			if live, err = alive(rec.Host); err != nil {
				return nil, err
			}
			hosts[rec.Host] = live
		}
		rec.HostLive = live
		out = append(out, rec)
	}
	return out, nil
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
