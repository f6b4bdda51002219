package adapter

import (
	"fmt"
	"slices"
	"strings"
)

// ManifestFile is the manifest's name at the package root, and
// ManifestSchema its schema string (CONTRACT §3).
const (
	ManifestFile   = "firstmate-extension.json"
	ManifestSchema = "firstmate.extension-manifest.v1"
)

// consentFacts are the facts a manifest may require (CONTRACT [MAN-5]).
var consentFacts = []string{"network", "credential-store", "task-metadata", "artifact-references"}

// Manifest is firstmate-extension.json. Every key is required and no other is
// accepted (CONTRACT [MAN-1]).
type Manifest struct {
	Schema           string               `json:"schema"`
	ID               string               `json:"id"`
	Version          string               `json:"version"`
	HostProtocols    []int                `json:"host_protocols"`
	Entrypoint       string               `json:"entrypoint"`
	Capabilities     []ManifestCapability `json:"capabilities"`
	RequiredConsents []string             `json:"required_consents"`
}

// ManifestCapability is the one element of Manifest.Capabilities.
type ManifestCapability struct {
	Name         string   `json:"name"`
	Versions     []int    `json:"versions"`
	AdapterNames []string `json:"adapter_names"`
}

// DecodeManifest strictly parses and validates a manifest the way the host's
// bind does (CONTRACT [MAN-1]..[MAN-5]), except that it cannot check that the
// entrypoint exists in a tree.
func DecodeManifest(data []byte) (*Manifest, error) {
	var m Manifest
	if err := decodeStrict(data, MaxEnvelopeBytes, "manifest", &m); err != nil {
		return nil, plain(err)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Validate checks the manifest rules of CONTRACT [MAN-1]..[MAN-5].
func (m *Manifest) Validate() error {
	if m.Schema != ManifestSchema {
		return fmt.Errorf("manifest: schema is not %s", ManifestSchema)
	}
	if !ValidExtensionID(m.ID) {
		return fmt.Errorf("manifest: id is not ^[a-z0-9]+([.-][a-z0-9]+)*$ of at most 128 bytes")
	}
	if !ValidVersion(m.Version) {
		return fmt.Errorf("manifest: version is not a semantic version of at most 128 bytes")
	}
	if err := manifestInts("host_protocols", m.HostProtocols); err != nil {
		return err
	}
	if err := checkEntrypoint(m.Entrypoint); err != nil {
		return err
	}
	if len(m.Capabilities) != 1 {
		return fmt.Errorf("manifest: capabilities must hold exactly one element")
	}
	c := m.Capabilities[0]
	if c.Name != CapabilityName {
		return fmt.Errorf("manifest: capability name is not %s", CapabilityName)
	}
	if err := manifestInts("capabilities/0/versions", c.Versions); err != nil {
		return err
	}
	if len(c.AdapterNames) == 0 {
		return fmt.Errorf("manifest: adapter_names is empty")
	}
	seen := map[string]bool{}
	for _, n := range c.AdapterNames {
		if !ValidAdapterName(n) || seen[n] {
			return fmt.Errorf("manifest: adapter name %q is invalid or repeated", clip(n, 40))
		}
		seen[n] = true
	}
	seen = map[string]bool{}
	for _, f := range m.RequiredConsents {
		if !slices.Contains(consentFacts, f) || seen[f] {
			return fmt.Errorf("manifest: consent %q is unknown or repeated", clip(f, 40))
		}
		seen[f] = true
	}
	return nil
}

func manifestInts(field string, vs []int) error {
	if len(vs) == 0 {
		return fmt.Errorf("manifest: %s is empty", field)
	}
	seen := map[int]bool{}
	for _, v := range vs {
		if v < 1 || v > 1<<31-1 || seen[v] {
			return fmt.Errorf("manifest: %s holds %d, out of 1..2147483647 or repeated", field, v)
		}
		seen[v] = true
	}
	return nil
}

func checkEntrypoint(p string) error {
	if len(p) < 1 || len(p) > 256 || strings.HasPrefix(p, "/") || strings.Contains(p, `\`) || hasControl(p) {
		return fmt.Errorf("manifest: entrypoint must be a relative path of 1..256 bytes without backslash or control characters")
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." {
			return fmt.Errorf("manifest: entrypoint has an empty, '.' or '..' component")
		}
	}
	return nil
}

// CheckIdentity reports whether m declares exactly id (same extension id,
// version and adapter-name set) and offers host protocol 1 and
// process-event-adapter/1, so that a bind and handshake can succeed.
func (m *Manifest) CheckIdentity(id Identity) error {
	if m.ID != id.ExtensionID || m.Version != id.ExtensionVersion {
		return fmt.Errorf("manifest: %s@%s, but the handler says %s@%s", m.ID, m.Version, id.ExtensionID, id.ExtensionVersion)
	}
	a, b := slices.Clone(m.Capabilities[0].AdapterNames), slices.Clone(id.AdapterNames)
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) {
		return fmt.Errorf("manifest: adapter names %v, but the handler says %v", a, b)
	}
	if !slices.Contains(m.HostProtocols, HostProtocol) || !slices.Contains(m.Capabilities[0].Versions, CapabilityVersion) {
		return fmt.Errorf("manifest: host protocol %d and %s version %d must be offered", HostProtocol, CapabilityName, CapabilityVersion)
	}
	return nil
}
