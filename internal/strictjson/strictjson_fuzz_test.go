package strictjson_test

import (
	"strings"
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/reliability"
	"firstmate.dev/fm/internal/strictjson"
)

// FuzzCheckSyntax compares the syntax half of [JSON-1] with an independent
// reference on encoding/json (reliability.StrictJSON), in both directions:
// CheckSyntax accepts exactly the documents the reference accepts, and
// refuses the others as json-invalid.
func FuzzCheckSyntax(f *testing.F) {
	for _, s := range []string{
		`{"schema":"s","n":[1,2.5,-0,1e3],"o":{"a":null,"b":true}}`,
		"\ufeff{}", `{"a":1,"a":2}`, `{"a":{"b":1},"b":{"b":1}}`, `{} {}`, `{}` + "\n\t ", `{"a":"\ud800"}`,
		`{"a":"\ud83d\ude00"}`, `{"a":"\udc00\ud800"}`, "{\"a\":\"\x01\"}", "{\"a\":\"\xc3\x28\"}", `[NaN]`, `[Infinity]`,
		`[1.]`, `[01]`, `{"a" 1}`, `{"a":1,}`, `[1,]`, `"\x"`, strings.Repeat("[", 32) + strings.Repeat("]", 32),
		strings.Repeat("[", 33) + strings.Repeat("]", 33), `{"\u0000":"\u0000"}`, `{"a":"\\ud800"}`, ``, ` `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := strictjson.CheckSyntax(data, "fuzz")
		_, ref := reliability.StrictJSON(data, strictjson.MaxDepth)
		switch {
		case err == nil && ref != nil:
			t.Fatalf("CheckSyntax accepts %q; the reference refuses it: %v", data, ref)
		case err != nil && ref == nil:
			t.Fatalf("CheckSyntax refuses %q (%v); the reference accepts it", data, err)
		case err != nil && errcode.Of(err) != errcode.JSONInvalid:
			t.Fatalf("refused as %s, not json-invalid: %v", errcode.Of(err), err)
		}
	})
}
