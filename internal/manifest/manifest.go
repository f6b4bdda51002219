// Package manifest holds firstmate-extension.json, the package manifest, and
// its rules (CONTRACT §3).
//
// The manifest is read strictly (see strictjson): exactly the seven keys, one
// process-event-adapter capability with exactly three keys, and nothing
// unknown is interpreted optimistically.
package manifest

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/strictjson"
)

// File is the manifest's name at the package root.
const File = "firstmate-extension.json"

// MaxBytes bounds the manifest file.
const MaxBytes = 65536

// Schema is the only manifest schema this host reads.
const Schema = "firstmate.extension-manifest.v1"

// CapabilityName is the only capability this manifest version accepts.
const CapabilityName = "process-event-adapter"

// Consents lists the supported consent facts, in the contract's order.
var Consents = []string{"network", "credential-store", "task-metadata", "artifact-references"}

// Manifest is a parsed, validated manifest.
type Manifest struct {
	Schema           string       `json:"schema"`
	ID               string       `json:"id"`
	Version          string       `json:"version"`
	HostProtocols    []int64      `json:"host_protocols"`
	Entrypoint       string       `json:"entrypoint"`
	Capabilities     []Capability `json:"capabilities"`
	RequiredConsents []string     `json:"required_consents"`
}

// Capability is one capability declaration.
type Capability struct {
	Name         string   `json:"name"`
	Versions     []int64  `json:"versions"`
	AdapterNames []string `json:"adapter_names"`
}

var (
	idRe      = regexp.MustCompile(`^[a-z0-9]+([.-][a-z0-9]+)*$`)
	adapterRe = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
	// SemVer 2.0.0 as published at semver.org.
	semverRe = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
		`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
		`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)
)

// Parse decodes and validates manifest bytes. what names the file in errors.
func Parse(data []byte, what string) (*Manifest, error) {
	var m Manifest
	if err := strictjson.Decode(data, MaxBytes, what, &m); err != nil {
		return nil, err
	}
	if err := m.Validate(what); err != nil {
		return nil, err
	}
	return &m, nil
}

// Validate applies the rules of [MAN-1]..[MAN-5] that the JSON shape does not
// (everything but the entrypoint's presence in a tree). what names the file in
// errors.
func (m *Manifest) Validate(what string) error {
	bad := func(format string, args ...any) error {
		return errcode.New(errcode.SchemaInvalid, "%s: %s", what, fmt.Sprintf(format, args...))
	}
	if m.Schema != Schema {
		return bad("schema must be %q", Schema)
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
		return errcode.New(errcode.EntrypointInvalid, "%s: %v", what, err)
	}
	if len(m.Capabilities) != 1 {
		return errcode.New(errcode.CapabilityMismatch, "%s: capabilities must hold exactly one %s capability", what, CapabilityName)
	}
	c := m.Capabilities[0]
	if c.Name != CapabilityName {
		return errcode.New(errcode.CapabilityMismatch, "%s: capability %q is not supported; only %q is", what, c.Name, CapabilityName)
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

// CheckID applies the extension id rule.
func CheckID(id string) error {
	if len(id) > 128 || !idRe.MatchString(id) {
		return fmt.Errorf("id %q must be lower-case words joined by '.' or '-' (^[a-z0-9]+([.-][a-z0-9]+)*$), at most 128 bytes", trunc(id))
	}
	return nil
}

// CheckVersion applies the SemVer 2.0 rule.
func CheckVersion(v string) error {
	if len(v) > 128 || !semverRe.MatchString(v) {
		return fmt.Errorf("version %q must be a semantic version like 1.2.3 (no v prefix), at most 128 bytes", trunc(v))
	}
	return nil
}

// CheckAdapterNames applies the adapter-name list rule.
func CheckAdapterNames(names []string) error {
	if len(names) == 0 {
		return fmt.Errorf("adapter_names must not be empty")
	}
	seen := map[string]bool{}
	for _, n := range names {
		if err := CheckAdapter(n); err != nil {
			return fmt.Errorf("adapter_names: %v", err)
		}
		if seen[n] {
			return fmt.Errorf("adapter_names: duplicate %q", n)
		}
		seen[n] = true
	}
	return nil
}

// CheckAdapter applies the adapter-name rule.
func CheckAdapter(n string) error {
	if len(n) > 32 || !adapterRe.MatchString(n) {
		return fmt.Errorf("adapter name %q must be lower-case words joined by '-' (^[a-z0-9]+(-[a-z0-9]+)*$), at most 32 bytes", trunc(n))
	}
	return nil
}

// CheckEntrypoint applies the entrypoint path rule: 1..256 bytes, relative,
// '/'-separated, no empty, "." or ".." component, no backslash, no control
// character, valid UTF-8.
func CheckEntrypoint(p string) error {
	if len(p) == 0 || len(p) > 256 || !utf8.ValidString(p) {
		return fmt.Errorf("entrypoint %q must be 1..256 bytes of UTF-8", trunc(p))
	}
	if strings.ContainsAny(p, "\\") || strings.ContainsFunc(p, isControl) {
		return fmt.Errorf("entrypoint %q must not hold a backslash or control character", trunc(p))
	}
	for _, comp := range strings.Split(p, "/") {
		if comp == "" || comp == "." || comp == ".." {
			return fmt.Errorf("entrypoint %q must be a relative '/'-separated path with no empty, '.' or '..' component", trunc(p))
		}
	}
	return nil
}

// isControl reports a C0 or C1 control character or DEL, the set
// internal/protocol refuses in a config ref or diagnostic.
func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) }

// CheckVersionList applies the rule of host_protocols and capability versions
// ([MAN-2]): a non-empty, duplicate-free list of integers 1..2^31-1. field
// names the list in errors.
func CheckVersionList(xs []int64, field string) error {
	if len(xs) == 0 {
		return fmt.Errorf("%s must not be empty", field)
	}
	seen := map[int64]bool{}
	for _, x := range xs {
		if x < 1 || x > 1<<31-1 {
			return fmt.Errorf("%s: %d is out of range 1..2147483647", field, x)
		}
		if seen[x] {
			return fmt.Errorf("%s: duplicate %d", field, x)
		}
		seen[x] = true
	}
	return nil
}

// Highest returns the highest value present in both offered and supported,
// or 0 when they share none. No downgrade below a common value is possible
// because only common values are considered.
func Highest(offered []int64, supported []int64) int64 {
	var best int64
	for _, x := range offered {
		if slices.Contains(supported, x) && x > best {
			best = x
		}
	}
	return best
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
