package homeimport

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/wake"
)

// [HOME-4] [LIFE-2] Before the import, fm's readers refuse the earlier
// format with home-import-needed (never schema-invalid), and fm doctor says
// to run fm home import.
func TestReadersRefuseEarlierFormat(t *testing.T) {
	f := newFixture(t)
	for _, args := range [][]string{
		{"procevent", "inbox"},
		{"procevent", "list"},
		{"wake", "list"},
		{"procevent", "classify", filepath.Join(f.h.Inbox(), "mail.3.result")},
		{"procevent", "retire", "mail", "--if-owner", f.mailToken},
		{"extension", "retire-transfer", xferID, "--if-transfer-digest", f.transferDigest, "--if-binding-digest", f.xfer.Digest},
	} {
		if e := f.refused("home-import-needed", args...); !strings.Contains(e, "run fm home import") {
			t.Errorf("fm %s: %s", strings.Join(args, " "), e)
		}
	}
	out := f.fm(1, "doctor")
	if !strings.Contains(out, "FAIL  import") || !strings.Contains(out, "[home-import-needed]") || !strings.Contains(out, "run fm home import") {
		t.Fatalf("doctor does not point at the import:\n%s", out)
	}
}

// [HOME-4] [REG-2] [REG-4] [CAP-1] [CAP-3] [CAP-4] [WAKE-1] [XFER-6] The import
// converts everything, keeps every replaced file, and afterwards every fm
// command works on the home and nothing was lost: result bytes, handled
// state, sequences, tokens, the wake queue.
func TestImportThenEverythingWorks(t *testing.T) {
	f := newFixture(t)
	before := f.snapshot()
	dry := f.fm(0, "home", "import", "--dry-run")
	if d := diff(before, f.snapshot()); d != "" {
		t.Fatalf("--dry-run changed the home:\n%s", d)
	}
	if !strings.HasSuffix(dry, "would import: sources=3 results=4 unhandled=2 transfers=1\n") {
		t.Fatalf("dry run:\n%s", dry)
	}
	out := f.fm(0, "home", "import")
	t.Logf("fm home import:\n%s", out)
	if !strings.HasSuffix(out, "imported: sources=3 results=4 unhandled=2 transfers=1\n") {
		t.Fatalf("import:\n%s", out)
	}
	for _, want := range []string{"source mail: fake from org.example.fake@1.0.0", "unbound old: binding " + token("gone binding"), "result mail.3: fake org.example.fake@1.0.0, unhandled",
		"result web.1: web built-in, handled", "transfer org.example.xfer@1.0.0", "mode state: 0755 -> 0700", "mode state/procevent-inbox/web.2.result: 0644 -> 0600",
		"removed state/.wake-queue.lock", "removed state/procevent/web.runner", "counter mail: next sequence 4"} {
		if !strings.Contains(out, want) {
			t.Errorf("the import's lines lack %q:\n%s", want, out)
		}
	}
	var js Report
	if err := json.Unmarshal([]byte(f.fm(0, "home", "import", "--json")), &js); err != nil || js.Sources+js.Results+js.Transfers != 0 || js.Backup != "" {
		t.Fatalf("a second import is not a no-op: %+v %v", js, err)
	}
	after := f.snapshot()

	// Every replaced or removed file is kept exactly as it was.
	runs, _ := filepath.Glob(filepath.Join(f.h.Dir, "data", "imported", "2*"))
	if len(runs) != 1 || exists(filepath.Join(f.h.Dir, "data", "imported", journalName)) {
		t.Fatalf("runs %v, or the journal is left", runs)
	}
	for rel, v := range before {
		if !strings.HasPrefix(rel, "home/") {
			continue
		}
		if now, ok := after[rel]; ok && (now == v || strings.HasPrefix(rel, "home/state/procevent/web.source")) {
			continue
		}
		kept := "home/data/imported/<run>/" + strings.TrimPrefix(rel, "home/")
		if after[kept] != v && !strings.HasSuffix(rel, "/") && !isModeOnly(before[rel], after[rel]) {
			t.Errorf("%s changed and is not kept at %s:\n  was  %q\n  kept %q", rel, kept, v, after[kept])
		}
	}

	// The wake queue: same bytes, 0600, mark kept; nothing announced.
	q, err := os.ReadFile(f.h.WakeQueue())
	f.must(err)
	if string(q) != string(f.queue) || mode(t, f.h.WakeQueue()) != 0o600 {
		t.Fatalf("wake queue changed: %q (mode %o)", q, mode(t, f.h.WakeQueue()))
	}
	if m, _ := os.ReadFile(filepath.Join(f.h.State, ".wake-queue.seq")); string(m) != "7\n" {
		t.Fatalf("high-water mark %q, want 7", m)
	}
	f.fm(0, "wake", "list")

	// Results: bytes, handled state, owners.
	got := map[string]bool{}
	for _, r := range mustInbox(f) {
		n := filepath.Base(r.Path)
		got[n] = r.Handled
		data, err := os.ReadFile(r.Path)
		f.must(err)
		if string(data) != string(f.results[n]) {
			t.Errorf("%s: bytes changed", n)
		}
		if r.SourceID == "mail" && (r.Kind != procevent.KindExtension || r.BindingDigest != f.fake.Digest || r.CapturedAt != 1700000000) {
			t.Errorf("%s: owner %+v", n, r.Meta)
		}
	}
	if len(got) != 4 || !got["web.1.result"] || got["web.2.result"] || !got["mail.1.result"] || got["mail.3.result"] {
		t.Fatalf("handled state: %v", got)
	}
	for _, n := range []string{"web.2.result", "mail.3.result"} {
		if c := f.fm(0, "procevent", "classify", filepath.Join(f.h.Inbox(), n)); strings.TrimSpace(c) == "" {
			t.Errorf("classify %s printed nothing", n)
		}
	}
	var sources struct{ Sources []map[string]any }
	f.must(json.Unmarshal([]byte(f.fm(0, "procevent", "list", "--json")), &sources))
	if len(sources.Sources) != 3 {
		t.Fatalf("sources: %v", sources)
	}
	reg, err := os.ReadFile(filepath.Join(f.h.Registrations(), "mail.source"))
	f.must(err)
	if !strings.Contains(string(reg), `"owner_token":"`+f.mailToken+`"`) || !strings.Contains(string(reg), `"config_ref":"inbox-1"`) {
		t.Fatalf("mail's registration lost its token or config_ref: %s", reg)
	}

	// serve polls the imported sources: mail's next capture is sequence 4,
	// above every imported one (the earlier rule would have reused 2).
	serve := exec.Command(fmBin, "procevent", "serve", "--min-gap", "100ms", "--rescan", "100ms")
	serve.Env = f.env
	f.must(serve.Start())
	next := filepath.Join(f.h.Inbox(), "mail.4.result")
	for deadline := time.Now().Add(60 * time.Second); !exists(next); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			serve.Process.Kill()
			serve.Wait()
			t.Fatal("serve captured nothing for mail within 60 s")
		}
	}
	serve.Process.Signal(syscall.SIGTERM)
	if err := serve.Wait(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if exists(filepath.Join(f.h.Inbox(), "mail.2.result")) {
		t.Fatal("serve reused sequence 2 of mail")
	}
	// The wakes serve appended continue above the earlier implementation's
	// last queue-seq (7, the mark), not above the queue's last line (5): a
	// reader resuming after 7 misses none of them.
	q, err = os.ReadFile(f.h.WakeQueue())
	f.must(err)
	added, ok := strings.CutPrefix(string(q), string(f.queue))
	if !ok || added == "" {
		t.Fatalf("serve did not append to the kept queue: %q", q)
	}
	for _, l := range strings.Split(strings.TrimSuffix(added, "\n"), "\n") {
		if w, ok := wake.Parse(l); !ok || w.Seq <= 7 {
			t.Fatalf("fm appended %q after the import: its queue-seq must be above the mark 7", l)
		}
	}

	// Handling, retirement by the kept token, retire-binding, retire-transfer.
	f.fm(0, "procevent", "handled", "web", "2")
	f.fm(0, "procevent", "handled", "mail", "3")
	f.fm(0, "procevent", "handled", "mail", "4")
	f.fm(0, "procevent", "retire", "mail", "--if-owner", f.mailToken)
	f.fm(0, "procevent", "retire", "old", "--if-owner", f.oldToken)
	f.fm(0, "procevent", "retire", "web", "--if-matches", "web", "--", "/bin/true", "second arg with spaces")
	for _, r := range mustInbox(f) {
		if !r.Handled {
			f.fm(0, "procevent", "handled", r.SourceID, strconv.FormatInt(r.Sequence, 10))
		}
	}
	f.fm(0, "extension", "retire-transfer", xferID, "--if-transfer-digest", f.transferDigest, "--if-binding-digest", f.xfer.Digest)
	f.fm(0, "extension", "retire-binding", fakeID, "--if-binding-digest", f.fake.Digest)
	if d := f.fm(0, "doctor"); strings.Contains(d, "import") {
		t.Fatalf("doctor after the import:\n%s", d)
	}
}

func mustInbox(f *fixture) []procevent.Result {
	var inbox struct{ Results []procevent.Result }
	f.must(json.Unmarshal([]byte(f.fm(0, "procevent", "inbox", "--json")), &inbox))
	return inbox.Results
}

// isModeOnly reports whether two snapshot values differ only in their mode.
func isModeOnly(a, b string) bool {
	_, ra, _ := strings.Cut(a, " ")
	_, rb, _ := strings.Cut(b, " ")
	return a != "" && b != "" && ra == rb
}

func mode(t *testing.T, p string) uint32 {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & 0o7777
}

// [HOME-4] A state root outside the home (FM_STATE_OVERRIDE) is imported the
// same way; its replaced files are kept under state/ in the run directory.
func TestImportStateOutsideHome(t *testing.T) {
	f := newFixture(t, true)
	f.fm(0, "home", "import")
	runs, _ := filepath.Glob(filepath.Join(f.h.Dir, "data", "imported", "2*"))
	if len(runs) != 1 {
		t.Fatalf("runs %v", runs)
	}
	kept, err := os.ReadFile(filepath.Join(runs[0], "state", "procevent", "mail.source"))
	if err != nil || string(kept) != string(f.legacySource["mail"]) {
		t.Fatalf("mail.source is not kept as it was: %q %v", kept, err)
	}
	if len(mustInbox(f)) != 4 {
		t.Fatal("results lost")
	}
}
