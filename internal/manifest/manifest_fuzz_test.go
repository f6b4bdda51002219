package manifest_test

import (
	"encoding/json"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/manifest"
	"firstmate.dev/fm/internal/reliability"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

const fuzzManifest = `{"schema":"firstmate.extension-manifest.v1","id":"org.example.review-feed","version":"1.2.3-rc.1+build.7","host_protocols":[1,2],"entrypoint":"bin/firstmate-extension","capabilities":[{"name":"process-event-adapter","versions":[1],"adapter_names":["review-feed","b"]}],"required_consents":["network","task-metadata"]}`

// FuzzParse: a manifest is accepted only when an independent reading finds
// exactly the seven keys of [MAN-1] holding values that the contract's rules
// ([MAN-2]..[MAN-5]), restated here without the package's regular
// expressions, allow; it re-encodes to a manifest that parses the same; and
// a refusal has a manifest code.
func FuzzParse(f *testing.F) {
	r := func(old, new string) string { return strings.Replace(fuzzManifest, old, new, 1) }
	for _, s := range []string{
		fuzzManifest, r(`"id":`, `"x":1,"id":`), r(`,"required_consents":["network","task-metadata"]`, ``), r(`1.2.3`, `v1.2.3`),
		r(`1.2.3`, `01.2.3`), r(`rc.1`, `rc.01`), r(`[1,2]`, `[1,1]`), r(`[1,2]`, `[0]`), r(`[1,2]`, `[2147483648]`), r(`[1,2]`, `[1.0]`),
		r(`[1,2]`, `[]`), r(`bin/firstmate-extension`, `/bin/sh`), r(`bin/firstmate-extension`, `bin/../x`), r(`bin/firstmate-extension`, `bin\\x`),
		r(`"review-feed","b"`, `"b","b"`), r(`"review-feed","b"`, `"Review"`), r(`"review-feed","b"`, `"`+strings.Repeat("a", 33)+`"`),
		r(`"network","task-metadata"`, `"root"`), r(`org.example`, `org..example`), r(`"versions":[1],`, `"versions":[1],"hooks":[],`),
		r(`}],"required`, `},{"name":"process-event-adapter","versions":[1],"adapter_names":["c"]}],"required`), "\ufeff" + fuzzManifest,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := manifest.Parse(data, "fuzz")
		if err != nil {
			switch errcode.Of(err) {
			case errcode.JSONInvalid, errcode.JSONOversized, errcode.SchemaInvalid, errcode.EntrypointInvalid, errcode.CapabilityMismatch:
				return
			}
			t.Fatalf("refused as %s: %v", errcode.Of(err), err)
		}
		v, rerr := reliability.StrictJSON(data, strictjson.MaxDepth)
		top, _ := v.(map[string]any)
		if rerr != nil || !exactly(top, "schema", "id", "version", "host_protocols", "entrypoint", "capabilities", "required_consents") {
			t.Fatalf("accepted %q: not a strict document of exactly the seven keys (%v)", data, rerr)
		}
		caps, _ := top["capabilities"].([]any)
		var c map[string]any
		if len(caps) == 1 {
			c, _ = caps[0].(map[string]any)
		}
		consents, _ := top["required_consents"].([]any)
		switch {
		case top["schema"] != wire.ManifestSchema:
			t.Fatalf("accepted schema %v", top["schema"])
		case !word(str(top["id"]), ".-") || len(str(top["id"])) > 128:
			t.Fatalf("accepted id %q", top["id"])
		case !semver(str(top["version"])) || len(str(top["version"])) > 128:
			t.Fatalf("accepted version %q", top["version"])
		case !versions(top["host_protocols"]):
			t.Fatalf("accepted host_protocols %v", top["host_protocols"])
		case !entrypoint(str(top["entrypoint"])):
			t.Fatalf("accepted entrypoint %q", top["entrypoint"])
		case !exactly(c, "name", "versions", "adapter_names") || c["name"] != wire.CapabilityName || !versions(c["versions"]):
			t.Fatalf("accepted capabilities %v", top["capabilities"])
		case !names(c["adapter_names"]):
			t.Fatalf("accepted adapter_names %v", c["adapter_names"])
		case !set(consents, wire.Consents):
			t.Fatalf("accepted required_consents %v", consents)
		}
		again, err := strictjson.Canonical(m)
		if err != nil {
			t.Fatal(err)
		}
		if m2, err := manifest.Parse(again, "again"); err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("the canonical form %s of an accepted manifest parses as %v, %v", again, m2, err)
		}
	})
}

// FuzzCheckEntrypoint compares the entrypoint rule of [MAN-3] with its
// statement in the contract, and checks that an accepted entrypoint joined
// to a package root can only name something below it.
func FuzzCheckEntrypoint(f *testing.F) {
	for _, s := range []string{"bin/x", "x", "/x", "./x", "bin/../x", "bin//x", "bin/", "..", ".", "a\\b", "a\x00b", "a\u0085b", "\xff", "é/ü", strings.Repeat("a/", 128) + "b", strings.Repeat("a", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got := wire.CheckEntrypoint(p) == nil
		if want := entrypoint(p); got != want {
			t.Fatalf("CheckEntrypoint(%q) accepts=%v, the contract says %v", p, got, want)
		}
		if got {
			joined := filepath.Join("/pkg", p)
			if path.Clean(p) != p || path.IsAbs(p) || !strings.HasPrefix(joined, "/pkg/") || joined != "/pkg/"+p {
				t.Fatalf("accepted entrypoint %q leaves the package root: %s", p, joined)
			}
		}
	})
}

// FuzzCheckVersion compares the SemVer rule of [MAN-2] with a hand-written
// SemVer 2.0.0 parser.
func FuzzCheckVersion(f *testing.F) {
	for _, s := range []string{"1.2.3", "0.0.0", "01.2.3", "1.2", "1.2.3-", "1.2.3-0a", "1.2.3-01", "1.2.3-a..b", "1.2.3+b.01", "1.2.3+", "v1.2.3", "1.2.3-rc.1+build.5", "1.2.3-\u0661"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if got, want := wire.CheckVersion(v) == nil, semver(v) && len(v) <= 128; got != want {
			t.Fatalf("CheckVersion(%q) accepts=%v, SemVer 2.0.0 says %v", v, got, want)
		}
	})
}

func str(v any) string { s, _ := v.(string); return s }

// exactly reports whether m has exactly the keys.
func exactly(m map[string]any, keys ...string) bool {
	if m == nil || len(m) != len(keys) {
		return false
	}
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			return false
		}
	}
	return true
}

// word reports whether s is runs of [a-z0-9] joined by single separators
// from seps.
func word(s, seps string) bool {
	if s == "" {
		return false
	}
	prevSep := true
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9':
			prevSep = false
		case strings.ContainsRune(seps, c) && !prevSep:
			prevSep = true
		default:
			return false
		}
	}
	return !prevSep
}

// versions is [MAN-2]'s version list: non-empty, duplicate-free integers
// 1..2^31-1.
func versions(v any) bool {
	xs, ok := v.([]any)
	if !ok || len(xs) == 0 {
		return false
	}
	seen := map[string]bool{}
	for _, x := range xs {
		n, ok := x.(json.Number)
		i, err := n.Int64()
		if !ok || err != nil || i < 1 || i > 1<<31-1 || seen[string(n)] {
			return false
		}
		seen[string(n)] = true
	}
	return true
}

// names is [MAN-4]'s adapter-name list.
func names(v any) bool {
	xs, ok := v.([]any)
	if !ok || len(xs) == 0 {
		return false
	}
	var ss []string
	for _, x := range xs {
		s, ok := x.(string)
		if !ok || len(s) > 32 || !word(s, "-") || slices.Contains(ss, s) {
			return false
		}
		ss = append(ss, s)
	}
	return true
}

// set reports whether xs are distinct members of allowed.
func set(xs []any, allowed []string) bool {
	var ss []string
	for _, x := range xs {
		s, ok := x.(string)
		if !ok || !slices.Contains(allowed, s) || slices.Contains(ss, s) {
			return false
		}
		ss = append(ss, s)
	}
	return xs != nil
}

// entrypoint is [MAN-3]'s path rule: 1..256 bytes of UTF-8, relative,
// '/'-separated, no empty, "." or ".." component, no backslash, no control
// character (C0, DEL, C1).
func entrypoint(p string) bool {
	if len(p) < 1 || len(p) > 256 || !utf8.ValidString(p) || strings.ContainsRune(p, '\\') {
		return false
	}
	for _, r := range p {
		if r < 0x20 || r >= 0x7f && r <= 0x9f {
			return false
		}
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." {
			return false
		}
	}
	return true
}

// semver parses SemVer 2.0.0 by hand: MAJOR.MINOR.PATCH without leading
// zeros, then an optional pre-release of dot-separated non-empty
// [0-9A-Za-z-] identifiers (numeric ones without leading zeros), then an
// optional build of dot-separated non-empty [0-9A-Za-z-] identifiers.
func semver(v string) bool {
	rest, build, hasBuild := strings.Cut(v, "+")
	if hasBuild && !idents(build, false) {
		return false
	}
	core, pre, hasPre := strings.Cut(rest, "-")
	if hasPre && !idents(pre, true) {
		return false
	}
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return false
	}
	for _, p := range parts {
		if !numeric(p) || len(p) > 1 && p[0] == '0' {
			return false
		}
	}
	return true
}

func idents(s string, pre bool) bool {
	for _, id := range strings.Split(s, ".") {
		if id == "" {
			return false
		}
		for _, c := range id {
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-') {
				return false
			}
		}
		if pre && numeric(id) && len(id) > 1 && id[0] == '0' {
			return false
		}
	}
	return true
}

func numeric(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}
