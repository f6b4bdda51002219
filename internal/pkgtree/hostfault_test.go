package pkgtree

import (
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/testpkg"
)

// [OP-3] [CLI-3] EMFILE for real: a scan that runs out of descriptors while
// walking a valid package is host-resource, not package-invalid: the package
// is fine, the host is not. The same scan succeeds once descriptors are back.
func TestScanOutOfFiles(t *testing.T) {
	root := newPkg(t, fixtureNested...)
	for spare := range 3 {
		restore := testpkg.StarveFiles(t, spare)
		_, err := Scan(root, Source)
		restore()
		wantCode(t, err, errcode.HostResource)
	}
	mustScan(t, root, Source)
}
