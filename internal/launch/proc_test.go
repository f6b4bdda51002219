package launch

import (
	"bytes"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"firstmate.dev/fm/internal/procstat"
	"firstmate.dev/fm/internal/strictjson"
)

// members finds exactly the processes of a group, here this process's own.
func TestMembersFindsOwnGroup(t *testing.T) {
	st, err := procstat.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	ms, err := members(st.PGID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ms, func(m member) bool { return m.pid == os.Getpid() }) {
		t.Fatalf("members(%d) = %+v lacks this process %d", st.PGID, ms, os.Getpid())
	}
	for _, m := range ms {
		if m.PGID != st.PGID {
			t.Errorf("member %+v is of another group", m)
		}
	}
}

// [GRP-1] [JSON-2]: the direct record encoder writes exactly the canonical
// bytes strictjson.Canonical writes, and falls back to it for anything it
// does not handle itself.
func TestRecordEncodeIsCanonical(t *testing.T) {
	self, err := selfIdentity()
	if err != nil {
		t.Fatal(err)
	}
	pgid := 4242
	leader := Identity{PID: pgid, StartTime: 987654321, BootID: self.BootID}
	base := Record{
		Schema: RecordSchema, Phase: PhaseReserved, Host: self,
		ExtensionID: testOwner.ExtensionID, BindingDigest: testOwner.BindingDigest, RequestID: testOwner.RequestID,
		SourceID: testOwner.SourceID, Operation: testOwner.Operation, CreatedAt: 1767225600,
	}
	sid := 4000
	group := base
	group.Phase, group.GroupPID, group.Leader, group.SessionID = PhaseGroup, &pgid, &leader, &sid
	noSession := group
	noSession.SessionID = nil
	noSource := group
	noSource.SourceID = ""
	quote, ctl, utf, slash := group, group, group, group
	quote.SourceID = `a"b`
	ctl.ExtensionID = "a\tb\x7f"
	utf.Operation = "é\u2028"
	slash.RequestID = `a\b/c<d>&`
	huge := group
	huge.Host.StartTime = 1 << 60
	negative := group
	negative.CreatedAt = -5
	for name, r := range map[string]Record{
		"reserved": base, "group": group, "no-session": noSession, "no-source": noSource, "quote": quote, "control": ctl,
		"utf8": utf, "backslash": slash, "huge": huge, "negative": negative,
	} {
		want, err := strictjson.Canonical(&r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.encode()
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: encode\n%s (%v)\nwant\n%s", name, got, err, want)
		}
		// The direct decoder gives what the strict decoder gives, or
		// defers to it.
		var strict Record
		if err := strictjson.Decode(want, maxRecord, name, &strict); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		fast, ok := decodeCanonical(want)
		if ok && !reflect.DeepEqual(fast, strict) {
			t.Errorf("%s: decodeCanonical = %+v, strict %+v", name, fast, strict)
		}
		if plain := name != "quote" && name != "control" && name != "utf8" && name != "backslash" && name != "huge"; ok != plain {
			t.Errorf("%s: decodeCanonical ok = %v", name, ok)
		}
	}
	canon, _ := group.encode()
	for _, bad := range []string{
		strings.Replace(string(canon), `"created_at":`, `"created_at":0`, 1),
		strings.Replace(string(canon), `"pid":`, `"pid":-0`, 1),
		strings.Replace(string(canon), `"created_at":`, `"created_at": `, 1),
		strings.Replace(string(canon), `,"extension_id"`, ` ,"extension_id"`, 1),
		strings.Replace(string(canon), `"source_id":"src-1"`, `"source_id":"src\u002d1"`, 1),
		strings.Replace(string(canon), `"group_pid":4242`, `"group_pid":4242.0`, 1),
		strings.Replace(string(canon), `"group_pid":4242`, `"group_pid":1e3`, 1),
		strings.Replace(string(canon), `"session_id":4000`, `"session_id":04000`, 1),
		string(canon) + "\n", " " + string(canon), string(canon[:len(canon)-1]),
		strings.Replace(string(canon), `{"binding_digest"`, `{"operation":"x","binding_digest"`, 1),
	} {
		if r, ok := decodeCanonical([]byte(bad)); ok {
			t.Errorf("decodeCanonical accepted %s as %+v", bad, r)
		}
	}
}

// [GRP-1] [GRP-3]: readers racing with writers never refuse a record because
// its writer replaced or removed it between the reader's open and fstat;
// they see a complete record or none.
func TestListRacesWriters(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d, err := openRecordDir(f.records, true)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	self, err := selfIdentity()
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				name, err := newRecordName()
				if err != nil {
					t.Error(err)
					return
				}
				rec := Record{Schema: RecordSchema, Phase: PhaseReserved, Host: self, ExtensionID: "x", BindingDigest: "y", RequestID: "z", Operation: "o", CreatedAt: 1}
				if err := d.write(name, &rec); err != nil {
					t.Error(err)
					return
				}
				pid := self.PID
				rec.Phase, rec.GroupPID, rec.Leader = PhaseGroup, &pid, &self
				if err := d.write(name, &rec); err != nil {
					t.Error(err)
					return
				}
				if err := d.removeErr(name); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	lists := 0
	for time.Now().Before(deadline) {
		if _, err := List(f.records); err != nil {
			t.Errorf("List during writes: %v", err)
			break
		}
		lists++
	}
	close(stop)
	wg.Wait()
	t.Logf("%d listings", lists)
}
