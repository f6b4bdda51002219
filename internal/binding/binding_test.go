package binding

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
)

func testHome(t *testing.T) *home.Home {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &home.Home{Root: dir, Dir: dir, State: filepath.Join(dir, "state")}
}

func record(h *home.Home, id string, adapters ...string) *Record {
	digest := "sha256:" + strings.Repeat("a", 64)
	return &Record{
		Schema: Schema, ExtensionID: id, ExtensionVersion: "1.0.0",
		Source:         Source{Kind: SourceKind, Path: "/opt/pkgs/" + id},
		PackageRoot:    h.PackageRoot(id, "1.0.0", strings.Repeat("a", 64)),
		ManifestSHA256: digest, PackageDigest: digest, Entrypoint: "bin/x", EntrypointSHA256: digest,
		HostProtocol: 1,
		Capabilities: []Capability{{Name: "process-event-adapter", Version: 1, AdapterNames: adapters}},
		Consents:     Consents{TrustedSameUserCode: true, ArtifactReferences: true},
		TimeoutMS:    DefaultTimeoutMS,
	}
}

func publish(t *testing.T, h *home.Home, id string, adapters ...string) *Binding {
	t.Helper()
	b, err := Publish(h, record(h, id, adapters...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// [BND-2] pretty canonical bytes; the digest is of the exact file.
func TestPublishFormat(t *testing.T) {
	h := testHome(t)
	b := publish(t, h, "org.example.a", "a")
	data, err := os.ReadFile(b.Path)
	if err != nil {
		t.Fatal(err)
	}
	if Digest(data) != b.Digest {
		t.Fatal("digest is not of the file bytes")
	}
	s := string(data)
	if !strings.HasPrefix(s, "{\n  \"capabilities\": [\n") || !strings.HasSuffix(s, "\n}\n") || strings.HasSuffix(s, "\n\n") {
		t.Fatalf("not pretty sorted json:\n%s", s)
	}
	if strings.Index(s, `"consents"`) > strings.Index(s, `"entrypoint"`) || strings.Index(s, `"artifact_references"`) > strings.Index(s, `"credential_store"`) {
		t.Fatalf("keys not sorted:\n%s", s)
	}
	for p, want := range map[string]os.FileMode{b.Path: 0o600, h.Bindings(): 0o700 | os.ModeDir} {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode() != want {
			t.Fatalf("%s mode %v want %v", p, fi.Mode(), want)
		}
	}
	bs, err := Load(h)
	if err != nil || len(bs) != 1 || bs[0].Digest != b.Digest {
		t.Fatalf("load: %v %v", bs, err)
	}
}

// [BIND-4],[BIND-6] publication never replaces an existing binding.
func TestPublishNoReplace(t *testing.T) {
	h := testHome(t)
	b := publish(t, h, "org.example.a", "a")
	before, _ := os.ReadFile(b.Path)
	_, err := Publish(h, record(h, "org.example.a", "zzz"))
	if errcode.Of(err) != errcode.BindingExists {
		t.Fatalf("got %v", err)
	}
	after, _ := os.ReadFile(b.Path)
	if string(before) != string(after) {
		t.Fatal("existing binding was replaced")
	}
	entries, _ := os.ReadDir(filepath.Dir(h.Bindings()))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp") {
			t.Fatalf("temp file left behind: %s", e.Name())
		}
	}
}

// [HOME-5] an absent registry is inert and Load creates nothing.
func TestLoadAbsent(t *testing.T) {
	h := testHome(t)
	bs, err := Load(h)
	if err != nil || bs != nil {
		t.Fatalf("%v %v", bs, err)
	}
	if entries, _ := os.ReadDir(h.Dir); len(entries) != 0 {
		t.Fatalf("Load created %v", entries)
	}
}

// [BND-4] one bad record refuses every reader; no reader selects around it.
// [BND-3] a package_root outside the home store and [BND-5] an unknown
// host protocol or capability version are among the bad records.
func TestRegistryRefusals(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, h *home.Home, b *Binding)
		code  errcode.Code
	}{
		{"file mode 0644", func(t *testing.T, h *home.Home, b *Binding) { os.Chmod(b.Path, 0o644) }, errcode.ModeUnsafe},
		{"file mode 0400", func(t *testing.T, h *home.Home, b *Binding) { os.Chmod(b.Path, 0o400) }, errcode.ModeUnsafe},
		{"hard-linked elsewhere", func(t *testing.T, h *home.Home, b *Binding) {
			if err := os.Link(b.Path, filepath.Join(h.Dir, "copy.json")); err != nil {
				t.Fatal(err)
			}
		}, errcode.LinkUnsafe},
		{"symlinked record", func(t *testing.T, h *home.Home, b *Binding) {
			data, _ := os.ReadFile(b.Path)
			other := filepath.Join(h.Dir, "elsewhere.json")
			os.WriteFile(other, data, 0o600)
			os.Remove(b.Path)
			os.Symlink(other, b.Path)
		}, errcode.LinkUnsafe},
		{"directory mode 0755", func(t *testing.T, h *home.Home, b *Binding) { os.Chmod(h.Bindings(), 0o755) }, errcode.ModeUnsafe},
		{"directory is a symlink", func(t *testing.T, h *home.Home, b *Binding) {
			real := filepath.Join(h.Dir, "real-registry")
			os.Rename(h.Bindings(), real)
			os.Symlink(real, h.Bindings())
		}, errcode.LinkUnsafe},
		{"dot file", func(t *testing.T, h *home.Home, b *Binding) {
			os.WriteFile(filepath.Join(h.Bindings(), ".hidden.json"), []byte("{}"), 0o600)
		}, errcode.RegistryInvalid},
		{"stray name", func(t *testing.T, h *home.Home, b *Binding) {
			os.WriteFile(filepath.Join(h.Bindings(), "notes.txt"), []byte("x"), 0o600)
		}, errcode.RegistryInvalid},
		{"name does not match id", func(t *testing.T, h *home.Home, b *Binding) {
			os.Rename(b.Path, filepath.Join(h.Bindings(), "org.example.other.json"))
		}, errcode.RegistryInvalid},
		{"malformed record", func(t *testing.T, h *home.Home, b *Binding) {
			os.WriteFile(filepath.Join(h.Bindings(), "org.example.broken.json"), []byte("{broken"), 0o600)
		}, errcode.JSONInvalid},
		{"unknown field", func(t *testing.T, h *home.Home, b *Binding) {
			data, _ := os.ReadFile(b.Path)
			os.WriteFile(b.Path, []byte(strings.Replace(string(data), "{\n", "{\n  \"force\": true,\n", 1)), 0o600)
		}, errcode.SchemaInvalid},
		{"package_root elsewhere", func(t *testing.T, h *home.Home, b *Binding) {
			data, _ := os.ReadFile(b.Path)
			os.WriteFile(b.Path, []byte(strings.Replace(string(data), h.Dir+"/data", "/tmp/data", 1)), 0o600)
		}, errcode.SchemaInvalid},
		{"unknown host protocol", func(t *testing.T, h *home.Home, b *Binding) {
			data, _ := os.ReadFile(b.Path)
			os.WriteFile(b.Path, []byte(strings.Replace(string(data), `"host_protocol": 1`, `"host_protocol": 2`, 1)), 0o600)
		}, errcode.ProtocolIncompatible},
		{"unknown capability version", func(t *testing.T, h *home.Home, b *Binding) {
			data, _ := os.ReadFile(b.Path)
			os.WriteFile(b.Path, []byte(strings.Replace(string(data), `"version": 1`, `"version": 2`, 1)), 0o600)
		}, errcode.ProtocolIncompatible},
		{"trust false", func(t *testing.T, h *home.Home, b *Binding) {
			data, _ := os.ReadFile(b.Path)
			os.WriteFile(b.Path, []byte(strings.Replace(string(data), `"trusted_same_user_code": true`, `"trusted_same_user_code": false`, 1)), 0o600)
		}, errcode.SchemaInvalid},
		{"duplicate adapter across records", func(t *testing.T, h *home.Home, b *Binding) {
			publish(t, h, "org.example.b", "b", "a")
		}, errcode.AdapterConflict},
		{"129 files", func(t *testing.T, h *home.Home, b *Binding) {
			for i := 0; i < MaxRecords; i++ {
				os.WriteFile(filepath.Join(h.Bindings(), fmt.Sprintf("org.example.n%d.json", i)), []byte("{broken"), 0o600)
			}
		}, errcode.RegistryOversized},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := testHome(t)
			good := publish(t, h, "org.example.a", "a")
			publish(t, h, "org.example.z", "z")
			c.setup(t, h, good)
			bs, err := Load(h)
			if errcode.Of(err) != c.code || bs != nil {
				t.Fatalf("got %v (%d bindings), want %s", err, len(bs), c.code)
			}
		})
	}
}

// [BND-4] exactly 128 records are accepted.
func TestRegistryAtBound(t *testing.T) {
	h := testHome(t)
	for i := 0; i < MaxRecords; i++ {
		publish(t, h, fmt.Sprintf("org.example.n%d", i), fmt.Sprintf("a%d", i))
	}
	bs, err := Load(h)
	if err != nil || len(bs) != MaxRecords {
		t.Fatalf("%d %v", len(bs), err)
	}
}

// [BND-4] [OP-3] [RUN-3] A record retired between the registry's listing
// and its read is not there, never a malformed registry: Load lists again
// and returns what is there; a record replaced meanwhile is read as its new
// content; a name that vanishes at every listing is, at the bound, not
// there. The retirement is injected between the listing and the reads.
func TestLoadVanished(t *testing.T) {
	h := testHome(t)
	a := publish(t, h, "org.example.a", "a")
	z := publish(t, h, "org.example.z", "z")
	t.Cleanup(func() { afterList = nil })

	lists := 0
	afterList = func([]string) {
		if lists++; lists == 1 {
			if err := os.Rename(z.Path, filepath.Join(h.Dir, "retired.json")); err != nil {
				t.Fatal(err)
			}
		}
	}
	bs, err := Load(h)
	if err != nil || len(bs) != 1 || bs[0].Digest != a.Digest || lists != 2 {
		t.Fatalf("retired after the listing: %v, %v after %d listings; want only %s after 2", bs, err, lists, a.ExtensionID)
	}

	// Replaced by a rename over its name: the new record is read.
	lists = 0
	newer := record(h, "org.example.a", "a", "b")
	afterList = func([]string) {
		if lists++; lists == 1 {
			data, _ := newer.Encode()
			tmp := filepath.Join(h.Dir, "new.json")
			if err := os.WriteFile(tmp, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, a.Path); err != nil {
				t.Fatal(err)
			}
		}
	}
	bs, err = Load(h)
	if err != nil || len(bs) != 1 || len(bs[0].Adapters()) != 2 {
		t.Fatalf("replaced after the listing: %v, %v; want the new record", bs, err)
	}

	// At every listing a binding is retired before its read and another
	// bound: the relisting is bounded, and at the bound a vanished name is
	// not there.
	lists = 0
	publish(t, h, "org.example.z0", "z")
	afterList = func(names []string) {
		lists++
		for _, n := range names {
			if n != "org.example.a.json" {
				os.Remove(filepath.Join(h.Bindings(), n))
			}
		}
		publish(t, h, fmt.Sprintf("org.example.z%d", lists), fmt.Sprintf("z%c", 'a'+lists))
	}
	bs, err = Load(h)
	if err != nil || len(bs) != 1 || lists != relistBound {
		t.Fatalf("vanishing at every listing: %v, %v after %d listings; want only org.example.a after %d", bs, err, lists, relistBound)
	}

	// A real refusal stays one: a second link is link-unsafe.
	afterList = nil
	if err := os.Link(bs[0].Path, filepath.Join(h.Dir, "second")); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(h); errcode.Of(err) != errcode.LinkUnsafe {
		t.Fatalf("a record with two links: %v, want link-unsafe", err)
	}
}

// [BND-4] Three bindings enabling one adapter (x) refuse every reader, and
// the operator can still undo the conflict with fm: the retirement of any one
// of the three reads the registry, though the other two still conflict on x.
// A conflict on an adapter the retiring binding does not enable (y) still
// refuses it, and so does a malformed record beside the conflict.
func TestLoadForRetireThreeWayConflict(t *testing.T) {
	h := testHome(t)
	for _, id := range []string{"org.example.a", "org.example.b", "org.example.c"} {
		publish(t, h, id, "x")
	}
	if _, err := Load(h); errcode.Of(err) != errcode.AdapterConflict {
		t.Fatalf("Load: %v, want adapter-conflict", err)
	}
	for _, id := range []string{"org.example.a", "org.example.b", "org.example.c"} {
		if bs, err := LoadForRetire(h, id); err != nil || len(bs) != 3 {
			t.Fatalf("LoadForRetire(%s) of one of three conflicting bindings: %v (%d bindings)", id, err, len(bs))
		}
	}
	publish(t, h, "org.example.d", "y")
	publish(t, h, "org.example.e", "y")
	if _, err := LoadForRetire(h, "org.example.a"); errcode.Of(err) != errcode.AdapterConflict || !strings.Contains(err.Error(), `adapter "y"`) {
		t.Fatalf("a conflict on an adapter a does not enable must still refuse: %v", err)
	}
	if _, err := LoadForRetire(h, "org.example.d"); errcode.Of(err) != errcode.AdapterConflict || !strings.Contains(err.Error(), `adapter "x"`) {
		t.Fatalf("a conflict on an adapter d does not enable must still refuse: %v", err)
	}
	os.Remove(filepath.Join(h.Bindings(), "org.example.e.json"))
	os.WriteFile(filepath.Join(h.Bindings(), "org.example.f.json"), []byte("{broken"), 0o600)
	if _, err := LoadForRetire(h, "org.example.a"); errcode.Of(err) != errcode.JSONInvalid {
		t.Fatalf("a malformed record beside the conflict must still refuse: %v", err)
	}
}
