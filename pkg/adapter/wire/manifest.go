package wire

import (
	"fmt"
	"slices"
	"strings"

	"firstmate.dev/fm/internal/errcode"
)

// Manifest is firstmate-extension.json ([MAN-1]). Every key is required and
// no other is accepted.
type Manifest struct {
	Schema           string               `json:"schema"`
	ID               string               `json:"id"`
	Version          string               `json:"version"`
	HostProtocols    []int64              `json:"host_protocols"`
	Entrypoint       string               `json:"entrypoint"`
	Capabilities     []ManifestCapability `json:"capabilities"`
	RequiredConsents []string             `json:"required_consents"`
}

// ManifestCapability is the one element of Manifest.Capabilities.
type ManifestCapability struct {
	Name         string   `json:"name"`
	Versions     []int64  `json:"versions"`
	AdapterNames []string `json:"adapter_names"`
}

// DecodeManifest strictly parses and validates a manifest the way the host's
// bind does ([MAN-1]..[MAN-5]), except that it cannot check that the
// entrypoint exists in a tree.
func DecodeManifest(data []byte) (*Manifest, error) {
	const what = "manifest"
	var m Manifest
	if err := Decode(data, MaxManifestBytes, what, &m); err != nil {
		return nil, plain(err)
	}
	if err := m.Validate(); err != nil {
		return nil, plain(fmt.Errorf("%s: %w", what, err))
	}
	return &m, nil
}

// Validate applies the rules of [MAN-1]..[MAN-5] that the JSON shape does not
// (everything but the entrypoint's presence in a tree). Its message names
// the offending key, not the file: the caller says which file it read.
func (m *Manifest) Validate() error {
	bad := func(format string, args ...any) error {
		return errcode.New(errcode.SchemaInvalid, format, args...)
	}
	if m.Schema != ManifestSchema {
		return bad("schema must be %q", ManifestSchema)
	}
	if err := CheckID(m.ID); err != nil {
		return bad("%v", err)
	}
	if err := CheckVersion(m.Version); err != nil {
		return bad("%v", err)
	}
	if err := CheckVersionList(m.HostProtocols, "host_protocols"); err != nil {
		return bad("%v", err)
	}
	if err := CheckEntrypoint(m.Entrypoint); err != nil {
		return errcode.New(errcode.EntrypointInvalid, "%v", err)
	}
	if len(m.Capabilities) != 1 {
		return errcode.New(errcode.CapabilityMismatch, "capabilities must hold exactly one %s capability", CapabilityName)
	}
	c := m.Capabilities[0]
	if c.Name != CapabilityName {
		return errcode.New(errcode.CapabilityMismatch, "capability %q is not supported; only %q is", c.Name, CapabilityName)
	}
	if err := CheckVersionList(c.Versions, "capabilities[0].versions"); err != nil {
		return bad("%v", err)
	}
	if err := CheckAdapterNames(c.AdapterNames); err != nil {
		return bad("capabilities[0].%v", err)
	}
	seen := map[string]bool{}
	for _, f := range m.RequiredConsents {
		if !slices.Contains(Consents, f) {
			return bad("required_consents: unknown consent %q (known: %s)", f, strings.Join(Consents, ", "))
		}
		if seen[f] {
			return bad("required_consents: duplicate %q", f)
		}
		seen[f] = true
	}
	return nil
}
