package reliability

import (
	"strings"
	"testing"
)

// The reference itself: each [JSON-1] rule it stands for refuses, and
// ordinary documents pass.
func TestStrictJSONReference(t *testing.T) {
	for _, ok := range []string{`{}`, ` [1,"a",{"b":null}] `, `{"a":{"a":1},"b":"\ud83d\ude00"}`, `"\\ud800"`, strings.Repeat("[", 32) + strings.Repeat("]", 32)} {
		if _, err := StrictJSON([]byte(ok), 32); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"\ufeff{}", "{\"a\":\"\xff\"}", `{} {}`, `{"a":1,"a":2}`, `{"a":{"b":1,"b":1}}`, `"\ud800"`, `"\udc00"`, `"\ud800x"`, `"\ud800\n"`, "\"a\x01\"", `NaN`, ``, strings.Repeat("[", 33) + strings.Repeat("]", 33)} {
		if _, err := StrictJSON([]byte(bad), 32); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
