package protocol_test

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/internal/reliability"
	"firstmate.dev/fm/internal/strictjson"
	"firstmate.dev/fm/pkg/adapter/wire"
)

const fuzzRID = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

func fuzzHandshakeRequest() *wire.HandshakeRequest {
	return &wire.HandshakeRequest{
		Schema: wire.HandshakeRequestSchema, RequestID: fuzzRID, HostProtocols: []int64{1},
		ExtensionID: "org.example.x", ExtensionVersion: "1.0.0",
		PackageDigest: "sha256:2222222222222222222222222222222222222222222222222222222222222222",
		Capability:    wire.HandshakeCapability{Name: wire.CapabilityName, Versions: []int64{1}, AdapterNames: []string{"a", "b"}},
	}
}

const fuzzHandshake = `{"adapter_names":["b","a"],"capability":"process-event-adapter","capability_version":1,"extension_id":"org.example.x","extension_version":"1.0.0","host_protocol":1,"request_id":"` + fuzzRID + `","schema":"firstmate.extension-handshake-response.v1"}`

// reference parses data with the independent strict reference and returns
// its top-level object, or nil.
func reference(data []byte) map[string]any {
	v, err := reliability.StrictJSON(data, strictjson.MaxDepth)
	if err != nil {
		return nil
	}
	m, _ := v.(map[string]any)
	return m
}

// keys reports whether m has exactly the names.
func keys(m map[string]any, names ...string) bool {
	if len(m) != len(names) {
		return false
	}
	for _, n := range names {
		if _, ok := m[n]; !ok {
			return false
		}
	}
	return true
}

// FuzzCheckHandshake: whatever bytes a package answers to a handshake, an
// accepted response is, by an independent reading, exactly the eight keys of
// [PROTO-2] with every identity equal to the request's, and a refusal is
// handshake-invalid or request-id-mismatch.
func FuzzCheckHandshake(f *testing.F) {
	r := strings.NewReplacer
	for _, s := range []string{
		fuzzHandshake,
		r(`"host_protocol":1`, `"host_protocol":1,"force":true`).Replace(fuzzHandshake),
		r(`"host_protocol":1`, `"host_protocol":1,"host_protocol":1`).Replace(fuzzHandshake),
		r(`1111`, `3333`).Replace(fuzzHandshake),
		r(`["b","a"]`, `["a","a"]`).Replace(fuzzHandshake),
		r(`["b","a"]`, `["a","b","c"]`).Replace(fuzzHandshake),
		r(`"host_protocol":1`, `"host_protocol":1.0`).Replace(fuzzHandshake),
		r(`"capability_version":1`, `"capability_version":2`).Replace(fuzzHandshake),
		r(`org.example.x`, `org.example.\u0078`).Replace(fuzzHandshake),
		"\ufeff" + fuzzHandshake, fuzzHandshake + fuzzHandshake, fuzzHandshake[:40],
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := fuzzHandshakeRequest()
		err := protocol.CheckHandshake(data, req)
		if err != nil {
			if c := errcode.Of(err); c != errcode.HandshakeInvalid && c != errcode.RequestIDMismatch {
				t.Fatalf("refused as %s: %v", c, err)
			}
			return
		}
		m := reference(data)
		if m == nil || !keys(m, "schema", "request_id", "extension_id", "extension_version", "host_protocol", "capability", "capability_version", "adapter_names") {
			t.Fatalf("accepted %q, which is not exactly the eight keys of a strict document", data)
		}
		var names []string
		for _, n := range m["adapter_names"].([]any) {
			names = append(names, n.(string))
		}
		slices.Sort(names)
		if m["schema"] != wire.HandshakeResponseSchema || m["request_id"] != req.RequestID || m["extension_id"] != req.ExtensionID ||
			m["extension_version"] != req.ExtensionVersion || m["host_protocol"] != json.Number("1") || m["capability"] != wire.CapabilityName ||
			m["capability_version"] != json.Number("1") || !slices.Equal(names, []string{"a", "b"}) {
			t.Fatalf("accepted %q, whose identities differ from the request", data)
		}
	})
}

var (
	tokenRe     = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*$`)
	sourceIDRe  = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$`)
	requestIDRe = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// FuzzCheckResponse: whatever bytes a package answers to an invoke of op,
// CheckResponse and DecodeResult accept only what an independent reading
// finds to be exactly [PROTO-4] and the operation's result of §9 within its
// bounds; a package failure becomes extension-<code> and its diagnostic
// never appears in the error; anything else is response-invalid or
// request-id-mismatch.
func FuzzCheckResponse(f *testing.F) {
	ok := func(result string) string {
		return `{"error":null,"ok":true,"request_id":"` + fuzzRID + `","result":` + result + `,"schema":"firstmate.extension-response.v1"}`
	}
	fail := func(code, diag string) string {
		return `{"error":{"code":"` + code + `","diagnostic":"` + diag + `","retryable":true},"ok":false,"request_id":"` + fuzzRID + `","result":null,"schema":"firstmate.extension-response.v1"}`
	}
	for i, s := range []string{
		ok(`{"output":"hi","status":"result"}`), ok(`{"classification":"file-signal"}`), ok(`{"value":true}`), ok(`{"value":false}`),
		ok(`{"output":"","status":"no-result"}`), ok(`{"output":"x","status":"no-result"}`), ok(`{"output":"","status":"result"}`),
		ok(`{"output":"x","path":"/etc/passwd","status":"result"}`), ok(`{"classification":"File"}`), ok(`null`), ok(`{"value":"true"}`),
		ok(`{"output":"` + strings.Repeat("a", wire.MaxOutputBytes+1) + `","status":"result"}`), ok(`{"output":"\ud800","status":"result"}`),
		fail("unavailable", "SECRET-DIAGNOSTIC"), fail("internal", "d"), fail("teapot", "d"), fail("conflict", ""), fail("conflict", `a\nb`),
		fail("conflict", strings.Repeat("d", 513)), "\ufeff" + ok(`{"value":true}`), ok(`{"value":true}`) + ok(`{"value":true}`),
		strings.Replace(ok(`{"value":true}`), "1111", "2222", 1), strings.Replace(ok(`{"value":true}`), `"error":null`, `"error":null,"error":null`, 1),
	} {
		f.Add([]byte(s), uint8(i))
	}
	f.Fuzz(func(t *testing.T, data []byte, opIndex uint8) {
		op := wire.Operations[int(opIndex)%len(wire.Operations)]
		raw, err := protocol.CheckResponse(data, fuzzRID)
		m := reference(data)
		if err != nil {
			code := errcode.Of(err)
			if !strings.HasPrefix(string(code), "extension-") {
				if code != errcode.ResponseInvalid && code != errcode.RequestIDMismatch && code != errcode.ResponseOversized {
					t.Fatalf("refused as %s: %v", code, err)
				}
				return
			}
			e, _ := m["error"].(map[string]any)
			diag, _ := e["diagnostic"].(string)
			if m == nil || !keys(m, "schema", "request_id", "ok", "result", "error") || m["ok"] != false || m["result"] != nil ||
				!keys(e, "code", "retryable", "diagnostic") || "extension-"+e["code"].(string) != string(code) ||
				!wire.Code(e["code"].(string)).Valid() || !validDiagnostic(diag) {
				t.Fatalf("%s from %q, which is not a valid ok=false response", code, data)
			}
			if len(diag) >= 8 && strings.Contains(err.Error(), diag) {
				t.Fatalf("the diagnostic %q leaked into %v", diag, err)
			}
			return
		}
		if m == nil || !keys(m, "schema", "request_id", "ok", "result", "error") || m["schema"] != wire.ResponseSchema ||
			m["request_id"] != fuzzRID || m["ok"] != true || m["error"] != nil {
			t.Fatalf("accepted %q, which is not a valid ok=true response", data)
		}
		result, isObject := m["result"].(map[string]any)
		if !isObject {
			t.Fatalf("accepted %q, whose result is not an object", data)
		}
		v, err := protocol.DecodeResult(op, raw)
		if err != nil {
			return
		}
		var good bool
		switch v := v.(type) {
		case *wire.PollResult:
			good = op == wire.OpPoll && keys(result, "status", "output") &&
				(v.Status == "result" && len(v.Output) >= 1 && len(v.Output) <= wire.MaxOutputBytes && utf8.ValidString(v.Output) && escaped(v.Output) <= wire.MaxEscapedOutputBytes ||
					v.Status == "no-result" && v.Output == "") && result["output"] == v.Output && result["status"] == v.Status
		case *wire.ClassifyResult:
			good = op == wire.OpClassify && keys(result, "classification") && len(v.Classification) <= wire.MaxClassificationBytes &&
				tokenRe.MatchString(v.Classification) && result["classification"] == v.Classification
		case *wire.BoolResult:
			good = (op == wire.OpTerminal || op == wire.OpSilent) && keys(result, "value") && result["value"] == v.Value
		}
		if !good {
			t.Fatalf("%s accepted %q as %#v", op, data, v)
		}
	})
}

// validDiagnostic is [PROTO-4]'s rule: 1..512 bytes, no control character.
func validDiagnostic(s string) bool {
	return len(s) >= 1 && len(s) <= wire.MaxDiagnosticBytes && utf8.ValidString(s) && !strings.ContainsFunc(s, control)
}

// control is the contract's control character: C0, DEL or C1.
func control(r rune) bool { return r < 0x20 || r >= 0x7f && r <= 0x9f }

// FuzzInputs checks the hand-written identifier rules against the
// contract's own statement of them ([OP-1], [PROTO-5]): source ids and
// request ids against their regular expressions, config refs against
// "one line, 1..512 bytes, no control characters", and that a derived poll
// request id is always a request id ([RID-1]).
func FuzzInputs(f *testing.F) {
	for _, s := range []string{"a", ".a", "a.b-c_D9", strings.Repeat("x", 64), strings.Repeat("x", 65), "a/b", "é", "a\nb", "file:/tmp/x",
		"a\u0085b", "a\x7fb", strings.Repeat("é", 256), strings.Repeat("é", 257), "sha256:" + strings.Repeat("a", 64), "sha256:" + strings.Repeat("A", 64), "\xff"} {
		f.Add(s, int64(len(s)))
	}
	f.Fuzz(func(t *testing.T, s string, seq int64) {
		if got, want := protocol.CheckSourceID(s) == nil, sourceIDRe.MatchString(s); got != want {
			t.Fatalf("CheckSourceID(%q) accepts=%v, the contract says %v", s, got, want)
		}
		if got, want := protocol.CheckRequestID(s) == nil, requestIDRe.MatchString(s); got != want {
			t.Fatalf("CheckRequestID(%q) accepts=%v, the contract says %v", s, got, want)
		}
		want := len(s) >= 1 && len(s) <= wire.MaxConfigRefBytes && utf8.ValidString(s) && !strings.ContainsFunc(s, control)
		if got := protocol.CheckConfigRef(s) == nil; got != want {
			t.Fatalf("CheckConfigRef(%q) accepts=%v, the contract says %v", s, got, want)
		}
		if id := protocol.PollRequestID("a", s, seq, s, s); !requestIDRe.MatchString(id) {
			t.Fatalf("PollRequestID gave %q", id)
		}
	})
}

// escaped is the size of s inside a canonical JSON string, measured by the
// encoder itself: the oracle of wire.EscapedLen.
func escaped(s string) int {
	b, err := strictjson.Canonical(s)
	if err != nil {
		panic(err)
	}
	return len(b) - 2
}
