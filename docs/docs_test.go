// Package docs checks that the documentation keeps up with the code.
package docs

import (
	"os"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/errcode"
)

// Every error code has a row in the troubleshooting table (issue 6).
func TestTroubleshootingTableHasEveryCode(t *testing.T) {
	data, err := os.ReadFile("troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range errcode.All {
		if !strings.Contains(string(data), "\n| `"+string(c)+"` |") {
			t.Errorf("code %s has no row in docs/troubleshooting.md", c)
		}
	}
}
