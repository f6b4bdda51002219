package launch_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/strictjson"
)

// FuzzList writes arbitrary bytes as one owner record of this boot (in the
// name form before the source index, which every listing reads) and reads
// the directory with List, as every cleanup does ([GRP-1], [GRP-3]).
// Whatever List accepts must be exactly what the strict decoder reads from
// the same bytes and must pass the record rules restated here, and whatever
// the strict decoder and those rules accept, List must accept: a record that
// cannot be read cannot be proved released, so a wrong refusal blocks
// retirement and a wrong acceptance releases a group that is not proved
// gone.
func FuzzList(f *testing.F) {
	dir, boot := recordsDir(f)
	name := recordName(boot, 0)
	rec := groupRecord(boot, 4242, "src")
	good, err := strictjson.Canonical(&rec)
	if err != nil {
		f.Fatal(err)
	}
	r := func(old, new string) []byte { return []byte(strings.Replace(string(good), old, new, 1)) }
	for _, s := range [][]byte{
		good, r(`"phase":"group"`, `"phase":"reserved"`), r(`"group_pid":4242`, `"group_pid":null`), r(`"group_pid":4242`, `"group_pid":1`),
		r(`"group_pid":4242`, `"group_pid":04242`), r(`"created_at":1700000000`, `"created_at":-0`), r(`"created_at":1700000000`, `"created_at":1.7e9`),
		r(`"source_id":"src"`, `"source_id":"s\u0072c"`), r(`"source_id":"src"`, `"source_id":""`), r(`{"binding_digest"`, `{ "binding_digest"`),
		r(`"start_time":123456`, `"start_time":-1`), r(`"pid":4242,`, `"pid":4243,`), r(boot, strings.ToUpper(boot)), append(good, '\n'),
		r(`"schema":`, `"extra":1,"schema":`),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := launch.List(dir)
		var want launch.Record
		ok := strictjson.Decode(data, 4096, "reference", &want) == nil && valid(&want)
		switch {
		case err == nil && (len(got) != 1 || !ok):
			t.Fatalf("List accepted %q as %+v; the strict decoder and the record rules refuse it", data, got)
		case err == nil:
			got[0].Path, got[0].HostLive = "", false
			if !reflect.DeepEqual(got[0], want) {
				t.Fatalf("List read %q as %+v; the strict decoder reads %+v", data, got[0], want)
			}
		case ok:
			t.Fatalf("List refused %q (%v); the strict decoder and the record rules accept it", data, err)
		default:
			switch errcode.Of(err) {
			case errcode.JSONInvalid, errcode.JSONOversized, errcode.SchemaInvalid:
			default:
				t.Fatalf("refused as %s: %v", errcode.Of(err), err)
			}
		}
	})
}

// valid restates the owner record rules ([GRP-1], [GRP-4]): the schema; no
// group while reserved, and a group that is its leader's pid, above 1, once
// published; exact identities (a pid and a boot id); the owner; a time.
func valid(r *launch.Record) bool {
	id := func(i launch.Identity) bool { return i.PID > 0 && bootID(i.BootID) }
	switch r.Phase {
	case launch.PhaseReserved:
		if r.GroupPID != nil || r.Leader != nil {
			return false
		}
	case launch.PhaseGroup:
		if r.GroupPID == nil || r.Leader == nil || *r.GroupPID != r.Leader.PID || *r.GroupPID <= 1 || !id(*r.Leader) {
			return false
		}
	default:
		return false
	}
	return r.Schema == launch.RecordSchema && id(r.Host) && r.ExtensionID != "" && r.BindingDigest != "" && r.RequestID != "" && r.Operation != "" && r.CreatedAt > 0
}

// bootID is the form of /proc/sys/kernel/random/boot_id: a lower-case UUID.
func bootID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return false
			}
		} else if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// TestListedRecordsAreTheirOwn: List parses the same bytes at the same path
// once and remembers what they parsed to (a serve's maintenance reads every
// owner record every 30 s); what a caller does to the record it got, through
// its pointers too, never reaches the next reader [GRP-1].
func TestListedRecordsAreTheirOwn(t *testing.T) {
	dir, boot := recordsDir(t)
	pid, session := 4242, 77
	rec := groupRecord(boot, pid, "")
	rec.SessionID = &session
	data, err := strictjson.Canonical(&rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, recordName(boot, 0)), data, 0o600); err != nil {
		t.Fatal(err)
	}
	first, err := launch.List(dir)
	if err != nil || len(first) != 1 {
		t.Fatal(first, err)
	}
	*first[0].GroupPID, first[0].Leader.PID, *first[0].SessionID = 1, 1, 1
	for range 2 {
		again, err := launch.List(dir)
		if err != nil || len(again) != 1 {
			t.Fatal(again, err)
		}
		if *again[0].GroupPID != pid || again[0].Leader.PID != pid || *again[0].SessionID != session {
			t.Fatalf("a caller's change reached the next reader: %+v %+v", *again[0].GroupPID, *again[0].Leader)
		}
		*again[0].GroupPID, again[0].Leader.PID, *again[0].SessionID = 2, 2, 2
	}
}

// BenchmarkList1000: List of 1,000 owner records, the read a serve's
// maintenance makes of every record every 30 s (docs/performance.md,
// "Ninth pass").
func BenchmarkList1000(b *testing.B) {
	dir, boot := recordsDir(b)
	for i := range 1000 {
		rec := groupRecord(boot, 10000+i, "")
		rec.SessionID = rec.GroupPID
		data, err := strictjson.Canonical(&rec)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, recordName(boot, i)), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if recs, err := launch.List(dir); err != nil || len(recs) != 1000 {
			b.Fatal(len(recs), err)
		}
	}
}

// recordsDir returns this boot's id and a new private records directory;
// without a boot id it skips tb.
func recordsDir(tb testing.TB) (dir, boot string) {
	tb.Helper()
	boot, err := launch.BootID()
	if err != nil {
		tb.Skip("no boot id:", err)
	}
	dir = tb.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	return dir, boot
}

// groupRecord is a valid record in phase group of this boot: leader and
// group pid, and a host that is not alive (pid 99999999).
func groupRecord(boot string, pid int, source string) launch.Record {
	return launch.Record{Schema: launch.RecordSchema, Phase: launch.PhaseGroup, GroupPID: &pid,
		Leader:      &launch.Identity{PID: pid, StartTime: 123456, BootID: boot},
		Host:        launch.Identity{PID: 99999999, StartTime: 1, BootID: boot},
		ExtensionID: "org.example.a", BindingDigest: "sha256:" + strings.Repeat("b", 64), RequestID: "sha256:" + strings.Repeat("c", 64),
		SourceID: source, Operation: "source.poll", CreatedAt: 1700000000}
}

// recordName is the name of record i of this boot in the form before the
// source index, which every listing reads.
func recordName(boot string, i int) string {
	return strings.ReplaceAll(boot, "-", "") + fmt.Sprintf("%032x", i) + ".owner.json"
}
