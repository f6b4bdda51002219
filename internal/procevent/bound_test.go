package procevent_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// [INV-4] [OP-1] [CAP-4] [OP-3]: every in-bounds result can be carried. At
// the exact bounds, the largest all-'"', all-control and all-4-byte-UTF-8
// outputs are captured and every verdict request carrying them reaches the
// package (silent and terminal true through `start`, classify through
// `fm procevent classify`); one more character of each is refused at
// capture: the result is response-oversized evidence, never an output that
// no verdict could be asked about.
func TestEveryInBoundsResultIsCarried(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.bind()
	f.mode("poll", "file")
	f.mode("silent", "true")
	f.mode("terminal", "true")
	f.mode("classify", "carried")
	emoji := "\U0001F600"
	cases := []struct {
		name string
		unit string
		most int
		more string
	}{
		{"quotes", `"`, wire.MaxEscapedOutputBytes / 2, `"`},
		{"controls", "\x1b", wire.MaxEscapedOutputBytes / 6, "\x1b"},
		{"emoji", emoji, wire.MaxOutputBytes / 4, "a"},
	}
	for i, c := range cases {
		for _, over := range []bool{false, true} {
			output := strings.Repeat(c.unit, c.most)
			if over {
				output += c.more
			}
			poll, err := strictjson.Canonical(wire.PollResult{Status: "result", Output: output})
			if err != nil {
				t.Fatal(err)
			}
			f.write(filepath.Join(f.extState, "poll-result"), string(poll), 0o600)
			id := fmt.Sprintf("s%d-%t", i, over)
			tok := f.registerExt(id)
			wakes := len(f.wakes())
			result := filepath.Join(f.h.Inbox(), id+".1.result")
			out := f.ok("procevent", "start", id)
			if over {
				var ev wire.Evidence
				got := f.read(result)
				if err := strictjson.Decode([]byte(strings.TrimSuffix(got, "\n")), 4096, "evidence", &ev); err != nil ||
					ev.Code != string(errcode.ResponseOversized) || ev.ExtensionID != extID || ev.Operation != wire.OpPoll {
					t.Errorf("%s: one more (%d bytes, %d escaped): captured %.80q, want response-oversized evidence of %s", c.name, len(output), wire.EscapedLen(output), got, extID)
				}
				if !strings.HasPrefix(out, "captured: "+result+" (evidence: response-oversized)\n") {
					t.Errorf("%s: one more: start printed %q", c.name, out)
				}
				f.ok("procevent", "retire", id, "--if-owner", tok)
				continue
			}
			if want := "captured: " + result + "\nsilenced: " + id + " 1\nretired: " + id + " (terminal)\n"; out != want {
				t.Fatalf("%s: start printed %q, want %q", c.name, out, want)
			}
			if got := f.read(result); got != output {
				t.Fatalf("%s: captured %d bytes, want the %d-byte output", c.name, len(got), len(output))
			}
			if len(f.wakes()) != wakes {
				t.Errorf("%s: a silent result was announced", c.name)
			}
			if got := f.ok("procevent", "classify", result); got != "carried\n" {
				t.Errorf("%s: classify printed %q", c.name, got)
			}
			for _, op := range []string{"classify", "terminal", "silent"} {
				if !slices.ContainsFunc(f.log(op), func(l string) bool { return strings.HasPrefix(l, op+" "+id+" ") }) {
					t.Errorf("%s: no %s request reached the package", c.name, op)
				}
			}
		}
	}
}
