package docs

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// The tests of protocol.md bind packages through the real host, whose launch
// barrier re-executes this test binary.
func TestMain(m *testing.M) {
	launch.MaybeBarrier()
	os.Exit(m.Run())
}

// section returns the text of protocol.md from the heading that starts
// with prefix to the next heading of the same level.
func section(t *testing.T, doc, prefix string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+prefix)
	if i < 0 {
		t.Fatalf("protocol.md has no heading %q", prefix)
	}
	rest := doc[i+1:]
	if j := strings.Index(rest[len(prefix):], "\n## "); j >= 0 {
		rest = rest[:len(prefix)+j]
	}
	return rest
}

// block returns the first fenced code block of lang in text.
func block(t *testing.T, text, lang string) string {
	t.Helper()
	m := regexp.MustCompile("(?s)```" + lang + "\n(.*?)```").FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no %s block in %.60q", lang, text)
	}
	return m[1]
}

// tableKeys returns the keys named in the first column of the table that
// follows the line containing marker: every `backticked` word of that column.
func tableKeys(t *testing.T, text, marker string) []string {
	t.Helper()
	i := strings.Index(text, marker)
	if i < 0 {
		t.Fatalf("no %q", marker)
	}
	var keys []string
	started := false
	for _, line := range strings.Split(text[i:], "\n")[1:] {
		if !strings.HasPrefix(line, "|") {
			if started {
				break
			}
			continue
		}
		started = true
		cell := strings.Split(line, "|")[1]
		for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(cell, -1) {
			keys = append(keys, m[1])
		}
	}
	slices.Sort(keys)
	return keys
}

// jsonKeys returns the JSON names of a struct type's fields.
func jsonKeys(v any) []string {
	var keys []string
	rt := reflect.TypeOf(v)
	for i := range rt.NumField() {
		name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		keys = append(keys, name)
	}
	slices.Sort(keys)
	return keys
}

// [PROTO-1] [PROTO-2] [PROTO-3] [PROTO-4] The key tables of protocol.md §4
// and §5 name exactly the keys of the envelopes the host writes and reads.
func TestProtocolDocEnvelopeKeys(t *testing.T) {
	data, err := os.ReadFile("protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	hs, inv := section(t, doc, "## 4. Handshake"), section(t, doc, "## 5. Invoke")
	for _, c := range []struct {
		text, marker string
		envelope     any
	}{
		{hs, "The request (`[PROTO-1]`)", wire.HandshakeRequest{}},
		{hs, "The response (`[PROTO-2]`)", wire.HandshakeResponse{}},
		{inv, "request (`[PROTO-3]`)", wire.Request{}},
		{inv, "The response (`[PROTO-4]`)", wire.Response{}},
	} {
		if got, want := tableKeys(t, c.text, c.marker), jsonKeys(c.envelope); !slices.Equal(got, want) {
			t.Errorf("protocol.md %q lists %v; the host's %T has %v", c.marker, got, c.envelope, want)
		}
	}
}

// [EX-2] [PROTO-2] [INV-2] [INV-3] The POSIX sh adapter of protocol.md §12,
// with the manifest of §1 as §12 says, binds through the real host (a live
// handshake) and answers an invoke; and the hand-run handshake and invoke
// requests of §14, run as §14 says (from the installed copy, in exactly the
// host's environment, which §14 spells out), get answers the host accepts.
func TestProtocolDocExamplesRun(t *testing.T) {
	data, err := os.ReadFile("protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testpkg.Unlock(base) })

	var manifest map[string]any
	if err := json.Unmarshal([]byte(block(t, section(t, doc, "## 1. The package"), "json")), &manifest); err != nil {
		t.Fatal(err)
	}
	manifest["id"], manifest["version"], manifest["required_consents"] = "org.example.tick", "1.0.0", []string{}
	manifest["capabilities"].([]any)[0].(map[string]any)["adapter_names"] = []string{"tick"}
	mdata, err := json.Marshal(manifest)
	if err != nil {
		t.Fatal(err)
	}
	pkg := filepath.Join(base, "tick")
	entry := filepath.Join(pkg, "bin", "firstmate-extension")
	write := func(p string, data []byte, mode os.FileMode) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{p, filepath.Dir(p), pkg} {
			fi, _ := os.Stat(q)
			os.Chmod(q, fi.Mode().Perm()&^0o022)
		}
	}
	write(filepath.Join(pkg, "firstmate-extension.json"), mdata, 0o644)
	write(entry, []byte(block(t, section(t, doc, "## 12. "), "sh")), 0o755)

	hd := filepath.Join(base, "home")
	if err := os.Mkdir(hd, 0o700); err != nil {
		t.Fatal(err)
	}
	h := &home.Home{Root: base, Dir: hd, State: filepath.Join(hd, "state")}
	ctx := context.Background()
	b, err := host.Bind(ctx, h, host.BindOptions{Dir: pkg, Adapters: []string{"tick"}, Trust: true, TimeoutMS: 30000})
	if err != nil {
		t.Fatalf("binding the sh adapter of protocol.md §12: %v", err)
	}
	res, err := host.Invoke(ctx, h, b, host.Classify,
		wire.ResultInput{SourceID: "s1", Sequence: 1, Content: "tick 2026-01-01T00:00:00Z"}, host.Call{Adapter: "tick"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Classification != "tick" {
		t.Fatalf("classify answered %#v", res)
	}

	// §14 by hand: both requests, run from the installed copy with exactly
	// the environment the host gives, as the page says.
	s14 := section(t, doc, "## 14. ")
	if !strings.Contains(s14, "env -i PATH="+host.SystemPath+" LANG=C LC_ALL=C") {
		t.Errorf("protocol.md §14 does not give the host's PATH %s", host.SystemPath)
	}
	reqs := regexp.MustCompile(`printf '%s' '(\{.*\})' \|`).FindAllStringSubmatch(s14, -1)
	if len(reqs) != 2 {
		t.Fatalf("protocol.md §14 has %d hand-run requests, want a handshake and an invoke", len(reqs))
	}
	env, err := host.Environment(h, &b.Record)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range env {
		name, _, _ := strings.Cut(v, "=")
		if !strings.Contains(s14, name+"=") {
			t.Errorf("protocol.md §14 does not set %s", name)
		}
	}
	run := func(verb, stdin string) []byte {
		t.Helper()
		cmd := exec.Command("./"+b.Record.Entrypoint, verb)
		cmd.Dir = b.Record.PackageRoot
		cmd.Env = env
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("the §14 %s from the installed copy: %v", verb, err)
		}
		return out
	}
	var hreq wire.HandshakeRequest
	if err := json.Unmarshal([]byte(reqs[0][1]), &hreq); err != nil {
		t.Fatal(err)
	}
	if err := protocol.CheckHandshake(run("handshake", reqs[0][1]), &hreq); err != nil {
		t.Fatalf("the §14 handshake answer: %v", err)
	}
	var ireq wire.Request
	if err := json.Unmarshal([]byte(reqs[1][1]), &ireq); err != nil {
		t.Fatal(err)
	}
	raw, err := protocol.CheckResponse(run("invoke", reqs[1][1]), ireq.RequestID)
	if err != nil {
		t.Fatalf("the §14 invoke answer: %v", err)
	}
	if res, err := protocol.DecodeResult(ireq.Operation, raw); err != nil {
		t.Fatalf("the §14 invoke result: %v", err)
	} else if c, ok := res.(*wire.ClassifyResult); !ok || c.Classification != "tick" {
		t.Fatalf("the §14 invoke answered %#v", res)
	}
}
