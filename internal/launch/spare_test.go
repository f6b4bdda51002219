package launch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inodes returns the names and inode numbers of the entries of dir.
func inodes(t *testing.T, dir string) map[string]uint64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = info.Sys().(*syscall.Stat_t).Ino
	}
	return out
}

// [GRP-1] With spares kept (serve), invocations reuse the files of earlier
// records instead of creating new ones: after a first invocation, ten more
// allocate no inode, and what stays in the directory is only temporary
// files of this process, which listings ignore and Cleanup keeps while this
// process lives. When the keeper is done, the spares are unlinked; without
// spares an invocation leaves nothing.
func TestSpareRecordsReuseFiles(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	done := KeepSpares(f.records)
	if _, err := Run(context.Background(), f.spec("record")); err != nil {
		t.Fatal(err)
	}
	first := inodes(t, f.records)
	if len(first) == 0 {
		t.Fatal("no spare kept after an invocation")
	}
	self, _ := selfIdentity()
	known := map[uint64]bool{}
	for name, ino := range first {
		if w, _, ok := parseTempName(name); !ok || w.PID != self.PID || w.StartTime != self.StartTime {
			t.Fatalf("%s left in the records directory is not a temporary file of this process", name)
		}
		known[ino] = true
	}
	for range 10 {
		if _, err := Run(context.Background(), f.spec("record")); err != nil {
			t.Fatal(err)
		}
	}
	after := inodes(t, f.records)
	for name, ino := range after {
		if !known[ino] {
			t.Errorf("%s (inode %d) is a new file: spares were not reused", name, ino)
		}
	}
	if recs, err := List(f.records); err != nil || len(recs) != 0 {
		t.Fatalf("List beside spares = %v, %v", recs, err)
	}
	if n, err := Cleanup(f.records, func(Record) bool { return true }); err != nil || n != 0 || len(inodes(t, f.records)) != len(after) {
		t.Fatalf("Cleanup touched the spares of a live process: %d, %v", n, err)
	}
	done()
	if left := inodes(t, f.records); len(left) != 0 {
		t.Fatalf("spares left after the keeper is done: %v", left)
	}
	if _, err := Run(context.Background(), f.spec("record")); err != nil {
		t.Fatal(err)
	}
	if left := inodes(t, f.records); len(left) != 0 {
		t.Fatalf("an invocation without spares left %v", left)
	}
}

// [GRP-1] A record file reused as a spare may be rewritten while a reader
// holds it open from its earlier name: the reader must then take the name
// as gone, never read the other record as this one (nor refuse it as torn).
//
// Not parallel: it sets afterRecordOpen, which every reader of the package
// calls.
func TestReaderOfReusedRecordFile(t *testing.T) {
	f := newFixture(t)
	defer KeepSpares(f.records)()
	self, _ := selfIdentity()
	old := fabricate(t, f.records, Record{Phase: PhaseReserved, Host: self, SourceID: "old"})
	d, err := openRecordDir(f.records, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	var steps []string
	afterRecordOpen = func(name string) {
		if name != filepath.Base(old) || len(steps) > 0 {
			return
		}
		// The invocation of old ends, and its file becomes another
		// source's record, torn (written halfway) or whole.
		if removed, err := d.release(name); !removed || err != nil {
			t.Errorf("release: %v, %v", removed, err)
		}
		steps = append(steps, "released")
		fabricate(t, f.records, Record{Phase: PhaseReserved, Host: self, SourceID: "new"})
		steps = append(steps, "rewritten")
	}
	t.Cleanup(func() { afterRecordOpen = nil })
	_, err = d.read(filepath.Base(old))
	if !errors.Is(err, unix.ENOENT) {
		t.Fatalf("read of a record whose file was reused meanwhile = %v, want ENOENT", err)
	}
	if !slices.Equal(steps, []string{"released", "rewritten"}) {
		t.Fatalf("steps = %v", steps)
	}
	recs, err := ListSource(f.records, "new")
	if err != nil || len(recs) != 1 {
		t.Fatalf("ListSource(new) = %v, %v", recs, err)
	}
}

// [GRP-1] [RUN-3] Readers under churn with spares kept: while writers keep
// publishing records of sources of different lengths, rewriting them in
// phase group and releasing them into spares that the next write reuses,
// List never fails and never returns a record under another's name.
func TestListUnderSpareChurn(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	defer KeepSpares(f.records)()
	self, _ := selfIdentity()
	leader := Identity{PID: 4242, StartTime: 1, BootID: self.BootID}
	var stop atomic.Bool
	var writes atomic.Int64
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			d, err := openRecordDir(f.records, true)
			if err != nil {
				panic(err)
			}
			defer d.close()
			for i := 0; !stop.Load(); i++ {
				id := strings.Repeat("s", 1+(i*7+w)%40)
				name, _ := newRecordName(id)
				rec := Record{Schema: RecordSchema, Phase: PhaseReserved, Host: self, SourceID: id, CreatedAt: 1,
					ExtensionID: testOwner.ExtensionID, BindingDigest: testOwner.BindingDigest, RequestID: testOwner.RequestID, Operation: testOwner.Operation}
				if err := d.write(name, &rec); err != nil {
					panic(err)
				}
				pid, sid := 4242, 1
				rec.Phase, rec.GroupPID, rec.SessionID, rec.Leader = PhaseGroup, &pid, &sid, &leader
				if err := d.write(name, &rec); err != nil {
					panic(err)
				}
				if _, err := d.release(name); err != nil {
					panic(err)
				}
				writes.Add(1)
			}
		})
	}
	deadline := time.Now().Add(2 * time.Second)
	lists := 0
	for ; time.Now().Before(deadline) || lists < 50; lists++ {
		recs, err := List(f.records)
		if err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("List under churn, after %d lists and %d writes: %v", lists, writes.Load(), err)
		}
		for _, r := range recs {
			if h := recordHex(filepath.Base(r.Path)); h[:keyHex] != sourceKey(r.SourceID) {
				t.Fatalf("%s read as a record of %q", r.Path, r.SourceID)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	if writes.Load() < 100 {
		t.Fatalf("only %d invocations written in the churn", writes.Load())
	}
	t.Logf("%d lists beside %d invocations", lists, writes.Load())
}
