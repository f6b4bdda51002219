package wire

import (
	"strings"
	"testing"
)

// [OP-1] [MAN-2] [MAN-3] Each byte bound of a format is the bound its
// validator applies: a value exactly at the bound is accepted, one byte more
// is refused (rule 3).
func TestBoundsHoldExactly(t *testing.T) {
	bound := func(name string, valid func(string) bool, at string, n int) {
		t.Helper()
		if len(at) != n || !valid(at) || valid(at+"a") {
			t.Errorf("%s: bound %d does not hold exactly", name, n)
		}
	}
	bound("source id", ValidSourceID, strings.Repeat("a", MaxSourceIDBytes), MaxSourceIDBytes)
	bound("extension id", ValidExtensionID, strings.Repeat("a", MaxExtensionIDBytes), MaxExtensionIDBytes)
	bound("version", ValidVersion, "1.0.0-"+strings.Repeat("a", MaxVersionBytes-6), MaxVersionBytes)
	bound("adapter name", ValidAdapterName, strings.Repeat("a", MaxAdapterNameBytes), MaxAdapterNameBytes)
	bound("classification", ValidClassification, strings.Repeat("a", MaxClassificationBytes), MaxClassificationBytes)
	bound("config ref", ValidConfigRef, strings.Repeat("a", MaxConfigRefBytes), MaxConfigRefBytes)
	bound("diagnostic", ValidDiagnostic, strings.Repeat("a", MaxDiagnosticBytes), MaxDiagnosticBytes)
	bound("entrypoint", func(s string) bool { return CheckEntrypoint(s) == nil }, strings.Repeat("a", MaxEntrypointBytes), MaxEntrypointBytes)
}
