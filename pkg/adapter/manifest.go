package adapter

import (
	"fmt"
	"slices"

	"firstmate.dev/fm/internal/manifest"
)

// ManifestFile is the manifest's name at the package root, and
// ManifestSchema its schema string (spec §3).
const (
	ManifestFile   = "firstmate-extension.json"
	ManifestSchema = "firstmate.extension-manifest.v1"
)

// Manifest is firstmate-extension.json. Every key is required and no other is
// accepted (spec [MAN-1]).
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
// bind does (spec [MAN-1]..[MAN-5]), except that it cannot check that the
// entrypoint exists in a tree.
func DecodeManifest(data []byte) (*Manifest, error) {
	m, err := manifest.Parse(data, "manifest")
	if err != nil {
		return nil, plain(err)
	}
	caps := make([]ManifestCapability, len(m.Capabilities))
	for i, c := range m.Capabilities {
		caps[i] = ManifestCapability{Name: c.Name, Versions: convertInts[int](c.Versions), AdapterNames: c.AdapterNames}
	}
	return &Manifest{
		Schema:           m.Schema,
		ID:               m.ID,
		Version:          m.Version,
		HostProtocols:    convertInts[int](m.HostProtocols),
		Entrypoint:       m.Entrypoint,
		Capabilities:     caps,
		RequiredConsents: m.RequiredConsents,
	}, nil
}

// Validate checks the manifest rules of spec [MAN-1]..[MAN-5].
func (m *Manifest) Validate() error {
	caps := make([]manifest.Capability, len(m.Capabilities))
	for i, c := range m.Capabilities {
		caps[i] = manifest.Capability{Name: c.Name, Versions: convertInts[int64](c.Versions), AdapterNames: c.AdapterNames}
	}
	hm := manifest.Manifest{
		Schema:           m.Schema,
		ID:               m.ID,
		Version:          m.Version,
		HostProtocols:    convertInts[int64](m.HostProtocols),
		Entrypoint:       m.Entrypoint,
		Capabilities:     caps,
		RequiredConsents: m.RequiredConsents,
	}
	return plain(hm.Validate("manifest"))
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

// convertInts converts between the SDK's version lists ([]int) and the
// host's ([]int64); the values are 1..2^31-1 wherever it is used.
func convertInts[To, From int | int64](xs []From) []To {
	if xs == nil {
		return nil
	}
	out := make([]To, len(xs))
	for i, x := range xs {
		out[i] = To(x)
	}
	return out
}
