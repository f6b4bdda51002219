package binding_test

import (
	"bytes"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/reliability"
	"firstmate.dev/fm/internal/strictjson"
)

var digestRe = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// FuzzRecord decodes arbitrary bytes as a binding record and validates it as
// every registry reader does ([BND-1], [BND-3], [BND-5], [JSON-1]): what is
// accepted is, by an independent reading, exactly the record's keys at every
// level, has its package root where [BND-3] puts it and only supported
// versions, and re-encodes ([BND-2]) to bytes that decode to the same
// record and encode again to themselves.
func FuzzRecord(f *testing.F) {
	h := &home.Home{Root: "/fm", Dir: "/fm/home", State: "/fm/home/state"}
	d := "sha256:" + strings.Repeat("a", 64)
	good := binding.Record{
		Schema: binding.Schema, ExtensionID: "org.example.a", ExtensionVersion: "1.0.0",
		Source:         binding.Source{Kind: binding.SourceKind, Path: "/opt/pkgs/a"},
		PackageRoot:    h.PackageRoot("org.example.a", "1.0.0", strings.Repeat("a", 64)),
		ManifestSHA256: d, PackageDigest: d, Entrypoint: "bin/x", EntrypointSHA256: d, HostProtocol: 1,
		Capabilities: []binding.Capability{{Name: "process-event-adapter", Version: 1, AdapterNames: []string{"a", "b"}}},
		Consents:     binding.Consents{TrustedSameUserCode: true, Network: true},
		TimeoutMS:    binding.DefaultTimeoutMS,
	}
	data, err := good.Encode()
	if err != nil {
		f.Fatal(err)
	}
	r := func(old, new string) []byte { return bytes.Replace(data, []byte(old), []byte(new), 1) }
	for _, s := range [][]byte{
		data, r(`"timeout_ms": 300000`, `"timeout_ms": 99`), r(`"host_protocol": 1`, `"host_protocol": 2`), r(`"version": 1`, `"version": 2`),
		r(`"trusted_same_user_code": true`, `"trusted_same_user_code": false`), r(`/opt/pkgs/a`, `/opt/pkgs/../a`), r(`/opt/pkgs/a`, `opt/a`),
		r(`"package_root": "/fm`, `"package_root": "/elsewhere`), r(`"kind": "local-directory"`, `"kind": "git"`), r(`"network": true`, `"network": true, "root": true`),
		r(`"entrypoint": "bin/x"`, `"entrypoint": "../x"`), r(`"a",`, `"b",`), r(`"timeout_ms": 300000`, `"timeout_ms": 3e5`),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var rec binding.Record
		err := strictjson.Decode(data, binding.MaxBytes, "fuzz", &rec)
		if err == nil {
			err = rec.Validate(h, "fuzz")
		}
		if err != nil {
			switch errcode.Of(err) {
			case errcode.JSONInvalid, errcode.JSONOversized, errcode.SchemaInvalid, errcode.ProtocolIncompatible:
				return
			}
			t.Fatalf("refused as %s: %v", errcode.Of(err), err)
		}
		v, rerr := reliability.StrictJSON(data, strictjson.MaxDepth)
		top, _ := v.(map[string]any)
		src, _ := top["source"].(map[string]any)
		cons, _ := top["consents"].(map[string]any)
		caps, _ := top["capabilities"].([]any)
		var c map[string]any
		if len(caps) == 1 {
			c, _ = caps[0].(map[string]any)
		}
		switch {
		case rerr != nil || !has(top, "schema", "extension_id", "extension_version", "source", "package_root", "manifest_sha256", "package_digest",
			"entrypoint", "entrypoint_sha256", "host_protocol", "capabilities", "consents", "timeout_ms"):
			t.Fatalf("accepted %q: not a strict document of exactly the record's keys (%v)", data, rerr)
		case !has(src, "kind", "path") || !has(c, "name", "version", "adapter_names") ||
			!has(cons, "trusted_same_user_code", "network", "credential_store", "task_metadata", "artifact_references") || cons["trusted_same_user_code"] != true:
			t.Fatalf("accepted %q: a nested object is not exactly its keys, or trust is not given", data)
		case rec.PackageRoot != h.PackageRoot(rec.ExtensionID, rec.ExtensionVersion, binding.Hex(rec.PackageDigest)):
			t.Fatalf("[BND-3] accepted package_root %q", rec.PackageRoot)
		case rec.HostProtocol != 1 || rec.Capabilities[0].Version != 1:
			t.Fatalf("[BND-5] accepted versions %d/%d", rec.HostProtocol, rec.Capabilities[0].Version)
		case !digestRe.MatchString(rec.ManifestSHA256) || !digestRe.MatchString(rec.PackageDigest) || !digestRe.MatchString(rec.EntrypointSHA256):
			t.Fatalf("accepted digests %q %q %q", rec.ManifestSHA256, rec.PackageDigest, rec.EntrypointSHA256)
		case rec.TimeoutMS < binding.MinTimeoutMS || rec.TimeoutMS > binding.MaxTimeoutMS:
			t.Fatalf("accepted timeout_ms %d", rec.TimeoutMS)
		case !strings.HasPrefix(rec.Source.Path, "/") || strings.Contains(rec.Source.Path+"/", "/./") || strings.Contains(rec.Source.Path+"/", "/../") ||
			strings.Contains(rec.Source.Path, "//") || len(rec.Source.Path) > 1 && strings.HasSuffix(rec.Source.Path, "/"):
			t.Fatalf("accepted source path %q", rec.Source.Path)
		}
		enc, err := rec.Encode()
		if err != nil {
			t.Fatal(err)
		}
		var again binding.Record
		if err := strictjson.Decode(enc, binding.MaxBytes, "again", &again); err != nil || again.Validate(h, "again") != nil || !reflect.DeepEqual(rec, again) {
			t.Fatalf("[BND-2] the encoding of an accepted record does not decode to it: %v\n%s", err, enc)
		}
		if enc2, _ := again.Encode(); !bytes.Equal(enc, enc2) {
			t.Fatalf("[BND-2] encoding is not stable:\n%s\n%s", enc, enc2)
		}
	})
}

// has reports whether m has exactly the keys.
func has(m map[string]any, keys ...string) bool {
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
