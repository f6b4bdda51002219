package adapter_test

import (
	"strings"
	"testing"

	"firstmate.dev/fm/pkg/adapter/adaptertest"
	"firstmate.dev/fm/pkg/adapter/wire"
)

const goodManifest = `{
  "schema": "firstmate.extension-manifest.v1",
  "id": "org.example.fake",
  "version": "1.2.3-rc.1+build.5",
  "host_protocols": [1],
  "entrypoint": "bin/firstmate-extension",
  "capabilities": [
    {"name": "process-event-adapter", "versions": [1], "adapter_names": ["gamma", "alpha", "beta-2"]}
  ],
  "required_consents": []
}
`

func TestManifest(t *testing.T) {
	m, err := wire.DecodeManifest([]byte(goodManifest))
	if err != nil {
		t.Fatal(err)
	}
	if err := adaptertest.CheckIdentity(m, newFake().Identity()); err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"missing key":       strings.Replace(goodManifest, `"required_consents": []`, `"x": 1`, 1),
		"extra key":         strings.Replace(goodManifest, `"host_protocols"`, `"extra": true, "host_protocols"`, 1),
		"extra cap key":     strings.Replace(goodManifest, `"name": "process-event-adapter"`, `"name": "process-event-adapter", "x": 1`, 1),
		"schema":            strings.Replace(goodManifest, "manifest.v1", "manifest.v2", 1),
		"id":                strings.Replace(goodManifest, `"org.example.fake"`, `"Org.Example"`, 1),
		"version":           strings.Replace(goodManifest, `"1.2.3-rc.1+build.5"`, `"v1.2"`, 1),
		"absolute entry":    strings.Replace(goodManifest, `"bin/firstmate-extension"`, `"/bin/x"`, 1),
		"dotdot entry":      strings.Replace(goodManifest, `"bin/firstmate-extension"`, `"bin/../x"`, 1),
		"empty component":   strings.Replace(goodManifest, `"bin/firstmate-extension"`, `"bin//x"`, 1),
		"backslash entry":   strings.Replace(goodManifest, `"bin/firstmate-extension"`, `"bin\\x"`, 1),
		"other capability":  strings.Replace(goodManifest, `"process-event-adapter"`, `"lifecycle-sink"`, 1),
		"duplicate adapter": strings.Replace(goodManifest, `"beta-2"]`, `"alpha"]`, 1),
		"duplicate proto":   strings.Replace(goodManifest, `"host_protocols": [1]`, `"host_protocols": [1, 1]`, 1),
		"unknown consent":   strings.Replace(goodManifest, `"required_consents": []`, `"required_consents": ["root"]`, 1),
		"duplicate consent": strings.Replace(goodManifest, `"required_consents": []`, `"required_consents": ["network", "network"]`, 1),
		"duplicate key":     strings.Replace(goodManifest, `"id": "org.example.fake",`, `"id": "org.example.fake", "id": "org.example.fake",`, 1),
	}
	for name, doc := range bad {
		if _, err := wire.DecodeManifest([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	f := newFake()
	f.id.AdapterNames = []string{"alpha"}
	if err := adaptertest.CheckIdentity(m, f.Identity()); err == nil {
		t.Error("adapter set mismatch accepted")
	}
	f = newFake()
	f.id.ExtensionVersion = "1.2.3"
	if err := adaptertest.CheckIdentity(m, f.Identity()); err == nil {
		t.Error("version mismatch accepted")
	}
	m2, _ := wire.DecodeManifest([]byte(strings.Replace(goodManifest, `"host_protocols": [1]`, `"host_protocols": [2]`, 1)))
	if err := adaptertest.CheckIdentity(m2, newFake().Identity()); err == nil {
		t.Error("manifest without host protocol 1 accepted")
	}
}
