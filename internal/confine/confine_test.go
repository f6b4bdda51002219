package confine

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"firstmate.dev/fm/internal/errcode"
)

// [CONF-2] [CONF-3]: what each mode makes of a kernel's ABI: strict refuses
// whatever the binding's ruleset needs and the kernel lacks, enforce names
// it, off needs nothing.
func TestCheckByModeAndABI(t *testing.T) {
	cases := []struct {
		mode    Mode
		abi     int
		network bool
		lacked  []string
		refused bool
	}{
		{Off, 0, false, nil, false},
		{Enforce, 0, false, []string{"landlock"}, false},
		{Strict, 0, false, []string{"landlock"}, true},
		{Enforce, 3, false, []string{"tcp", "scoped signals and abstract sockets"}, false},
		{Enforce, 3, true, []string{"scoped signals and abstract sockets"}, false},
		{Strict, 5, true, []string{"scoped signals and abstract sockets"}, true},
		{Strict, 6, false, nil, false},
		{Enforce, 2, true, []string{"truncate", "scoped signals and abstract sockets"}, false},
	}
	for _, c := range cases {
		l, err := Check(c.mode, c.abi, Grant{Network: c.network})
		if !slices.Equal(l, c.lacked) || (err != nil) != c.refused {
			t.Errorf("%s ABI %d network %v: lacked %q, err %v; want %q, refused %v", c.mode, c.abi, c.network, l, err, c.lacked, c.refused)
		}
		if err != nil && errcode.Of(err) != errcode.ConfinementUnavailable {
			t.Errorf("%s ABI %d: %v, want confinement-unavailable", c.mode, c.abi, err)
		}
	}
}

// [CONF-1] [CONF-3]: on this kernel a ruleset for an older ABI is built with
// that ABI's rights only, and what it cannot enforce is named, not dropped.
func TestBuildForAnOlderABI(t *testing.T) {
	if Probe() < 6 {
		t.Skip("this kernel has no Landlock ABI 6")
	}
	f, p, err := Build(Enforce, 3, Grant{PackageRoot: t.TempDir(), State: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if slices.Contains(p.Rules, "no tcp") || !slices.Equal(p.Lacked, []string{"tcp", "scoped signals and abstract sockets"}) {
		t.Fatalf("ABI 3 plan %+v", p)
	}
	f, p, err = Build(Enforce, Probe(), Grant{State: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !slices.Contains(p.Rules, "no tcp") || !slices.Contains(p.Rules, "scoped signals and abstract sockets") || len(p.Lacked) != 0 {
		t.Fatalf("full plan %+v", p)
	}
}

// [CONF-2]: the setting file: absent is enforce; WriteMode writes exactly a
// mode and a newline; anything else is schema-invalid.
func TestModeFile(t *testing.T) {
	config := filepath.Join(t.TempDir(), "config")
	if m, set, err := ReadMode(config); m != Enforce || set || err != nil {
		t.Fatalf("absent: %q %v %v", m, set, err)
	}
	if err := WriteMode(config, Strict); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(config, FileName)); string(b) != "strict\n" {
		t.Fatalf("file holds %q", b)
	}
	if m, set, err := ReadMode(config); m != Strict || !set || err != nil {
		t.Fatalf("strict: %q %v %v", m, set, err)
	}
	for _, bad := range []string{"", "strict", "Strict\n", "strict\n\n", "strict \n"} {
		os.WriteFile(filepath.Join(config, FileName), []byte(bad), 0o600)
		if _, _, err := ReadMode(config); errcode.Of(err) != errcode.SchemaInvalid {
			t.Errorf("%q: %v, want schema-invalid", bad, err)
		}
	}
	if err := WriteMode(config, "sometimes"); errcode.Of(err) != errcode.Usage {
		t.Errorf("bad mode written: %v", err)
	}
}

// BenchmarkBuild is the host's side of confinement per call: the ruleset of
// a package with no consent (bench/run.sh prints confine-build-us from
// fmbench, this is the in-process piece).
func BenchmarkBuild(b *testing.B) {
	if Probe() < 1 {
		b.Skip("this kernel has no Landlock")
	}
	g := Grant{PackageRoot: b.TempDir(), State: b.TempDir(), Temp: b.TempDir()}
	for b.Loop() {
		f, _, err := Build(Enforce, Probe(), g)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}
