package adapter_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"firstmate.dev/fm/pkg/adapter"
	"firstmate.dev/fm/pkg/adapter/adaptertest"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// fake is a Handler whose behaviour each test sets.
type fake struct {
	id       adapter.Identity
	poll     func(ctx context.Context, call *adapter.Call, in adapter.PollInput) (adapter.PollResult, error)
	classify func(ctx context.Context, call *adapter.Call, in adapter.ResultInput) (adapter.ClassifyResult, error)
	terminal func(ctx context.Context, call *adapter.Call, in adapter.ResultInput) (adapter.BoolResult, error)
	silent   func(ctx context.Context, call *adapter.Call, in adapter.ResultInput) (adapter.BoolResult, error)
	calls    []string // operations called, in order
	lastCall *adapter.Call
}

func newFake() *fake {
	return &fake{id: adapter.Identity{
		ExtensionID:      "org.example.fake",
		ExtensionVersion: "1.2.3-rc.1+build.5",
		AdapterNames:     []string{"alpha", "beta-2", "gamma"},
	}}
}

func (f *fake) Identity() adapter.Identity { return f.id }

func (f *fake) Poll(ctx context.Context, call *adapter.Call, in adapter.PollInput) (adapter.PollResult, error) {
	f.calls = append(f.calls, wire.OpPoll)
	f.lastCall = call
	if f.poll != nil {
		return f.poll(ctx, call, in)
	}
	return adapter.Output("poll " + in.SourceID + " " + in.ConfigRef), nil
}

func (f *fake) Classify(ctx context.Context, call *adapter.Call, in adapter.ResultInput) (adapter.ClassifyResult, error) {
	f.calls = append(f.calls, wire.OpClassify)
	f.lastCall = call
	if f.classify != nil {
		return f.classify(ctx, call, in)
	}
	return adapter.ClassifyResult{Classification: "fake.kind"}, nil
}

func (f *fake) Terminal(ctx context.Context, call *adapter.Call, in adapter.ResultInput) (adapter.BoolResult, error) {
	f.calls = append(f.calls, wire.OpTerminal)
	f.lastCall = call
	if f.terminal != nil {
		return f.terminal(ctx, call, in)
	}
	return adapter.BoolResult{Value: true}, nil
}

func (f *fake) Silent(ctx context.Context, call *adapter.Call, in adapter.ResultInput) (adapter.BoolResult, error) {
	f.calls = append(f.calls, wire.OpSilent)
	f.lastCall = call
	if f.silent != nil {
		return f.silent(ctx, call, in)
	}
	return adapter.BoolResult{Value: false}, nil
}

var (
	pollIn   = adapter.PollInput{SourceID: "src-1", ConfigRef: "main"}
	resultIn = adapter.ResultInput{SourceID: "src-1", Sequence: 7, Content: "hello\n"}
)

// encode returns the canonical JSON of v.
func encode(t *testing.T, v any) []byte {
	t.Helper()
	b, err := wire.Canonical(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// [EX-2] the SDK's Serve: verb dispatch, strict stdin, bounds, error codes.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{"prog"},
		{"prog", ""},
		{"prog", "poll"},
		{"prog", "HANDSHAKE"},
		{"prog", "--help"},
		{"prog", "invoke", "extra"},
		{},
	} {
		var stdout, stderr bytes.Buffer
		code := adapter.Run(args, strings.NewReader("{}"), &stdout, &stderr, newFake())
		if code != adapter.ExitUsage || stdout.Len() != 0 || !strings.Contains(stderr.String(), "usage:") {
			t.Errorf("args %q: exit %d, stdout %q, stderr %q; want exit 2, usage on stderr only", args, code, stdout.String(), stderr.String())
		}
	}
}

func TestInvalidIdentityRefusesEverything(t *testing.T) {
	for _, id := range []adapter.Identity{
		{ExtensionID: "Org.Bad", ExtensionVersion: "1.0.0", AdapterNames: []string{"a"}},
		{ExtensionID: "org.ok", ExtensionVersion: "v1.0.0", AdapterNames: []string{"a"}},
		{ExtensionID: "org.ok", ExtensionVersion: "01.0.0", AdapterNames: []string{"a"}},
		{ExtensionID: "org.ok", ExtensionVersion: "1.0.0"},
		{ExtensionID: "org.ok", ExtensionVersion: "1.0.0", AdapterNames: []string{"a", "a"}},
		{ExtensionID: "org.ok", ExtensionVersion: "1.0.0", AdapterNames: []string{"under_score"}},
	} {
		f := newFake()
		f.id = id
		for _, verb := range []string{"handshake", "invoke"} {
			var stdout, stderr bytes.Buffer
			code := adapter.Run([]string{"p", verb}, strings.NewReader("{}"), &stdout, &stderr, f)
			if code != adapter.ExitFailure || stdout.Len() != 0 || stderr.Len() == 0 {
				t.Errorf("identity %+v %s: exit %d stdout %q", id, verb, code, stdout.String())
			}
		}
	}
}

func TestHandshakeAnswersRequestedSubset(t *testing.T) {
	h := adaptertest.New(t, newFake())
	for _, names := range [][]string{
		{"alpha", "beta-2", "gamma"},
		{"gamma", "alpha"},
		{"beta-2"},
	} {
		req := h.HandshakeRequest(names...)
		resp, _ := h.Handshake(req)
		if resp == nil {
			t.Fatalf("subset %v refused", names)
		}
		want := wire.HandshakeResponse{
			Schema:            wire.HandshakeResponseSchema,
			RequestID:         req.RequestID,
			ExtensionID:       "org.example.fake",
			ExtensionVersion:  "1.2.3-rc.1+build.5",
			HostProtocol:      1,
			Capability:        "process-event-adapter",
			CapabilityVersion: 1,
			AdapterNames:      names,
		}
		if fmt.Sprint(*resp) != fmt.Sprint(want) {
			t.Errorf("subset %v: got %+v, want %+v", names, *resp, want)
		}
	}
}

func TestHandshakeRefusals(t *testing.T) {
	h := adaptertest.New(t, newFake())
	cases := map[string]func(r *wire.HandshakeRequest){
		"adapter not declared":             func(r *wire.HandshakeRequest) { r.Capability.AdapterNames = []string{"alpha", "delta"} },
		"empty subset":                     func(r *wire.HandshakeRequest) { r.Capability.AdapterNames = []string{} },
		"duplicate adapter":                func(r *wire.HandshakeRequest) { r.Capability.AdapterNames = []string{"alpha", "alpha"} },
		"invalid adapter name":             func(r *wire.HandshakeRequest) { r.Capability.AdapterNames = []string{"Alpha"} },
		"host protocol 1 not offered":      func(r *wire.HandshakeRequest) { r.HostProtocols = []int64{2} },
		"host protocols empty":             func(r *wire.HandshakeRequest) { r.HostProtocols = []int64{} },
		"host protocol duplicate":          func(r *wire.HandshakeRequest) { r.HostProtocols = []int64{1, 1} },
		"host protocol zero":               func(r *wire.HandshakeRequest) { r.HostProtocols = []int64{0, 1} },
		"capability version 1 not offered": func(r *wire.HandshakeRequest) { r.Capability.Versions = []int64{2} },
		"other capability":                 func(r *wire.HandshakeRequest) { r.Capability.Name = "lifecycle-sink" },
		"other extension id":               func(r *wire.HandshakeRequest) { r.ExtensionID = "org.example.other" },
		"other extension version":          func(r *wire.HandshakeRequest) { r.ExtensionVersion = "1.2.4" },
		"wrong schema":                     func(r *wire.HandshakeRequest) { r.Schema = wire.RequestSchema },
		"upper-case request id":            func(r *wire.HandshakeRequest) { r.RequestID = strings.ToUpper(r.RequestID) },
		"short request id":                 func(r *wire.HandshakeRequest) { r.RequestID = r.RequestID[:70] },
		"bad package digest":               func(r *wire.HandshakeRequest) { r.PackageDigest = "sha256:xyz" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			req := h.HandshakeRequest()
			mutate(req)
			resp, out := h.Handshake(req)
			if resp != nil || out.Exit != adapter.ExitFailure {
				t.Fatalf("accepted (exit %d): %+v", out.Exit, resp)
			}
			if !strings.Contains(string(out.Stderr), "handshake refused") {
				t.Errorf("stderr %q does not log the refusal", out.Stderr)
			}
		})
	}
}

func TestHandshakeAcceptsFutureOffers(t *testing.T) {
	h := adaptertest.New(t, newFake())
	req := h.HandshakeRequest("alpha")
	req.HostProtocols = []int64{2, 1}
	req.Capability.Versions = []int64{3, 1}
	resp, out := h.Handshake(req)
	if resp == nil {
		t.Fatalf("refused: %s", out.Stderr)
	}
	if resp.HostProtocol != 1 || resp.CapabilityVersion != 1 {
		t.Fatalf("answered %d/%d, want 1/1", resp.HostProtocol, resp.CapabilityVersion)
	}
}

// validHandshake and validInvoke are hand-written valid envelopes; the
// malformed cases below are edits of them.
const (
	rid             = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	digest          = "sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	validHandshake  = `{"schema":"firstmate.extension-handshake-request.v1","request_id":"` + rid + `","host_protocols":[1],"extension_id":"org.example.fake","extension_version":"1.2.3-rc.1+build.5","package_digest":"` + digest + `","capability":{"name":"process-event-adapter","versions":[1],"adapter_names":["alpha"]}}`
	validInvokeHead = `{"schema":"firstmate.extension-request.v1","request_id":"` + rid + `","host_protocol":1,"extension_id":"org.example.fake","extension_version":"1.2.3-rc.1+build.5","package_digest":"` + digest + `","capability":"process-event-adapter","capability_version":1,"adapter":"alpha","operation":"source.poll",`
	validInvoke     = validInvokeHead + `"input":{"source_id":"src-1","config_ref":"main"}}`
)

func TestValidRawEnvelopes(t *testing.T) {
	h := adaptertest.New(t, newFake())
	if out := h.Raw("handshake", []byte(validHandshake)); out.Exit != 0 {
		t.Fatalf("valid handshake refused: %s", out.Stderr)
	}
	resp, _ := h.InvokeRaw(rid, []byte(validInvoke))
	if !resp.OK {
		t.Fatalf("valid invoke failed: %+v", resp.Error)
	}
	// JSON whitespace around the document is allowed.
	resp, _ = h.InvokeRaw(rid, []byte(" \n\t"+validInvoke+"\r\n "))
	if !resp.OK {
		t.Fatalf("valid invoke with whitespace failed: %+v", resp.Error)
	}
}

// Malformed stdin that hides the request id (or is not JSON at all): nothing
// on stdout, non-zero exit, for both verbs.
// [EX-2] the SDK's Serve: verb dispatch, strict stdin, bounds, error codes.
func TestMalformedStdinUnanswerable(t *testing.T) {
	big := validInvoke + strings.Repeat(" ", wire.MaxEnvelopeBytes-len(validInvoke)+1)
	cases := map[string]string{
		"empty":                 "",
		"whitespace only":       " \n",
		"broken json":           validInvoke[:len(validInvoke)-1],
		"byte-order mark":       "\xEF\xBB\xBF" + validInvoke,
		"duplicate key":         strings.Replace(validInvoke, `"adapter":"alpha"`, `"adapter":"alpha","adapter":"alpha"`, 1),
		"nested duplicate key":  strings.Replace(validInvoke, `"source_id":"src-1"`, `"source_id":"src-1","source_id":"src-1"`, 1),
		"invalid utf-8":         strings.Replace(validInvoke, `"main"`, "\"ma\xffin\"", 1),
		"two documents":         validInvoke + validInvoke,
		"two documents spaced":  validInvoke + "\n{}",
		"trailing junk":         validInvoke + "x",
		"unescaped control":     strings.Replace(validInvoke, `"main"`, "\"ma\x01in\"", 1),
		"lone surrogate":        strings.Replace(validInvoke, `"main"`, `"ma\ud800in"`, 1),
		"nan":                   strings.Replace(validInvoke, `"host_protocol":1`, `"host_protocol":NaN`, 1),
		"oversize":              big,
		"deep nesting":          strings.Replace(validInvoke, `"main"`, strings.Repeat("[", 40)+strings.Repeat("]", 40), 1),
		"not an object":         `["` + rid + `"]`,
		"missing request id":    strings.Replace(validInvoke, `"request_id":"`+rid+`",`, "", 1),
		"malformed request id":  strings.Replace(validInvoke, rid, strings.ToUpper(rid), 1),
		"request id not string": strings.Replace(validInvoke, `"`+rid+`"`, "7", 1),
	}
	for name, stdin := range cases {
		for _, verb := range []string{"invoke", "handshake"} {
			t.Run(verb+"/"+name, func(t *testing.T) {
				f := newFake()
				out := adaptertest.New(t, f).Raw(verb, []byte(stdin))
				if out.Exit != adapter.ExitFailure || len(out.Stdout) != 0 {
					t.Fatalf("exit %d, stdout %q; want exit 1 and nothing on stdout", out.Exit, out.Stdout)
				}
				if len(out.Stderr) == 0 || len(out.Stderr) > adapter.LogBudget {
					t.Errorf("stderr has %d bytes, want a bounded log line", len(out.Stderr))
				}
				if len(f.calls) != 0 {
					t.Errorf("handler called: %v", f.calls)
				}
			})
		}
	}
}

// Well-formed JSON whose request id is readable but whose shape is wrong is
// answered with invalid-request (or incompatible), echoing the id.
func TestMalformedEnvelopeAnswered(t *testing.T) {
	cases := map[string]struct {
		stdin string
		code  adapter.Code
	}{
		"unknown key":           {strings.Replace(validInvoke, `"adapter":"alpha"`, `"adapter":"alpha","extra":1`, 1), adapter.InvalidRequest},
		"unknown input key":     {strings.Replace(validInvoke, `"config_ref":"main"`, `"config_ref":"main","path":"/x"`, 1), adapter.InvalidRequest},
		"wrong-case key":        {strings.Replace(validInvoke, `"adapter":`, `"Adapter":`, 1), adapter.InvalidRequest},
		"missing key":           {strings.Replace(validInvoke, `"adapter":"alpha",`, "", 1), adapter.InvalidRequest},
		"missing input key":     {strings.Replace(validInvoke, `,"config_ref":"main"`, "", 1), adapter.InvalidRequest},
		"null string":           {strings.Replace(validInvoke, `"adapter":"alpha"`, `"adapter":null`, 1), adapter.InvalidRequest},
		"null input":            {validInvokeHead + `"input":null}`, adapter.InvalidRequest},
		"input not object":      {validInvokeHead + `"input":"x"}`, adapter.InvalidRequest},
		"null integer":          {strings.Replace(validInvoke, `"host_protocol":1`, `"host_protocol":null`, 1), adapter.InvalidRequest},
		"float integer":         {strings.Replace(validInvoke, `"host_protocol":1`, `"host_protocol":1.0`, 1), adapter.InvalidRequest},
		"exponent integer":      {strings.Replace(validInvoke, `"capability_version":1`, `"capability_version":1e0`, 1), adapter.InvalidRequest},
		"string integer":        {strings.Replace(validInvoke, `"host_protocol":1`, `"host_protocol":"1"`, 1), adapter.InvalidRequest},
		"wrong schema":          {strings.Replace(validInvoke, "extension-request.v1", "extension-request.v2", 1), adapter.Incompatible},
		"host protocol 2":       {strings.Replace(validInvoke, `"host_protocol":1`, `"host_protocol":2`, 1), adapter.Incompatible},
		"capability version 2":  {strings.Replace(validInvoke, `"capability_version":1`, `"capability_version":2`, 1), adapter.Incompatible},
		"other capability":      {strings.Replace(validInvoke, `"capability":"process-event-adapter"`, `"capability":"sink"`, 1), adapter.Incompatible},
		"unknown operation":     {strings.Replace(validInvoke, `"source.poll"`, `"source.push"`, 1), adapter.Incompatible},
		"undeclared adapter":    {strings.Replace(validInvoke, `"adapter":"alpha"`, `"adapter":"delta"`, 1), adapter.Incompatible},
		"other extension":       {strings.Replace(validInvoke, `"org.example.fake"`, `"org.example.other"`, 1), adapter.Incompatible},
		"other version":         {strings.Replace(validInvoke, `"1.2.3-rc.1+build.5"`, `"1.2.3"`, 1), adapter.Incompatible},
		"bad package digest":    {strings.Replace(validInvoke, digest, "sha256:00", 1), adapter.InvalidRequest},
		"result input for poll": {validInvokeHead + `"input":{"source_id":"s","sequence":1,"content":"x"}}`, adapter.InvalidRequest},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFake()
			resp, _ := adaptertest.New(t, f).InvokeRaw(rid, []byte(c.stdin))
			if resp.OK || resp.Error.Code != c.code || resp.Error.Retryable {
				t.Fatalf("got ok=%v error %+v, want %s not retryable", resp.OK, resp.Error, c.code)
			}
			if len(f.calls) != 0 {
				t.Errorf("handler called: %v", f.calls)
			}
		})
	}
}

func TestEnvelopeBoundExact(t *testing.T) {
	h := adaptertest.New(t, newFake())
	exact := validInvoke + strings.Repeat(" ", wire.MaxEnvelopeBytes-len(validInvoke))
	resp, _ := h.InvokeRaw(rid, []byte(exact))
	if !resp.OK {
		t.Fatalf("a request of exactly %d bytes failed: %+v", wire.MaxEnvelopeBytes, resp.Error)
	}
	if out := h.Raw("invoke", []byte(exact+" ")); out.Exit != adapter.ExitFailure || len(out.Stdout) != 0 {
		t.Fatalf("a request of %d bytes was answered", wire.MaxEnvelopeBytes+1)
	}
}

func TestInputValidation(t *testing.T) {
	cases := map[string]struct {
		op string
		in any
		ok bool
	}{
		"source id dot":           {wire.OpPoll, adapter.PollInput{SourceID: ".hidden", ConfigRef: "x"}, false},
		"source id slash":         {wire.OpPoll, adapter.PollInput{SourceID: "a/b", ConfigRef: "x"}, false},
		"source id empty":         {wire.OpPoll, adapter.PollInput{SourceID: "", ConfigRef: "x"}, false},
		"source id 64":            {wire.OpPoll, adapter.PollInput{SourceID: strings.Repeat("a", 64), ConfigRef: "x"}, true},
		"source id 65":            {wire.OpPoll, adapter.PollInput{SourceID: strings.Repeat("a", 65), ConfigRef: "x"}, false},
		"source id chars":         {wire.OpPoll, adapter.PollInput{SourceID: "A-z_0.9", ConfigRef: "x"}, true},
		"config ref empty":        {wire.OpPoll, adapter.PollInput{SourceID: "s", ConfigRef: ""}, false},
		"config ref 512":          {wire.OpPoll, adapter.PollInput{SourceID: "s", ConfigRef: strings.Repeat("é", 256)}, true},
		"config ref 513":          {wire.OpPoll, adapter.PollInput{SourceID: "s", ConfigRef: strings.Repeat("x", 513)}, false},
		"config ref newline":      {wire.OpPoll, adapter.PollInput{SourceID: "s", ConfigRef: "a\nb"}, false},
		"config ref tab":          {wire.OpPoll, adapter.PollInput{SourceID: "s", ConfigRef: "a\tb"}, false},
		"config ref c1 control":   {wire.OpPoll, adapter.PollInput{SourceID: "s", ConfigRef: "a\u0085b"}, false},
		"config ref del":          {wire.OpPoll, adapter.PollInput{SourceID: "s", ConfigRef: "a\x7fb"}, false},
		"sequence zero":           {wire.OpClassify, adapter.ResultInput{SourceID: "s", Sequence: 0, Content: "x"}, false},
		"sequence negative":       {wire.OpTerminal, adapter.ResultInput{SourceID: "s", Sequence: -1, Content: "x"}, false},
		"content exactly bound":   {wire.OpSilent, adapter.ResultInput{SourceID: "s", Sequence: 1, Content: strings.Repeat("x", 32768)}, true},
		"content over bound":      {wire.OpSilent, adapter.ResultInput{SourceID: "s", Sequence: 1, Content: strings.Repeat("x", 32769)}, false},
		"poll input for classify": {wire.OpClassify, adapter.PollInput{SourceID: "s", ConfigRef: "x"}, false},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFake()
			h := adaptertest.New(t, f)
			resp, _ := h.Invoke(h.Request("alpha", c.op, c.in))
			if resp.OK != c.ok {
				t.Fatalf("ok=%v (%+v), want %v", resp.OK, resp.Error, c.ok)
			}
			if !c.ok && (resp.Error.Code != adapter.InvalidRequest || len(f.calls) != 0) {
				t.Fatalf("error %+v, calls %v; want invalid-request before the handler", resp.Error, f.calls)
			}
		})
	}
}

// [EX-2] the SDK's Serve: verb dispatch, strict stdin, bounds, error codes.
func TestOperationsRouteToHandler(t *testing.T) {
	f := newFake()
	h := adaptertest.New(t, f)

	id := adaptertest.NewRequestID()
	res, fail := h.PollID(id, "beta-2", pollIn)
	if fail != nil || res != adapter.Output("poll src-1 main") {
		t.Fatalf("poll: %+v %+v", res, fail)
	}
	c := f.lastCall
	if c.RequestID != id || c.Adapter != "beta-2" || c.Operation != wire.OpPoll ||
		c.ExtensionID != "org.example.fake" || c.ExtensionVersion != "1.2.3-rc.1+build.5" ||
		c.PackageDigest != h.PackageDigest || c.Env != h.Env || c.Env.StateDir == "" {
		t.Fatalf("call %+v", *c)
	}

	cl, fail := h.Classify("alpha", resultIn)
	if fail != nil || cl.Classification != "fake.kind" {
		t.Fatalf("classify: %+v %+v", cl, fail)
	}
	term, fail := h.Terminal("gamma", resultIn)
	if fail != nil || !term {
		t.Fatalf("terminal: %v %+v", term, fail)
	}
	sil, fail := h.Silent("gamma", resultIn)
	if fail != nil || sil {
		t.Fatalf("silent: %v %+v", sil, fail)
	}
	want := []string{wire.OpPoll, wire.OpClassify, wire.OpTerminal, wire.OpSilent}
	if fmt.Sprint(f.calls) != fmt.Sprint(want) {
		t.Fatalf("calls %v, want %v", f.calls, want)
	}

	f.poll = func(context.Context, *adapter.Call, adapter.PollInput) (adapter.PollResult, error) {
		return adapter.NoResult(), nil
	}
	if res, fail := h.Poll("alpha", pollIn); fail != nil || res != (adapter.PollResult{Status: "no-result", Output: ""}) {
		t.Fatalf("no-result poll: %+v %+v", res, fail)
	}
	f.terminal = func(_ context.Context, _ *adapter.Call, in adapter.ResultInput) (adapter.BoolResult, error) {
		return adapter.BoolResult{Value: in.Sequence == 7 && in.Content == "hello\n"}, nil
	}
	if v, _ := h.Terminal("alpha", resultIn); !v {
		t.Fatal("terminal did not receive the input")
	}
}

func TestRequestIDEchoAndCanonicalOutput(t *testing.T) {
	f := newFake()
	h := adaptertest.New(t, f)
	for _, mk := range []func() *wire.Request{
		func() *wire.Request { return h.Request("alpha", wire.OpPoll, pollIn) },
		func() *wire.Request { return h.Request("alpha", wire.OpClassify, resultIn) },
		func() *wire.Request { return h.Request("nope", wire.OpClassify, resultIn) }, // ok=false
	} {
		req := mk()
		resp, out := h.Invoke(req)
		if resp.RequestID != req.RequestID {
			t.Fatalf("request id %s not echoed: %s", req.RequestID, resp.RequestID)
		}
		if bytes.HasSuffix(out.Stdout, []byte("\n")) || out.Stdout[0] != '{' {
			t.Fatalf("stdout is not one bare canonical document: %q", out.Stdout)
		}
		if len(out.Stderr) != 0 {
			t.Fatalf("unexpected stderr: %q", out.Stderr)
		}
	}
	// Exact bytes of a canonical error response.
	req := h.Request("nope", wire.OpClassify, resultIn)
	_, out := h.Invoke(req)
	want := `{"error":{"code":"incompatible","diagnostic":"request: adapter \"nope\" is not provided by this package","retryable":false},"ok":false,"request_id":"` + req.RequestID + `","result":null,"schema":"firstmate.extension-response.v1"}`
	if string(out.Stdout) != want {
		t.Fatalf("stdout\n%s\nwant\n%s", out.Stdout, want)
	}
	req = h.Request("alpha", wire.OpTerminal, resultIn)
	_, out = h.Invoke(req)
	want = `{"error":null,"ok":true,"request_id":"` + req.RequestID + `","result":{"value":true},"schema":"firstmate.extension-response.v1"}`
	if string(out.Stdout) != want {
		t.Fatalf("stdout\n%s\nwant\n%s", out.Stdout, want)
	}
}

func TestPollResultBounds(t *testing.T) {
	cases := map[string]struct {
		res adapter.PollResult
		ok  bool
	}{
		"one byte":        {adapter.Output("x"), true},
		"exactly 32768":   {adapter.Output(strings.Repeat("x", 32768)), true},
		"32768 multibyte": {adapter.Output(strings.Repeat("€", 32768/3) + "xx"), true},
		"32769":           {adapter.Output(strings.Repeat("x", 32769)), false},
		// [INV-4] [OP-1] the escaped bound, so that verdict requests carry it
		"quotes at the escaped bound":        {adapter.Output(strings.Repeat(`"`, wire.MaxEscapedOutputBytes/2)), true},
		"one quote beyond the escaped bound": {adapter.Output(strings.Repeat(`"`, wire.MaxEscapedOutputBytes/2+1)), false},
		"controls at the escaped bound":      {adapter.Output(strings.Repeat("\x1b", wire.MaxEscapedOutputBytes/6)), true},
		"one control beyond":                 {adapter.Output(strings.Repeat("\x1b", wire.MaxEscapedOutputBytes/6+1)), false},
		"empty result":                       {adapter.Output(""), false},
		"invalid utf-8":                      {adapter.Output("a\xffb"), false},
		"no-result output":                   {adapter.PollResult{Status: "no-result", Output: "x"}, false},
		"unknown status":                     {adapter.PollResult{Status: "maybe", Output: "x"}, false},
		"zero value":                         {adapter.PollResult{}, false},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFake()
			f.poll = func(context.Context, *adapter.Call, adapter.PollInput) (adapter.PollResult, error) { return c.res, nil }
			res, fail := adaptertest.New(t, f).Poll("alpha", pollIn)
			if c.ok != (fail == nil) {
				t.Fatalf("fail %+v, want ok=%v", fail, c.ok)
			}
			if c.ok && res != c.res {
				t.Fatalf("result changed in transit")
			}
			if !c.ok && (fail.Code != adapter.Internal || fail.Retryable) {
				t.Fatalf("fail %+v, want internal not retryable", fail)
			}
		})
	}
}

// A valid output whose escaped form pushes the response over 65,536 bytes is
// answered with an internal error, never with an oversize document.
// [EX-2] the SDK's Serve: verb dispatch, strict stdin, bounds, error codes.
func TestOversizeResponseBecomesInternal(t *testing.T) {
	for name, output := range map[string]string{
		"control characters": strings.Repeat("\x01", 32768), // each escapes to \u0001
		"quotes":             strings.Repeat(`"`, 32768),    // each escapes to \"
	} {
		t.Run(name, func(t *testing.T) {
			f := newFake()
			f.poll = func(context.Context, *adapter.Call, adapter.PollInput) (adapter.PollResult, error) {
				return adapter.Output(output), nil
			}
			h := adaptertest.New(t, f)
			resp, out := h.Invoke(h.Request("alpha", wire.OpPoll, pollIn))
			if resp.OK || resp.Error.Code != adapter.Internal || len(out.Stdout) > wire.MaxEnvelopeBytes {
				t.Fatalf("ok=%v error %+v, %d bytes", resp.OK, resp.Error, len(out.Stdout))
			}
		})
	}
	// Just under the bound passes.
	f := newFake()
	f.poll = func(context.Context, *adapter.Call, adapter.PollInput) (adapter.PollResult, error) {
		return adapter.Output(strings.Repeat("\n", 32000)), nil // 64,000 bytes escaped
	}
	if _, fail := adaptertest.New(t, f).Poll("alpha", pollIn); fail != nil {
		t.Fatalf("a response under the bound failed: %+v", fail)
	}
}

func TestClassificationRule(t *testing.T) {
	good := []string{"a", "file-signal", "dir.signal", "x_y", "a1.b2-c3_d4", "0", strings.Repeat("a", 64)}
	bad := []string{"", "A", "File", "a b", "-a", "a-", ".a", "a..b", "a-.b", "a/b", "é", "a\n", strings.Repeat("a", 65)}
	for _, s := range good {
		if !wire.ValidClassification(s) {
			t.Errorf("%q refused", s)
		}
	}
	for _, s := range bad {
		if wire.ValidClassification(s) {
			t.Errorf("%q accepted", s)
		}
	}
	for _, s := range append(good[:2], bad[:4]...) {
		f := newFake()
		f.classify = func(context.Context, *adapter.Call, adapter.ResultInput) (adapter.ClassifyResult, error) {
			return adapter.ClassifyResult{Classification: s}, nil
		}
		res, fail := adaptertest.New(t, f).Classify("alpha", resultIn)
		if wire.ValidClassification(s) != (fail == nil) || (fail == nil && res.Classification != s) {
			t.Errorf("classification %q: result %+v fail %+v", s, res, fail)
		}
		if fail != nil && fail.Code != adapter.Internal {
			t.Errorf("classification %q: code %s, want internal", s, fail.Code)
		}
	}
}

func TestHandlerErrors(t *testing.T) {
	cause := errors.New("disk on fire")
	cases := map[string]struct {
		err       error
		code      adapter.Code
		retryable bool
		diag      string
	}{
		"invalid-request": {adapter.Errorf(adapter.InvalidRequest, false, "config_ref %q is not dir:<abs>", "x"), adapter.InvalidRequest, false, `config_ref "x" is not dir:<abs>`},
		"incompatible":    {adapter.Errorf(adapter.Incompatible, false, "no"), adapter.Incompatible, false, "no"},
		"conflict":        {adapter.Errorf(adapter.Conflict, true, "busy"), adapter.Conflict, true, "busy"},
		"unavailable":     {adapter.Errorf(adapter.Unavailable, true, "wrapped: %w", cause), adapter.Unavailable, true, "wrapped: disk on fire"},
		"internal":        {adapter.Errorf(adapter.Internal, false, "bug"), adapter.Internal, false, "bug"},
		"wrapped *Error":  {fmt.Errorf("poll: %w", adapter.Errorf(adapter.Unavailable, true, "later")), adapter.Unavailable, true, "poll: unavailable: later"},
		"plain error":     {cause, adapter.Internal, false, "disk on fire"},
		"invalid code":    {adapter.Errorf("teapot", true, "short"), adapter.Internal, true, "short"},
		"canceled":        {fmt.Errorf("wait: %w", context.Canceled), adapter.Unavailable, true, "wait: context canceled"},
		"deadline":        {context.DeadlineExceeded, adapter.Unavailable, true, "context deadline exceeded"},
		"empty message":   {adapter.Errorf(adapter.Conflict, false, ""), adapter.Conflict, false, "conflict"},
		"control message": {errors.New("\x00\x1b[31m\n"), adapter.Internal, false, "[31m"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFake()
			f.silent = func(context.Context, *adapter.Call, adapter.ResultInput) (adapter.BoolResult, error) {
				return adapter.BoolResult{Value: true}, c.err
			}
			_, fail := adaptertest.New(t, f).Silent("alpha", resultIn)
			if fail == nil {
				t.Fatal("error answered as ok")
			}
			if fail.Code != c.code || fail.Retryable != c.retryable || fail.Diagnostic != c.diag {
				t.Fatalf("got %+v, want %s retryable=%v %q", *fail, c.code, c.retryable, c.diag)
			}
		})
	}
}

func TestHandlerPanicIsInternal(t *testing.T) {
	f := newFake()
	f.poll = func(context.Context, *adapter.Call, adapter.PollInput) (adapter.PollResult, error) {
		panic("boom\nline two")
	}
	_, fail := adaptertest.New(t, f).Poll("alpha", pollIn)
	if fail == nil || fail.Code != adapter.Internal || fail.Retryable || !strings.Contains(fail.Diagnostic, "panicked: boom line two") {
		t.Fatalf("got %+v", fail)
	}
}

// [EX-2] the SDK's Serve: verb dispatch, strict stdin, bounds, error codes.
func TestDiagnosticTruncation(t *testing.T) {
	cases := map[string]struct{ in, want string }{
		"plain":              {"hello", "hello"},
		"exactly 512":        {strings.Repeat("a", 512), strings.Repeat("a", 512)},
		"513":                {strings.Repeat("a", 513), strings.Repeat("a", 512)},
		"long":               {strings.Repeat("ab", 10000), strings.Repeat("ab", 256)},
		"rune boundary":      {strings.Repeat("a", 511) + "€", strings.Repeat("a", 511)},
		"4-byte rune":        {strings.Repeat("a", 510) + "😀", strings.Repeat("a", 510)},
		"controls":           {"a\x00b\x07c\x1bd\x7fe\u0085f\u009fg", "abcdefg"},
		"line breaks":        {"line1\nline2\r\n\tx", "line1 line2   x"},
		"trim":               {"  \n x \n ", "x"},
		"invalid utf-8":      {"a\xffb", "a\uFFFDb"},
		"only controls":      {"\x00\x01\n", "internal"},
		"empty":              {"", "internal"},
		"controls then long": {strings.Repeat("\x01", 600) + strings.Repeat("z", 600), strings.Repeat("z", 512)},
	}
	for name, c := range cases {
		got := adapter.Diagnostic(c.in, adapter.Internal)
		if got != c.want {
			t.Errorf("%s: got %q (%d bytes), want %q", name, got, len(got), c.want)
		}
		checkDiagnostic(t, got)
	}
	// Through the wire: a 100 KiB message with controls becomes a valid
	// 512-byte diagnostic.
	f := newFake()
	f.classify = func(context.Context, *adapter.Call, adapter.ResultInput) (adapter.ClassifyResult, error) {
		return adapter.ClassifyResult{}, adapter.Errorf(adapter.Unavailable, true, "%s", strings.Repeat("é\x01\n", 40000))
	}
	_, fail := adaptertest.New(t, f).Classify("alpha", resultIn)
	if fail == nil || len(fail.Diagnostic) > 512 || len(fail.Diagnostic) < 500 {
		t.Fatalf("got %+v", fail)
	}
	checkDiagnostic(t, fail.Diagnostic)
}

func checkDiagnostic(t *testing.T, d string) {
	t.Helper()
	if len(d) < 1 || len(d) > wire.MaxDiagnosticBytes || !utf8.ValidString(d) {
		t.Fatalf("diagnostic %q is not 1..512 bytes of utf-8", d)
	}
	for _, r := range d {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			t.Fatalf("diagnostic %q holds control character %U", d, r)
		}
	}
}

func FuzzDiagnostic(f *testing.F) {
	f.Add("hello\x00world", 3)
	f.Add(strings.Repeat("€", 300), 0)
	f.Fuzz(func(t *testing.T, msg string, code int) {
		codes := []adapter.Code{adapter.InvalidRequest, adapter.Incompatible, adapter.Conflict, adapter.Unavailable, adapter.Internal, "bogus"}
		c := codes[(code%len(codes)+len(codes))%len(codes)]
		checkDiagnostic(t, adapter.Diagnostic(msg, c))
	})
}

// FuzzInvoke: whatever arrives on stdin, the entrypoint either answers one
// valid response document within the bound, or writes nothing and fails.
func FuzzInvoke(f *testing.F) {
	f.Add([]byte(validInvoke))
	f.Add([]byte(validHandshake))
	f.Add([]byte(strings.Replace(validInvoke, `"main"`, `"ma\u0000in"`, 1)))
	f.Fuzz(func(t *testing.T, stdin []byte) {
		for _, verb := range []string{"invoke", "handshake"} {
			var stdout, stderr bytes.Buffer
			code := adapter.RunContext(context.Background(), adapter.Env{}, []string{"p", verb}, bytes.NewReader(stdin), &stdout, &stderr, newFake())
			if stderr.Len() > adapter.LogBudget {
				t.Fatalf("%s: %d bytes of stderr", verb, stderr.Len())
			}
			switch code {
			case adapter.ExitOK:
				if verb == "invoke" {
					id, _ := wire.PeekRequestID(stdin)
					if _, err := adaptertest.DecodeResponse(id, stdout.Bytes()); err != nil {
						t.Fatalf("invalid response: %v", err)
					}
				} else if req, err := wire.DecodeHandshakeRequest(stdin); err != nil {
					t.Fatalf("answered an invalid handshake request: %v", err)
				} else if _, err := adaptertest.DecodeHandshakeResponse(req, stdout.Bytes()); err != nil {
					t.Fatalf("invalid handshake response: %v", err)
				}
			case adapter.ExitFailure:
				if stdout.Len() != 0 {
					t.Fatalf("%s failed but wrote stdout", verb)
				}
			default:
				t.Fatalf("exit %d", code)
			}
		}
	})
}

func TestLogBudget(t *testing.T) {
	f := newFake()
	f.poll = func(_ context.Context, call *adapter.Call, _ adapter.PollInput) (adapter.PollResult, error) {
		for i := 0; i < 1000; i++ {
			call.Logf("line %d: %s", i, strings.Repeat("x\x1b", 50))
		}
		return adapter.NoResult(), nil
	}
	h := adaptertest.New(t, f)
	_, out := h.Invoke(h.Request("alpha", wire.OpPoll, pollIn))
	if len(out.Stderr) > adapter.LogBudget || len(out.Stderr) < adapter.LogBudget-200 {
		t.Fatalf("%d bytes of stderr, want about %d", len(out.Stderr), adapter.LogBudget)
	}
	if !bytes.HasSuffix(out.Stderr, []byte("[log truncated]\n")) || bytes.ContainsRune(out.Stderr, 0x1b) {
		t.Fatalf("stderr not truncated or not sanitized: %q", out.Stderr[len(out.Stderr)-40:])
	}
}

func TestContextReachesHandler(t *testing.T) {
	f := newFake()
	f.poll = func(ctx context.Context, _ *adapter.Call, _ adapter.PollInput) (adapter.PollResult, error) {
		<-ctx.Done()
		return adapter.PollResult{}, ctx.Err()
	}
	h := adaptertest.New(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h.Context = ctx
	_, fail := h.Poll("alpha", pollIn)
	if fail == nil || fail.Code != adapter.Unavailable || !fail.Retryable {
		t.Fatalf("got %+v", fail)
	}
}

func TestDecodeResponseStrict(t *testing.T) {
	ok := `{"error":null,"ok":true,"request_id":"` + rid + `","result":{"value":true},"schema":"firstmate.extension-response.v1"}`
	if _, err := adaptertest.DecodeResponse(rid, []byte(ok)); err != nil {
		t.Fatal(err)
	}
	for name, doc := range map[string]string{
		"ok with error":      strings.Replace(ok, `"error":null`, `"error":{"code":"internal","retryable":false,"diagnostic":"x"}`, 1),
		"ok with null":       strings.Replace(ok, `{"value":true}`, `null`, 1),
		"failed with result": `{"error":{"code":"internal","retryable":false,"diagnostic":"x"},"ok":false,"request_id":"` + rid + `","result":{},"schema":"firstmate.extension-response.v1"}`,
		"bad code":           `{"error":{"code":"oops","retryable":false,"diagnostic":"x"},"ok":false,"request_id":"` + rid + `","result":null,"schema":"firstmate.extension-response.v1"}`,
		"empty diagnostic":   `{"error":{"code":"internal","retryable":false,"diagnostic":""},"ok":false,"request_id":"` + rid + `","result":null,"schema":"firstmate.extension-response.v1"}`,
		"missing error":      strings.Replace(ok, `"error":null,`, ``, 1),
		"extra key":          strings.Replace(ok, `"ok":true`, `"ok":true,"x":1`, 1),
	} {
		if _, err := adaptertest.DecodeResponse(rid, []byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := adaptertest.DecodePollResult([]byte(`{"status":"result","output":"x","extra":1}`)); err == nil {
		t.Error("poll result with an extra key accepted")
	}
	if _, err := adaptertest.DecodePollResult([]byte(`{"status":"result"}`)); err == nil {
		t.Error("poll result with a missing key accepted")
	}
}
