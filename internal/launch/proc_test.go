package launch

import (
	"firstmate.dev/fm/internal/procstat"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
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
				name, err := newRecordName("")
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
				if err := d.releaseErr(name); err != nil {
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
