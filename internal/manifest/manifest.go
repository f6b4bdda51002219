// Package manifest reads firstmate-extension.json, the package manifest, for
// the host (CONTRACT §3). The manifest's type and its rules are defined once,
// in the public package firstmate.dev/fm/pkg/adapter/wire (wire.Manifest),
// which the SDK and its test harness use too, so that an adapter's own tests
// refuse exactly the manifests bind refuses. This package adds only what is
// the host's:
//
//  1. Parse reads a manifest strictly (wire's rule 1) with at most
//     wire.MaxManifestBytes: exactly the seven keys, one capability object
//     with exactly three keys, nothing unknown interpreted optimistically,
//     because a key this host does not know may carry a meaning it would
//     silently drop.
//  2. Every refusal names the file it read (the what argument) and carries
//     the contract's code: schema-invalid for a key's form,
//     entrypoint-invalid for the entrypoint path, capability-mismatch for a
//     capability other than exactly one process-event-adapter ([MAN-1] ..
//     [MAN-5]), so that an operator sees which file to fix and why.
//  3. Highest negotiates a version: the highest one both the manifest
//     offers and this host supports, never a lower one when a higher is
//     common, so a package cannot be downgraded by the order of its list.
//
// That the entrypoint exists in the tree, and the tree's own rules, are
// pkgtree's.
package manifest

import (
	"slices"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// Parse decodes and validates manifest bytes. what names the file in errors.
func Parse(data []byte, what string) (*wire.Manifest, error) {
	var m wire.Manifest
	if err := strictjson.Decode(data, wire.MaxManifestBytes, what, &m); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, errcode.New(errcode.Of(err), "%s: %v", what, err)
	}
	return &m, nil
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
