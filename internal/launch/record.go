package launch

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
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
// 0600, in a private 0700 directory [GRP-1]. <hex> is 64 lower-case hex digits
// of fresh randomness, not derived from the request id: a retry reuses its
// request id [RID-1] and may overlap a dying earlier attempt, and each attempt
// needs its own record.
type Record struct {
	Schema string `json:"schema"` // RecordSchema
	Phase  string `json:"phase"`  // PhaseReserved or PhaseGroup
	// GroupPID is the process group id, equal to Leader.PID; both are null
	// while Phase is PhaseReserved.
	GroupPID *int      `json:"group_pid"`
	Leader   *Identity `json:"leader"` // the launch barrier, later the entrypoint (same process)
	Host     Identity  `json:"host"`   // the fm process that supervises the invocation

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
		if r.GroupPID != nil || r.Leader != nil {
			return bad("group_pid/leader (must be null while reserved)")
		}
	case PhaseGroup:
		// A group id of 1 would make kill(-1, ...) mean "every process".
		if r.GroupPID == nil || r.Leader == nil || *r.GroupPID != r.Leader.PID || r.Leader.PID <= 1 || !validIdentity(*r.Leader) {
			return bad("group_pid/leader")
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
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case err == unix.ENOENT && !create:
		return nil, nil
	case err == unix.ELOOP || err == unix.ENOTDIR:
		// O_NOFOLLOW|O_DIRECTORY reports a link as either.
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
			return nil, errcode.New(errcode.LinkUnsafe, "invocation records directory %s is a symbolic link", path)
		}
		return nil, errcode.New(errcode.PathUnsafe, "invocation records directory %s is not a directory", path)
	case err != nil:
		return nil, errcode.Wrap(errcode.HomeInvalid, err, "open invocation records directory %s", path)
	}
	d := &recordDir{fd: fd, path: path}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		d.close()
		return nil, errcode.Wrap(errcode.Internal, err, "stat %s", path)
	}
	if int(st.Uid) != os.Geteuid() {
		d.close()
		return nil, errcode.New(errcode.OwnerMismatch, "invocation records directory %s is owned by uid %d, not %d", path, st.Uid, os.Geteuid())
	}
	if st.Mode&0o077 != 0 {
		d.close()
		return nil, errcode.New(errcode.ModeUnsafe, "invocation records directory %s has mode %04o; it must be private (0700)", path, st.Mode&0o7777)
	}
	return d, nil
}

func (d *recordDir) close() { unix.Close(d.fd) }

// newRecordName returns a fresh "<64 hex>.owner.json".
func newRecordName() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "random record name")
	}
	return hex.EncodeToString(b[:]) + recordSuffix, nil
}

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

// write publishes rec as name durably: write a temporary file, fsync it,
// rename it over name, fsync the directory. A reader sees the old record or
// the new one, never a mix; after write returns the record survives a crash.
func (d *recordDir) write(name string, rec *Record) error {
	data, err := strictjson.Canonical(rec)
	if err != nil {
		return err
	}
	tmp := tempName(name, rec.Host)
	fd, err := unix.Openat(d.fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "create %s", filepath.Join(d.path, tmp))
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.path, tmp))
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o600) // the umask must not decide the mode
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(d.fd, tmp, d.fd, name)
	}
	if err != nil {
		_ = unix.Unlinkat(d.fd, tmp, 0)
		return errcode.Wrap(errcode.Internal, err, "write invocation record %s", filepath.Join(d.path, name))
	}
	return d.sync()
}

// removeErr removes name durably and returns only the error.
func (d *recordDir) removeErr(name string) error {
	_, err := d.remove(name)
	return err
}

// remove deletes name durably. It reports false if name was already gone.
func (d *recordDir) remove(name string) (bool, error) {
	err := unix.Unlinkat(d.fd, name, 0)
	if err == unix.ENOENT {
		return false, nil
	}
	if err != nil {
		return false, errcode.Wrap(errcode.Internal, err, "remove invocation record %s", filepath.Join(d.path, name))
	}
	return true, d.sync()
}

func (d *recordDir) sync() error {
	if err := unix.Fsync(d.fd); err != nil {
		return errcode.Wrap(errcode.Internal, err, "fsync %s", d.path)
	}
	return nil
}

// read reads and strictly parses one record: a regular file (not a link, not a
// FIFO), owned by the effective user, mode exactly 0600, one link, at most
// maxRecord bytes of canonical-schema JSON with exactly the record's keys.
func (d *recordDir) read(name string) (Record, error) {
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
	var rec Record
	if err := strictjson.Decode(data, maxRecord, path, &rec); err != nil {
		return Record{}, err
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
// that cannot be read cannot be proved released.
func List(records string) ([]Record, error) {
	d, err := openRecordDir(records, false)
	if d == nil || err != nil {
		return nil, err
	}
	defer d.close()
	return d.list()
}

func (d *recordDir) list() ([]Record, error) {
	names, _, err := d.scan()
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, name := range names {
		rec, err := d.read(name)
		if errors.Is(err, unix.ENOENT) {
			continue // removed since the scan: its invocation ended
		}
		if err != nil {
			return nil, err
		}
		if rec.HostLive, err = alive(rec.Host); err != nil {
			return nil, err
		}
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
