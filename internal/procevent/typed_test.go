package procevent_test

import (
	"strings"
	"testing"

	"firstmate.dev/fm/internal/testpkg"
)

// [PROTO-2] Every operation has its typed result: no exported function of
// the procevent package returns any (issue 11), so no caller asserts the type of
// an answer. testpkg's own test proves the checker sees the forms of any.
func TestNoExportedFunctionReturnsAny(t *testing.T) {
	found, err := testpkg.ReturnsAny(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(found) > 0 {
		t.Fatalf("exported functions return any: %s", strings.Join(found, "; "))
	}
}
