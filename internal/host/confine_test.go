package host_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// confineWorld is one home with one bound probe package (testdata/
// confine-entrypoint.sh and its probes) and what the probes try: a secret
// in a fake HOME, a TCP listener and a process outside the package.
type confineWorld struct {
	h       *home.Home
	dir     string
	secret  string
	port    int
	consent []string
}

// newConfineWorld binds the probe package with consents in a fresh home;
// goProbe is the built Go probe, copied into the package's lib/.
func newConfineWorld(t *testing.T, goProbe string, consents ...string) *confineWorld {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	t.Cleanup(func() { testpkg.Unlock(dir) })
	hd := filepath.Join(dir, "home")
	os.Mkdir(hd, 0o700)
	w := &confineWorld{h: &home.Home{Root: dir, Dir: hd, State: filepath.Join(hd, "state")}, dir: dir, consent: consents}
	userHome := filepath.Join(dir, "userhome")
	w.secret = filepath.Join(userHome, ".ssh", "id_ed25519")
	testpkg.WriteFile(t, w.secret, "secret key", 0o700, 0o600)
	t.Setenv("HOME", userHome)
	pkg := filepath.Join(dir, "pkg")
	req, _ := json.Marshal(consents)
	if consents == nil {
		req = []byte("[]")
	}
	testpkg.WriteFile(t, filepath.Join(pkg, "firstmate-extension.json"), `{"schema":"firstmate.extension-manifest.v1","id":"org.example.confined","version":"1.0.0","host_protocols":[1],"entrypoint":"bin/ep","capabilities":[{"name":"process-event-adapter","versions":[1],"adapter_names":["a"]}],"required_consents":`+string(req)+`}`, 0o755, 0o644)
	for name, data := range map[string]string{"bin/ep": "confine-entrypoint.sh", "lib/probe.sh": "probe.sh", "lib/probe.py": "probe.py", "lib/probe.js": "probe.js"} {
		b, err := os.ReadFile(filepath.Join("testdata", data))
		if err != nil {
			t.Fatal(err)
		}
		testpkg.WriteFile(t, filepath.Join(pkg, name), string(b), 0o755, 0o755)
	}
	b, err := os.ReadFile(goProbe)
	if err != nil {
		t.Fatal(err)
	}
	testpkg.WriteFile(t, filepath.Join(pkg, "lib", "confineprobe"), string(b), 0o755, 0o755)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	w.port = ln.Addr().(*net.TCPAddr).Port
	if _, err := host.Bind(context.Background(), w.h, host.BindOptions{Dir: pkg, Adapters: []string{"a"}, Trust: true, Consents: consents, TimeoutMS: 60000}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	return w
}

// probe runs the probe of lang in one poll and returns name -> result.
func (w *confineWorld) probe(t *testing.T, lang, target string, mode confine.Mode) (map[string]string, error) {
	t.Helper()
	b, err := host.Resolve(w.h, "a")
	if err != nil {
		t.Fatal(err)
	}
	ref := strings.Join([]string{lang, w.secret, strconv.Itoa(w.port), strconv.Itoa(os.Getpid()), target}, " ")
	res, err := host.Invoke(context.Background(), w.h, b, host.Poll, wire.PollInput{SourceID: "s", ConfigRef: ref}, host.Call{Adapter: "a", Confinement: mode})
	if err != nil {
		return nil, err
	}
	got := map[string]string{}
	for _, f := range strings.Fields(res.Output) {
		k, v, _ := strings.Cut(f, "=")
		got[k] = v
	}
	return got, nil
}

// buildGoProbe builds testdata/confineprobe once for a test.
func buildGoProbe(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "confineprobe")
	if b, err := exec.Command("go", "build", "-o", out, "./testdata/confineprobe").CombinedOutput(); err != nil {
		t.Fatalf("go build confineprobe: %v\n%s", err, b)
	}
	os.Chmod(filepath.Dir(out), 0o755)
	return out
}

// languages are the probes' languages with what a refusal looks like in
// each, and whether the machine has the language (at fm's fixed PATH).
func languages(t *testing.T) []string {
	langs := []string{"sh", "python", "go"}
	if _, err := os.Stat("/usr/bin/node"); err == nil {
		langs = append(langs, "node")
	} else if _, err := os.Stat("/usr/local/bin/node"); err == nil {
		langs = append(langs, "node")
	} else {
		t.Log("node is not at /usr/bin or /usr/local/bin: the node probe is skipped")
	}
	return langs
}

// [CONF-1] [INV-3] For each consent fact, what the binding grants works inside the
// package and what it does not is refused by the kernel (EACCES for files
// and TCP, EPERM for a signal out of the package's domain), in sh, Python,
// node and Go; temporary files, /dev/null and /dev/shm work everywhere.
func TestConfinementFollowsConsents(t *testing.T) {
	if confine.Probe() < 6 {
		t.Skipf("this kernel has Landlock ABI %d; the full ruleset needs 6", confine.Probe())
	}
	goProbe := buildGoProbe(t)
	denied := func(lang, errno string) string {
		if lang == "sh" {
			return "denied"
		}
		return errno
	}
	cases := []struct {
		name     string
		consents []string
		secret   bool // readable
		tcp      bool // connectable
		write    bool // a file outside the package's places is writable
	}{
		{"no consent", nil, false, false, false},
		{"network and credential-store", []string{"network", "credential-store"}, true, true, false},
		{"artifact-references", []string{"artifact-references"}, true, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newConfineWorld(t, goProbe, c.consents...)
			// A directory anyone may write to: only the kernel's
			// confinement refuses it, for root and uid 65534 alike.
			outside := filepath.Join(w.dir, "outside")
			os.Mkdir(outside, 0o777)
			os.Chmod(outside, 0o777)
			for _, lang := range languages(t) {
				got, err := w.probe(t, lang, filepath.Join(outside, lang), "")
				if err != nil {
					t.Fatalf("%s: %v", lang, err)
				}
				want := map[string]string{
					"write": denied(lang, "EACCES"), "state": "ok", "tmp": "ok", "devnull": "ok",
					"kill": denied(lang, "EPERM"), "etc": "ok",
					"secret": denied(lang, "EACCES"), "tcp": "EACCES",
				}
				if c.secret {
					want["secret"] = "ok"
				}
				if c.tcp {
					want["tcp"] = "ok"
				}
				if c.write {
					want["write"] = "ok"
				}
				if lang == "sh" {
					delete(want, "tcp") // sh has no TCP client
				}
				if lang == "python" {
					want["shm"] = "ok"
				}
				t.Logf("%s %s: %v", c.name, lang, got)
				for k, v := range want {
					if got[k] != v {
						t.Errorf("%s %s: %s=%q, want %q (all: %v)", c.name, lang, k, got[k], v, got)
					}
				}
			}
		})
	}
}

// [CONF-2] [CONF-5] An explicit --confinement off runs the package with
// the user's full rights: what confinement refused works.
func TestConfinementOffIsTheUsersRights(t *testing.T) {
	w := newConfineWorld(t, buildGoProbe(t))
	outside := filepath.Join(w.dir, "outside")
	os.Mkdir(outside, 0o777)
	os.Chmod(outside, 0o777)
	got, err := w.probe(t, "go", filepath.Join(outside, "written"), confine.Off)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"secret", "write", "tcp"} {
		if got[k] != "ok" {
			t.Errorf("%s=%q with confinement off, want ok (all: %v)", k, got[k], got)
		}
	}
}

// [CONF-5] A confined package that fails says, on the error line, that it
// ran confined and how to check.
func TestConfinedFailureSaysSo(t *testing.T) {
	if confine.Probe() < 1 {
		t.Skip("this kernel has no Landlock")
	}
	w := newConfineWorld(t, buildGoProbe(t))
	_, err := w.probe(t, "fail", "x", "")
	if errcode.Of(err) != errcode.ProcessFailed {
		t.Fatalf("a package exiting 3: %v, want process-failed", err)
	}
	for _, want := range []string{"confined by Landlock ABI", "--confinement off"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error line %q does not say %q", err, want)
		}
	}
}
