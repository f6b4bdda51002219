package cli

import (
	"flag"
	"testing"
)

// [CLI-1] The table of verbs is well formed: group names are unique, a
// group's verbs have unique names, a group with a nameless verb has only
// that one, and every verb declares its flags on any new flag set without
// panicking (a flag declared twice, say).
func TestVerbTable(t *testing.T) {
	groups := map[string]bool{}
	for _, g := range commands() {
		if groups[g.name] || g.name == "" || g.summary == "" || len(g.verbs) == 0 {
			t.Errorf("group %q: duplicate, unnamed, without summary or without verbs", g.name)
		}
		groups[g.name] = true
		verbs := map[string]bool{}
		for _, v := range g.verbs {
			if verbs[v.Name] || v.Summary == "" || v.Setup == nil || v.Name == "" && len(g.verbs) != 1 {
				t.Errorf("verb %q of %q: duplicate, without summary or Setup, or a nameless verb beside others", v.Name, g.name)
			}
			verbs[v.Name] = true
			for range 2 {
				if v.Setup(flag.NewFlagSet(v.Name, flag.ContinueOnError)) == nil {
					t.Errorf("verb %q of %q: Setup returned no run function", v.Name, g.name)
				}
			}
		}
	}
	if !groups["extension"] || !groups["procevent"] || !groups["doctor"] {
		t.Fatalf("groups %v", groups)
	}
}
