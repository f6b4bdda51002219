package upgrade

import (
	"os"
	"path/filepath"
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/testpkg"
)

// [UPG-4] the plan of an upgrade survives as written (no source, no consent
// included), is listed for doctor until it is removed, and a plan file that
// is not the plan of its name is refused, never acted on.
func TestPlanFile(t *testing.T) {
	h, _ := testpkg.Home(t)
	if ps, err := Plans(h); err != nil || ps != nil {
		t.Fatalf("no plans: %v %v", ps, err)
	}
	from := "sha256:0000000000000000000000000000000000000000000000000000000000000001"
	p := &Plan{Schema: PlanSchema, ExtensionID: "org.example.fake", From: from, PackageDir: "/pkg", TimeoutMS: 1000, HandshakeTimeoutMS: 5000}
	if err := writePlan(h, p); err != nil {
		t.Fatal(err)
	}
	got, err := readPlan(h, "org.example.fake")
	if err != nil || got == nil || got.From != from || got.Sources == nil || len(got.Sources) != 0 || got.Consents == nil {
		t.Fatalf("read back %+v, %v", got, err)
	}
	if ps, err := Plans(h); err != nil || len(ps) != 1 || ps[0].ExtensionID != "org.example.fake" {
		t.Fatalf("plans: %v %v", ps, err)
	}
	if err := os.Rename(planPath(h, "org.example.fake"), planPath(h, "org.example.other")); err != nil {
		t.Fatal(err)
	}
	if _, err := readPlan(h, "org.example.other"); !errcode.Is(err, errcode.SchemaInvalid) {
		t.Fatalf("a plan under another name: %v", err)
	}
	if err := os.Rename(planPath(h, "org.example.other"), planPath(h, "org.example.fake")); err != nil {
		t.Fatal(err)
	}
	if err := removePlan(h, "org.example.fake"); err != nil {
		t.Fatal(err)
	}
	if ps, err := Plans(h); err != nil || len(ps) != 0 {
		t.Fatalf("after removal: %v %v", ps, err)
	}
	if fi, err := os.Stat(filepath.Dir(planPath(h, "x"))); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("plans directory: %v %v", fi, err)
	}
}
