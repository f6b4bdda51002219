// Package docs checks that the documentation keeps up with the code.
package docs

import (
	"os"
	"os/exec"
	"path/filepath"
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

// docs/conformance.md is what scripts/conformance.sh generates from the tests
// as committed, and no clause of the contract is without a test.
func TestConformanceTableIsCurrent(t *testing.T) {
	contract, err := filepath.Abs("../../shared/spec/CONTRACT.md")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(contract); err != nil {
		t.Skip("the contract is not beside this clone:", err)
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is missing")
	}
	if err := exec.Command("git", "rev-parse", "--git-dir").Run(); err != nil {
		t.Skip("not a git work tree")
	}
	out := filepath.Join(t.TempDir(), "conformance.md")
	cmd := exec.Command("bash", "../scripts/conformance.sh", contract)
	cmd.Env = append(os.Environ(), "OUT="+out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("conformance.sh: %v\n%s", err, msg)
	}
	want, _ := os.ReadFile(out)
	got, _ := os.ReadFile("conformance.md")
	if string(got) != string(want) {
		t.Errorf("docs/conformance.md is stale: run bash scripts/conformance.sh")
	}
	if n := strings.Count(string(want), "**none yet**"); n > 0 {
		t.Errorf("%d contract clauses have no test", n)
	}
}
