package launch

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/errcode"
)

// [GRP-1] [GRP-3] Records are indexed by source: a record's name is 80 hex
// digits, the first 16 of SHA-256 of its source id, then the boot id's 32,
// then 32 random ones. ListSource and CleanupSource read only the names of
// their source (a torn record of another source does not stop them) and
// every name of the form before the index, whose source only its content
// tells; List and Cleanup read every record of both forms.
func TestRecordsIndexedBySource(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	self, err := selfIdentity()
	if err != nil {
		t.Fatal(err)
	}
	dead := deadIdentity(t)
	key := func(id string) string { s := sha256.Sum256([]byte(id)); return hex.EncodeToString(s[:])[:16] }
	boot := strings.ReplaceAll(self.BootID, "-", "")

	a := fabricate(t, f.records, Record{Phase: PhaseReserved, Host: self, SourceID: "a"})
	b := fabricate(t, f.records, Record{Phase: PhaseReserved, Host: self, SourceID: "b"})
	if name := filepath.Base(a); len(name) != 80+len(".owner.json") || !strings.HasPrefix(name, key("a")+boot) {
		t.Fatalf("record of source a is named %s", name)
	}
	// A record in the name form before the index, of source a, whose host
	// is dead: every scope reads it.
	old := filepath.Join(f.records, boot+strings.Repeat("0", 32)+".owner.json")
	oldRec := fabricate(t, f.records, Record{Phase: PhaseReserved, Host: dead, SourceID: "a"})
	if err := os.Rename(oldRec, old); err != nil {
		t.Fatal(err)
	}
	paths := func(rs []Record) (out []string) {
		for _, r := range rs {
			out = append(out, r.Path)
		}
		return out
	}
	if got, err := ListSource(f.records, "a"); err != nil || strings.Join(paths(got), " ") != strings.Join([]string{old, a}, " ") && strings.Join(paths(got), " ") != strings.Join([]string{a, old}, " ") {
		t.Fatalf("ListSource(a) = %v, %v; want %s and %s", paths(got), err, a, old)
	}
	// A torn record of source b (this boot) fails b's listing and the
	// whole one, never a's.
	if err := os.WriteFile(b, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListSource(f.records, "b"); err == nil {
		t.Fatal("ListSource(b) read a torn record")
	}
	if _, err := List(f.records); err == nil {
		t.Fatal("List read a torn record")
	}
	if got, err := ListSource(f.records, "a"); err != nil || len(got) != 2 {
		t.Fatalf("ListSource(a) beside b's torn record = %v, %v", paths(got), err)
	}
	// A dead writer's temporary file of b is b's: CleanupSource(a) keeps
	// it, and clears a's old-form record of a dead host.
	bTmp := filepath.Join(f.records, tempName(filepath.Base(b), dead))
	if err := os.WriteFile(bTmp, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	// What it leaves of a, from the same listing: a's live record only.
	if n, left, err := CleanupSource(f.records, "a", func(r Record) bool { return !r.HostLive }); n != 1 || err != nil || len(left) != 1 || left[0].Path != a || !left[0].HostLive {
		t.Fatalf("CleanupSource(a) = %d, %+v, %v; want 1 cleaned and %s left", n, left, err, a)
	}
	for _, p := range []string{bTmp, a, b} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("CleanupSource(a) removed %s", p)
		}
	}
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("CleanupSource(a) kept the old-form record of a dead host")
	}
	// A record whose name carries another source's key is refused by the
	// listings that see it: it would be hidden from its own source's.
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	bRec := fabricate(t, f.records, Record{Phase: PhaseReserved, Host: self, SourceID: "b"})
	misnamed := filepath.Join(f.records, key("a")+filepath.Base(bRec)[16:])
	if err := os.Rename(bRec, misnamed); err != nil {
		t.Fatal(err)
	}
	_, err = ListSource(f.records, "a")
	assertCode(t, err, errcode.SchemaInvalid)
	if err := os.Remove(misnamed); err != nil {
		t.Fatal(err)
	}
	if n, err := Cleanup(f.records, func(r Record) bool { return !r.HostLive }); n != 0 || err != nil {
		t.Fatalf("Cleanup = %d, %v", n, err)
	}
	if _, err := os.Stat(bTmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("Cleanup kept a dead writer's temporary file")
	}
}
