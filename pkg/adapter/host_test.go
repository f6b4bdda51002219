package adapter_test

import (
	"slices"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/pkg/adapter"
)

// The SDK's documented constants agree with the host. (Those the host names
// as constants are also checked at compile time, in host.go.)
func TestConstantsAgreeWithHost(t *testing.T) {
	codes := []string{string(adapter.InvalidRequest), string(adapter.Incompatible), string(adapter.Conflict), string(adapter.Unavailable), string(adapter.Internal)}
	if !slices.Equal(codes, protocol.PackageErrorCodes) {
		t.Errorf("codes %v, host %v", codes, protocol.PackageErrorCodes)
	}
	if !slices.Contains(protocol.HostProtocols, adapter.HostProtocol) || !slices.Contains(protocol.CapabilityVersions, adapter.CapabilityVersion) {
		t.Errorf("host protocol %d / capability version %d not spoken by the host", adapter.HostProtocol, adapter.CapabilityVersion)
	}
	ops := []string{adapter.OpPoll, adapter.OpClassify, adapter.OpTerminal, adapter.OpSilent}
	if !slices.Equal(ops, protocol.Operations) {
		t.Errorf("operations %v, host %v", ops, protocol.Operations)
	}
	// The byte bounds without a host constant hold exactly at the bound.
	bound := func(name string, valid func(string) bool, at string, n int) {
		t.Helper()
		if len(at) != n || !valid(at) || valid(at+"a") {
			t.Errorf("%s: bound %d does not hold exactly", name, n)
		}
	}
	bound("source id", adapter.ValidSourceID, strings.Repeat("a", adapter.MaxSourceIDBytes), adapter.MaxSourceIDBytes)
	bound("extension id", adapter.ValidExtensionID, strings.Repeat("a", adapter.MaxExtensionIDBytes), adapter.MaxExtensionIDBytes)
	bound("version", adapter.ValidVersion, "1.0.0-"+strings.Repeat("a", adapter.MaxVersionBytes-6), adapter.MaxVersionBytes)
	bound("adapter name", adapter.ValidAdapterName, strings.Repeat("a", adapter.MaxAdapterNameBytes), adapter.MaxAdapterNameBytes)
	bound("classification", adapter.ValidClassification, strings.Repeat("a", adapter.MaxClassificationBytes), adapter.MaxClassificationBytes)
	bound("config ref", adapter.ValidConfigRef, strings.Repeat("a", adapter.MaxConfigRefBytes), adapter.MaxConfigRefBytes)
}
