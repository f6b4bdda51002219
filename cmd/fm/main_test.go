package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Every fm process pays the initialisation of every package linked into
// fm, and the launch barrier is an fm process on the path of every
// invocation [GRP-1]. runtime/metrics builds a table of every metric and
// GODEBUG setting when it initialises, 0.1-0.3 ms of each start on these
// machines (docs/performance.md, "Seventh pass"), so fm does not link it:
// serve's GC tuning reads runtime.MemStats instead.
func TestStartupLinksNoMetricsTable(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool")
	}
	out, err := exec.Command(goTool, "list", "-deps", "firstmate.dev/fm/cmd/fm").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	if deps := strings.Fields(string(out)); slices.Contains(deps, "runtime/metrics") {
		t.Fatal("fm links runtime/metrics: every fm start, each launch barrier included, initialises its table")
	}
}
