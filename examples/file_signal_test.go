// Tests of the example file-signal package ([EX-1]).
//
// They run the real bin/firstmate-extension the way the host does ([INV-2],
// [INV-3]): directly, with argv [entrypoint, verb], the package root as working
// directory and exactly the minimal environment, one canonical request on
// stdin. Every response is decoded strictly: exactly one document on one line,
// exactly the schema's keys, unknown members refused.
//
// Two knobs of the test process (never of the package's environment) exist to
// check portability by hand:
//
//	FM_EXAMPLE_TEST_SHELL  argv prefix that runs the script, e.g. "busybox sh"
//	FM_EXAMPLE_TEST_PATH   the child's PATH instead of /usr/bin:/bin
//
// The 55-second no-result wait runs in parallel with everything else and is
// skipped with -short.
package example_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

const (
	extID          = "org.firstmate.example.file-signal"
	extVersion     = "1.0.0"
	adapter        = "file-signal"
	requestSchema  = "firstmate.extension-request.v1"
	responseSchema = "firstmate.extension-response.v1"
	maxEnvelope    = 65536
	maxStderr      = 8192
	maxOutput      = 16384
)

// ---------------------------------------------------------------------------
// Running the entrypoint.

type run struct {
	stdout, stderr []byte
	code           int
	elapsed        time.Duration
}

func packageDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("process-event-extension")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// exec runs the entrypoint with args and stdin in the host's exact minimal
// environment.
func execEntrypoint(t *testing.T, stdin []byte, args ...string) run {
	t.Helper()
	dir := packageDir(t)
	entry := filepath.Join(dir, "bin", "firstmate-extension")
	argv := append([]string{entry}, args...)
	if sh := strings.Fields(os.Getenv("FM_EXAMPLE_TEST_SHELL")); len(sh) > 0 {
		argv = append(sh, argv...)
	}
	childPath := "/usr/bin:/bin"
	if p := os.Getenv("FM_EXAMPLE_TEST_PATH"); p != "" {
		childPath = p
	}
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + childPath,
		"LANG=C",
		"LC_ALL=C",
		"FIRSTMATE_EXTENSION_ID=" + extID,
		"FIRSTMATE_EXTENSION_VERSION=" + extVersion,
		"FIRSTMATE_EXTENSION_STATE=" + state,
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	err := cmd.Run()
	r := run{stdout: out.Bytes(), stderr: errOut.Bytes(), elapsed: time.Since(start)}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		r.code = exitErr.ExitCode()
	default:
		t.Fatalf("running %v: %v", argv, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("%v did not finish within 90 s", args)
	}
	// The host's stream bounds ([INV-4]).
	if len(r.stderr) > maxStderr {
		t.Errorf("stderr is %d bytes, more than the host's %d-byte bound", len(r.stderr), maxStderr)
	}
	if len(r.stdout) > maxEnvelope {
		t.Errorf("stdout is %d bytes, more than the %d-byte envelope bound", len(r.stdout), maxEnvelope)
	}
	return r
}

func newRequestID(t *testing.T) string {
	t.Helper()
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b[:])
	return "sha256:" + hex.EncodeToString(sum[:])
}

// canonical marshals v with keys sorted and no whitespace, as the host does.
func canonical(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v, json.Deterministic(true))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const packageDigest = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

func handshakeRequest(t *testing.T, rid string) map[string]any {
	t.Helper()
	return map[string]any{
		"schema":            "firstmate.extension-handshake-request.v1",
		"request_id":        rid,
		"host_protocols":    []int{1},
		"extension_id":      extID,
		"extension_version": extVersion,
		"package_digest":    packageDigest,
		"capability": map[string]any{
			"adapter_names": []string{adapter},
			"name":          "process-event-adapter",
			"versions":      []int{1},
		},
	}
}

func invokeRequest(rid, op string, input any) map[string]any {
	return map[string]any{
		"schema":             requestSchema,
		"request_id":         rid,
		"host_protocol":      1,
		"extension_id":       extID,
		"extension_version":  extVersion,
		"package_digest":     packageDigest,
		"capability":         "process-event-adapter",
		"capability_version": 1,
		"adapter":            adapter,
		"operation":          op,
		"input":              input,
	}
}

// ---------------------------------------------------------------------------
// Strict decoding.

// decodeExact requires data to be exactly one JSON document (strict UTF-8, no
// duplicate key, nothing after it) that is an object with exactly keys, and
// decodes it into v refusing unknown members.
func decodeExact(t *testing.T, what string, data []byte, v any, keys ...string) {
	t.Helper()
	var members map[string]jsontext.Value
	if err := json.Unmarshal(data, &members); err != nil {
		t.Fatalf("%s is not one strict JSON object: %v\n%s", what, err, data)
	}
	got := make([]string, 0, len(members))
	for k := range members {
		got = append(got, k)
	}
	slices.Sort(got)
	want := slices.Clone(keys)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%s keys = %v, want exactly %v\n%s", what, got, want, data)
	}
	if err := json.Unmarshal(data, v, json.RejectUnknownMembers(true)); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, data)
	}
}

// oneDocument checks that stdout is exactly one JSON document on one line
// (the script writes ASCII only: non-ASCII text travels as \u escapes).
func oneDocument(t *testing.T, r run) []byte {
	t.Helper()
	out := r.stdout
	if len(out) == 0 || out[len(out)-1] != '\n' || bytes.IndexByte(out, '\n') != len(out)-1 {
		t.Fatalf("stdout is not one newline-terminated line (exit %d, stderr %q):\n%q", r.code, r.stderr, out)
	}
	dec := jsontext.NewDecoder(bytes.NewReader(out))
	if _, err := dec.ReadValue(); err != nil {
		t.Fatalf("stdout is not a JSON document: %v\n%s", err, out)
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		t.Fatalf("stdout holds more than one JSON document: %v\n%s", err, out)
	}
	for i, b := range out {
		if b >= 0x80 {
			t.Fatalf("stdout byte %d is not ASCII: %q", i, out)
		}
	}
	return out
}

type handshakeResponse struct {
	Schema            string   `json:"schema"`
	RequestID         string   `json:"request_id"`
	ExtensionID       string   `json:"extension_id"`
	ExtensionVersion  string   `json:"extension_version"`
	HostProtocol      int      `json:"host_protocol"`
	Capability        string   `json:"capability"`
	CapabilityVersion int      `json:"capability_version"`
	AdapterNames      []string `json:"adapter_names"`
}

type response struct {
	Schema    string         `json:"schema"`
	RequestID string         `json:"request_id"`
	OK        bool           `json:"ok"`
	Result    jsontext.Value `json:"result"`
	Error     jsontext.Value `json:"error"`
}

type packageError struct {
	Code       string `json:"code"`
	Retryable  bool   `json:"retryable"`
	Diagnostic string `json:"diagnostic"`
}

type pollResult struct {
	Status string `json:"status"`
	Output string `json:"output"`
}

// invokeRaw sends stdin to "invoke" and checks the envelope: exit 0, one
// document, exactly the response keys, the schema, the echoed request id, and
// the ok/result/error consistency of [PROTO-4].
func invokeRaw(t *testing.T, stdin []byte, wantRID string) (response, run) {
	t.Helper()
	r := execEntrypoint(t, stdin, "invoke")
	if r.code != 0 {
		t.Fatalf("invoke exited %d (stderr %q)", r.code, r.stderr)
	}
	var resp response
	decodeExact(t, "response", oneDocument(t, r), &resp, "schema", "request_id", "ok", "result", "error")
	if resp.Schema != responseSchema {
		t.Fatalf("schema = %q", resp.Schema)
	}
	if resp.RequestID != wantRID {
		t.Fatalf("request_id = %q, want %q", resp.RequestID, wantRID)
	}
	if resp.OK {
		if resp.Error.Kind() != 'n' || resp.Result.Kind() != '{' {
			t.Fatalf("ok=true needs an object result and a null error: %s", r.stdout)
		}
	} else {
		if resp.Result.Kind() != 'n' || resp.Error.Kind() != '{' {
			t.Fatalf("ok=false needs a null result and an error object: %s", r.stdout)
		}
		var e packageError
		decodeExact(t, "error", resp.Error, &e, "code", "retryable", "diagnostic")
		if !slices.Contains([]string{"invalid-request", "incompatible", "conflict", "unavailable", "internal"}, e.Code) {
			t.Fatalf("error.code %q is not a protocol code", e.Code)
		}
		if len(e.Diagnostic) < 1 || len(e.Diagnostic) > 512 || strings.ContainsFunc(e.Diagnostic, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Fatalf("error.diagnostic %q is not 1..512 bytes without control characters", e.Diagnostic)
		}
	}
	return resp, r
}

func invoke(t *testing.T, op string, input any) (response, run) {
	t.Helper()
	rid := newRequestID(t)
	return invokeRaw(t, canonical(t, invokeRequest(rid, op, input)), rid)
}

func wantError(t *testing.T, resp response, code string) packageError {
	t.Helper()
	if resp.OK {
		t.Fatalf("ok=true, want an ok=false %s answer; result %s", code, resp.Result)
	}
	var e packageError
	decodeExact(t, "error", resp.Error, &e, "code", "retryable", "diagnostic")
	if e.Code != code {
		t.Fatalf("error.code = %q (%s), want %q", e.Code, e.Diagnostic, code)
	}
	return e
}

func wantPoll(t *testing.T, resp response) pollResult {
	t.Helper()
	if !resp.OK {
		t.Fatalf("ok=false: %s", resp.Error)
	}
	var p pollResult
	decodeExact(t, "source.poll result", resp.Result, &p, "status", "output")
	return p
}

func pollInput(ref string) map[string]any {
	return map[string]any{"config_ref": ref, "source_id": "s1"}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------
// The package.

// [EX-1] [MAN-1] [MAN-4] [MAN-5]: the manifest, exactly.
func TestManifest(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(packageDir(t), "firstmate-extension.json"))
	if err != nil {
		t.Fatal(err)
	}
	type capability struct {
		Name         string   `json:"name"`
		Versions     []int    `json:"versions"`
		AdapterNames []string `json:"adapter_names"`
	}
	var m struct {
		Schema           string           `json:"schema"`
		ID               string           `json:"id"`
		Version          string           `json:"version"`
		HostProtocols    []int            `json:"host_protocols"`
		Entrypoint       string           `json:"entrypoint"`
		Capabilities     []jsontext.Value `json:"capabilities"`
		RequiredConsents []string         `json:"required_consents"`
	}
	decodeExact(t, "manifest", data, &m, "schema", "id", "version", "host_protocols", "entrypoint", "capabilities", "required_consents")
	if m.Schema != "firstmate.extension-manifest.v1" || m.ID != extID || m.Version != extVersion ||
		!slices.Equal(m.HostProtocols, []int{1}) || m.Entrypoint != "bin/firstmate-extension" ||
		!slices.Equal(m.RequiredConsents, []string{"artifact-references"}) || len(m.Capabilities) != 1 {
		t.Fatalf("manifest = %+v", m)
	}
	var c capability
	decodeExact(t, "capability", m.Capabilities[0], &c, "name", "versions", "adapter_names")
	if c.Name != "process-event-adapter" || !slices.Equal(c.Versions, []int{1}) || !slices.Equal(c.AdapterNames, []string{adapter}) {
		t.Fatalf("capability = %+v", c)
	}

	fi, err := os.Lstat(filepath.Join(packageDir(t), filepath.FromSlash(m.Entrypoint)))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 != 0o111 {
		t.Fatalf("entrypoint mode %v, want a regular file executable by all", fi.Mode())
	}
	script, err := os.ReadFile(filepath.Join(packageDir(t), m.Entrypoint))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(script, []byte("#!/bin/sh\n")) {
		t.Fatalf("entrypoint does not start with #!/bin/sh")
	}
	// Every entry of the package is a directory or a regular file (no link):
	// the bind rules of [PKG-3] refuse anything else.
	err = filepath.WalkDir(packageDir(t), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsDir() && !d.Type().IsRegular() {
			t.Errorf("%s is neither a directory nor a regular file", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------
// Handshake.

// [EX-1] [PROTO-1] [PROTO-2]: the handshake answers with exactly the response
// keys and echoes the request id, whatever its characters.
func TestHandshake(t *testing.T) {
	t.Parallel()
	for _, rid := range []string{"", "sha256:odd \"quoted\" \\ back/slash\t\u00e9\u2713\U0001F600\u0001"} {
		if rid == "" {
			rid = newRequestID(t)
		}
		r := execEntrypoint(t, canonical(t, handshakeRequest(t, rid)), "handshake")
		if r.code != 0 {
			t.Fatalf("handshake exited %d (stderr %q)", r.code, r.stderr)
		}
		var h handshakeResponse
		decodeExact(t, "handshake response", oneDocument(t, r), &h,
			"schema", "request_id", "extension_id", "extension_version", "host_protocol", "capability", "capability_version", "adapter_names")
		want := handshakeResponse{
			Schema: "firstmate.extension-handshake-response.v1", RequestID: rid, ExtensionID: extID, ExtensionVersion: extVersion,
			HostProtocol: 1, Capability: "process-event-adapter", CapabilityVersion: 1, AdapterNames: []string{adapter},
		}
		if h.Schema != want.Schema || h.RequestID != want.RequestID || h.ExtensionID != want.ExtensionID ||
			h.ExtensionVersion != want.ExtensionVersion || h.HostProtocol != 1 || h.Capability != want.Capability ||
			h.CapabilityVersion != 1 || !slices.Equal(h.AdapterNames, want.AdapterNames) {
			t.Fatalf("handshake response = %+v, want %+v", h, want)
		}
	}
}

// A handshake the package cannot honour exits non-zero with nothing on stdout.
func TestHandshakeRefusals(t *testing.T) {
	t.Parallel()
	rid := newRequestID(t)
	cases := map[string]func(m map[string]any){
		"schema":         func(m map[string]any) { m["schema"] = requestSchema },
		"no protocol 1":  func(m map[string]any) { m["host_protocols"] = []int{2} },
		"extra key":      func(m map[string]any) { m["extra"] = true },
		"missing key":    func(m map[string]any) { delete(m, "package_digest") },
		"other id":       func(m map[string]any) { m["extension_id"] = "org.example.other" },
		"other version":  func(m map[string]any) { m["extension_version"] = "1.0.1" },
		"other adapter":  func(m map[string]any) { m["capability"].(map[string]any)["adapter_names"] = []string{adapter, "other"} },
		"no adapter":     func(m map[string]any) { m["capability"].(map[string]any)["adapter_names"] = []string{} },
		"capability v2":  func(m map[string]any) { m["capability"].(map[string]any)["versions"] = []int{2} },
		"capability key": func(m map[string]any) { m["capability"].(map[string]any)["x"] = 1 },
		"request id":     func(m map[string]any) { m["request_id"] = 7 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := handshakeRequest(t, rid)
			mutate(m)
			r := execEntrypoint(t, canonical(t, m), "handshake")
			if r.code == 0 || len(r.stdout) != 0 || len(r.stderr) == 0 {
				t.Fatalf("exit %d, stdout %q, stderr %q; want a non-zero exit, no stdout and a reason on stderr", r.code, r.stdout, r.stderr)
			}
		})
	}
	for name, raw := range map[string]string{
		"empty":     "",
		"not json":  "handshake please",
		"truncated": `{"schema":"firstmate.extension-handshake-request.v1"`,
		"two docs":  string(canonical(t, handshakeRequest(t, rid))) + "{}",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := execEntrypoint(t, []byte(raw), "handshake")
			if r.code == 0 || len(r.stdout) != 0 {
				t.Fatalf("exit %d, stdout %q; want a non-zero exit and no stdout", r.code, r.stdout)
			}
		})
	}
}

// A verb other than handshake or invoke, or not exactly one argument, is a
// usage error: exit 2, nothing on stdout.
func TestWrongVerb(t *testing.T) {
	t.Parallel()
	req := canonical(t, handshakeRequest(t, newRequestID(t)))
	for _, args := range [][]string{{}, {"bogus"}, {"Handshake"}, {"handshake", "extra"}, {""}} {
		r := execEntrypoint(t, req, args...)
		if r.code != 2 || len(r.stdout) != 0 || len(r.stderr) == 0 {
			t.Errorf("args %q: exit %d, stdout %q, stderr %q; want exit 2 with usage on stderr only", args, r.code, r.stdout, r.stderr)
		}
	}
}

// ---------------------------------------------------------------------------
// source.poll.

// [EX-1]: an existing signal file is returned at once, exactly, whatever
// characters it holds; the file is left in place.
func TestPollReturnsContentsExactly(t *testing.T) {
	t.Parallel()
	var allControls strings.Builder
	for c := 0; c < 0x20; c++ {
		allControls.WriteByte(byte(c))
	}
	allControls.WriteString("\x7f")
	cases := map[string]string{
		"plain":      "hello\n",
		"one byte":   "x",
		"escapes":    "say \"hi\" \\ back\\slash\ttab\nnew line\r\n\x01ctrl /solidus\b\f",
		"multibyte":  "h\u00e9llo \u2713 \U0001F600 \u4e16\u754c \u0080\u07ff\u0800\uffff\U00010000\U0010FFFF",
		"controls":   allControls.String(),
		"nul":        "a\x00b\x00",
		"c1 and del": "\u0085\u009f\x7f",
		"json-like":  `{"status":"no-result","output":""}`,
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "signal")
			writeFile(t, path, []byte(content))
			resp, r := invoke(t, "source.poll", pollInput("file:"+path))
			p := wantPoll(t, resp)
			if p.Status != "result" || p.Output != content {
				t.Fatalf("poll = %+v, want result %q", p, content)
			}
			if r.elapsed > 10*time.Second {
				t.Errorf("an existing file took %v", r.elapsed)
			}
			after, err := os.ReadFile(path)
			if err != nil || string(after) != content {
				t.Fatalf("the signal file changed or vanished: %q, %v", after, err)
			}
		})
	}
}

// [EX-1]: 1..16,384 bytes are returned; one byte more is refused. At the
// bound, text that needs long escapes still fits the envelope.
func TestPollSizeBounds(t *testing.T) {
	t.Parallel()
	mixed := fill("a\"\\\t\u00e9\u2713\U0001F600\n\x01", maxOutput)
	exactCases := map[string]string{
		"ascii at bound":           strings.Repeat("x", maxOutput),
		"mixed at bound":           mixed,
		"emoji at bound":           strings.Repeat("\U0001F600", maxOutput/4),
		"two-byte at bound":        strings.Repeat("\u00e9", maxOutput/2),
		"quotes at bound":          strings.Repeat("\"", maxOutput),
		"newlines at bound":        strings.Repeat("\n", maxOutput),
		"controls within envelope": strings.Repeat("\x01", 9000),
	}
	for name, content := range exactCases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if !utf8.ValidString(content) || len(content) > maxOutput {
				t.Fatalf("bad fixture: %d bytes", len(content))
			}
			path := filepath.Join(t.TempDir(), "signal")
			writeFile(t, path, []byte(content))
			resp, _ := invoke(t, "source.poll", pollInput("file:"+path))
			if p := wantPoll(t, resp); p.Status != "result" || p.Output != content {
				t.Fatalf("status %q, %d bytes of output; want the %d-byte file exactly", p.Status, len(p.Output), len(content))
			}
		})
	}
	refused := map[string]string{
		"one byte over":  strings.Repeat("x", maxOutput+1),
		"far over":       strings.Repeat("y", 10*maxOutput),
		"over by a rune": strings.Repeat("x", maxOutput-1) + "\u00e9",
		// 16,384 bytes of U+0001 would need a 98,304-byte \u0001 response:
		// refused rather than breaking the 65,536-byte envelope bound.
		"controls beyond the envelope": strings.Repeat("\x01", maxOutput),
	}
	for name, content := range refused {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "signal")
			writeFile(t, path, []byte(content))
			resp, _ := invoke(t, "source.poll", pollInput("file:"+path))
			if e := wantError(t, resp, "invalid-request"); e.Retryable {
				t.Fatalf("retryable = true for a file that cannot change by retrying")
			}
		})
	}
}

// [EX-1]: a file that is not valid UTF-8 is refused (invalid-request).
func TestPollRefusesInvalidUTF8(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"lone continuation":  "abc\x80",
		"ff byte":            "\xff",
		"overlong slash":     "\xc0\xaf",
		"overlong nul":       "\xc0\x80",
		"overlong 3-byte":    "\xe0\x80\xaf",
		"overlong 4-byte":    "\xf0\x80\x80\xaf",
		"surrogate":          "\xed\xa0\x80",
		"above U+10FFFF":     "\xf4\x90\x80\x80",
		"f5 lead":            "\xf5\x80\x80\x80",
		"truncated at end":   "ok \xe2\x9c",
		"truncated inside":   "\xe2\x9cx",
		"latin-1":            "h\xe9llo",
		"valid then invalid": "h\u00e9llo \xfe",
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if utf8.ValidString(content) {
				t.Fatalf("bad fixture %q is valid UTF-8", content)
			}
			path := filepath.Join(t.TempDir(), "signal")
			writeFile(t, path, []byte(content))
			resp, _ := invoke(t, "source.poll", pollInput("file:"+path))
			wantError(t, resp, "invalid-request")
		})
	}
}

// [EX-1]: a signal file created while the poll waits is returned as soon as it
// appears, not at the end of the 55-second wait.
func TestPollWaitsForTheFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "signal")
	const content = "appeared later \u2713\n"
	done := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		tmp := filepath.Join(dir, ".signal.tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			done <- err
			return
		}
		done <- os.Rename(tmp, path)
	}()
	resp, r := invoke(t, "source.poll", pollInput("file:"+path))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if p := wantPoll(t, resp); p.Status != "result" || p.Output != content {
		t.Fatalf("poll = %+v, want result %q", p, content)
	}
	if r.elapsed < 900*time.Millisecond || r.elapsed > 10*time.Second {
		t.Fatalf("poll took %v, want about 1 s", r.elapsed)
	}
}

// An empty file may be mid-write (`echo hello > f` creates it first): the poll
// keeps looking, and returns the content once it is written.
func TestPollEmptyThenWritten(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "signal")
	writeFile(t, path, nil)
	done := make(chan error, 1)
	go func() {
		time.Sleep(500 * time.Millisecond)
		done <- os.WriteFile(path, []byte("hello\n"), 0o600)
	}()
	resp, _ := invoke(t, "source.poll", pollInput("file:"+path))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if p := wantPoll(t, resp); p.Status != "result" || p.Output != "hello\n" {
		t.Fatalf("poll = %+v, want result %q", p, "hello\n")
	}
}

// Decision: a signal file that stays empty (about 2 s) is not a signal and not
// "no event yet" either; it is refused as invalid-request, not retryable. (The
// contract's outputs are 1..16,384 bytes.)
func TestPollEmptyFileIsRefused(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "signal")
	writeFile(t, path, nil)
	resp, r := invoke(t, "source.poll", pollInput("file:"+path))
	if e := wantError(t, resp, "invalid-request"); e.Retryable {
		t.Fatal("retryable = true")
	}
	if r.elapsed < 900*time.Millisecond || r.elapsed > 10*time.Second {
		t.Fatalf("took %v, want about 2 s (the settle time)", r.elapsed)
	}
}

// config_ref must be file:<absolute path>; the path may hold any character a
// config_ref allows, and must name a regular file once it exists.
func TestPollConfigRef(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	odd := filepath.Join(dir, "we\"ird \\ n\u00e1me %s $(x) 'q' \u2713 \\u00e1")
	writeFile(t, odd, []byte("odd path"))
	resp, _ := invoke(t, "source.poll", pollInput("file:"+odd))
	if p := wantPoll(t, resp); p.Status != "result" || p.Output != "odd path" {
		t.Fatalf("odd path: poll = %+v", p)
	}
	// An escaped spelling of the same path in the request is the same path.
	rid := newRequestID(t)
	req := canonical(t, invokeRequest(rid, "source.poll", pollInput("file:"+odd)))
	req = bytes.Replace(req, []byte("file:/"), []byte(`\u0066ile:\/`), 1)
	resp, _ = invokeRaw(t, req, rid)
	if p := wantPoll(t, resp); p.Status != "result" || p.Output != "odd path" {
		t.Fatalf("escaped spelling: poll = %+v", p)
	}

	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, ref := range map[string]string{
		"relative":       "relative/path",
		"file relative":  "file:relative/path",
		"file empty":     "file:",
		"other scheme":   "http://example.org/signal",
		"upper scheme":   "FILE:/tmp/x",
		"empty":          "",
		"control":        "file:/tmp/a\tb",
		"newline":        "file:/tmp/a\nb",
		"too long":       "file:/" + strings.Repeat("a", 512),
		"directory":      "file:" + dir,
		"fifo":           "file:" + fifo,
		"root directory": "file:/",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			resp, r := invoke(t, "source.poll", pollInput(ref))
			wantError(t, resp, "invalid-request")
			if r.elapsed > 10*time.Second {
				t.Fatalf("took %v", r.elapsed)
			}
		})
	}
}

// [EX-1]: no file within the wait is a no-result answer after about 55 s.
func TestPollNoResultAfterWait(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 55 s; skipped with -short")
	}
	t.Parallel()
	path := filepath.Join(t.TempDir(), "never")
	resp, r := invoke(t, "source.poll", pollInput("file:"+path))
	if p := wantPoll(t, resp); p.Status != "no-result" || p.Output != "" {
		t.Fatalf("poll = %+v, want no-result with empty output", p)
	}
	if r.elapsed < 53*time.Second || r.elapsed > 60*time.Second {
		t.Fatalf("no-result after %v, want about 55 s", r.elapsed)
	}
}

// ---------------------------------------------------------------------------
// classify, terminal, silent.

// [EX-1]: classify -> file-signal, terminal -> true, silent -> false, for any
// content.
func TestResultOperations(t *testing.T) {
	t.Parallel()
	contents := []string{"", "hello\n", "q\"\\\x01\u00e9\U0001F600", strings.Repeat("\u2713", 32768/3)}
	for _, content := range contents {
		input := map[string]any{"source_id": "demo", "sequence": 1, "content": content}
		resp, _ := invoke(t, "result.classify", input)
		if !resp.OK {
			t.Fatalf("classify: %s", resp.Error)
		}
		var c struct {
			Classification string `json:"classification"`
		}
		decodeExact(t, "classify result", resp.Result, &c, "classification")
		if c.Classification != "file-signal" {
			t.Fatalf("classification = %q", c.Classification)
		}
		for op, want := range map[string]bool{"result.terminal": true, "result.silent": false} {
			resp, _ := invoke(t, op, input)
			if !resp.OK {
				t.Fatalf("%s: %s", op, resp.Error)
			}
			var v struct {
				Value bool `json:"value"`
			}
			decodeExact(t, op+" result", resp.Result, &v, "value")
			if v.Value != want {
				t.Fatalf("%s = %v, want %v", op, v.Value, want)
			}
		}
	}
}

// ---------------------------------------------------------------------------
// Refused requests.

// Unknown operations and malformed requests are answered ok=false,
// invalid-request (incompatible for another protocol or capability version),
// retryable false, result null, echoing the request id where one was read.
func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	good := map[string]any{"source_id": "s1", "sequence": 1, "content": "x"}
	type tc struct {
		op     string
		input  any
		mutate func(m map[string]any)
		code   string
	}
	cases := map[string]tc{
		"unknown operation":    {op: "result.explode", input: good, code: "invalid-request"},
		"empty operation":      {op: "", input: good, code: "invalid-request"},
		"operation case":       {op: "Result.Classify", input: good, code: "invalid-request"},
		"extra key":            {op: "result.classify", input: good, mutate: func(m map[string]any) { m["extra"] = 1 }, code: "invalid-request"},
		"missing key":          {op: "result.classify", input: good, mutate: func(m map[string]any) { delete(m, "package_digest") }, code: "invalid-request"},
		"schema":               {op: "result.classify", input: good, mutate: func(m map[string]any) { m["schema"] = "firstmate.extension-request.v2" }, code: "invalid-request"},
		"host protocol 2":      {op: "result.classify", input: good, mutate: func(m map[string]any) { m["host_protocol"] = 2 }, code: "incompatible"},
		"host protocol 1.0":    {op: "result.classify", input: good, mutate: func(m map[string]any) { m["host_protocol"] = jsontext.Value("1.0") }, code: "incompatible"},
		"capability version":   {op: "result.classify", input: good, mutate: func(m map[string]any) { m["capability_version"] = 2 }, code: "incompatible"},
		"capability":           {op: "result.classify", input: good, mutate: func(m map[string]any) { m["capability"] = "lifecycle-sink" }, code: "incompatible"},
		"adapter":              {op: "result.classify", input: good, mutate: func(m map[string]any) { m["adapter"] = "review-feed" }, code: "invalid-request"},
		"extension id":         {op: "result.classify", input: good, mutate: func(m map[string]any) { m["extension_id"] = "org.example.other" }, code: "invalid-request"},
		"input not object":     {op: "result.classify", input: "x", code: "invalid-request"},
		"input extra":          {op: "result.classify", input: map[string]any{"source_id": "s1", "sequence": 1, "content": "x", "path": "/x"}, code: "invalid-request"},
		"input missing":        {op: "result.terminal", input: map[string]any{"source_id": "s1", "content": "x"}, code: "invalid-request"},
		"sequence zero":        {op: "result.silent", input: map[string]any{"source_id": "s1", "sequence": 0, "content": "x"}, code: "invalid-request"},
		"sequence fraction":    {op: "result.silent", input: map[string]any{"source_id": "s1", "sequence": 1.5, "content": "x"}, code: "invalid-request"},
		"sequence string":      {op: "result.silent", input: map[string]any{"source_id": "s1", "sequence": "1", "content": "x"}, code: "invalid-request"},
		"content too long":     {op: "result.classify", input: map[string]any{"source_id": "s1", "sequence": 1, "content": strings.Repeat("x", 32769)}, code: "invalid-request"},
		"source id dot":        {op: "result.classify", input: map[string]any{"source_id": ".s1", "sequence": 1, "content": "x"}, code: "invalid-request"},
		"source id slash":      {op: "source.poll", input: map[string]any{"source_id": "a/b", "config_ref": "file:/x"}, code: "invalid-request"},
		"source id long":       {op: "source.poll", input: map[string]any{"source_id": strings.Repeat("s", 65), "config_ref": "file:/x"}, code: "invalid-request"},
		"poll input for other": {op: "source.poll", input: good, code: "invalid-request"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rid := newRequestID(t)
			m := invokeRequest(rid, c.op, c.input)
			if c.mutate != nil {
				c.mutate(m)
			}
			resp, _ := invokeRaw(t, canonical(t, m), rid)
			if e := wantError(t, resp, c.code); e.Retryable {
				t.Fatal("retryable = true")
			}
		})
	}

	// Documents that cannot be read as a request: answered with an empty
	// request id when none could be read.
	rid := newRequestID(t)
	valid := canonical(t, invokeRequest(rid, "result.classify", good))
	raw := map[string]struct {
		doc []byte
		rid string
	}{
		"empty":               {nil, ""},
		"whitespace":          {[]byte(" \n"), ""},
		"not json":            {[]byte("invoke please"), ""},
		"truncated":           {valid[:len(valid)-1], ""},
		"trailing document":   {append(slices.Clone(valid), "{}"...), ""},
		"trailing garbage":    {append(slices.Clone(valid), " x"...), ""},
		"byte order mark":     {append([]byte("\xef\xbb\xbf"), valid...), ""},
		"duplicate key":       {bytes.Replace(valid, []byte(`{"adapter":"file-signal",`), []byte(`{"adapter":"file-signal","adapter":"file-signal",`), 1), ""},
		"duplicate by escape": {bytes.Replace(valid, []byte(`{"adapter":"file-signal",`), []byte(`{"adapter":"file-signal","\u0061dapter":"file-signal",`), 1), ""},
		"raw control":         {bytes.Replace(valid, []byte(`"content":"x"`), []byte("\"content\":\"x\x01\""), 1), ""},
		"invalid utf-8":       {bytes.Replace(valid, []byte(`"content":"x"`), []byte("\"content\":\"x\xff\""), 1), ""},
		"lone surrogate":      {bytes.Replace(valid, []byte(`"content":"x"`), []byte(`"content":"\ud800"`), 1), ""},
		"low surrogate":       {bytes.Replace(valid, []byte(`"content":"x"`), []byte(`"content":"\udc00x"`), 1), ""},
		"bad escape":          {bytes.Replace(valid, []byte(`"content":"x"`), []byte(`"content":"\x"`), 1), ""},
		"nan":                 {bytes.Replace(valid, []byte(`"sequence":1`), []byte(`"sequence":NaN`), 1), ""},
		"leading zero":        {bytes.Replace(valid, []byte(`"sequence":1`), []byte(`"sequence":01`), 1), ""},
		"array":               {[]byte(`[1,2]`), ""},
		"too large":           {append(append(slices.Clone(valid[:len(valid)-1]), `,"pad":"`+strings.Repeat("p", maxEnvelope)...), `"}`...), ""},
		"too deep":            {[]byte(strings.Repeat("[", 40) + strings.Repeat("]", 40)), ""},
		// Well-formed JSON that is not a valid request still echoes its id.
		"id echoed": {bytes.Replace(valid, []byte(`"operation":"result.classify"`), []byte(`"operation":7`), 1), rid},
	}
	for name, c := range raw {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			resp, _ := invokeRaw(t, c.doc, c.rid)
			wantError(t, resp, "invalid-request")
		})
	}
}

// The well-formed but unusual spellings a strict parser must accept.
func TestLenientWhitespaceAndEscapes(t *testing.T) {
	t.Parallel()
	rid := newRequestID(t)
	valid := canonical(t, invokeRequest(rid, "result.classify", map[string]any{"source_id": "s1", "sequence": 1, "content": "x"}))
	spaced := bytes.ReplaceAll(valid, []byte(`,"`), []byte(" ,\n\t\"")) // whitespace between tokens
	spaced = bytes.ReplaceAll(spaced, []byte(`":`), []byte("\" : "))
	spaced = append(append([]byte(" \r\n"), spaced...), " \n"...)
	escaped := bytes.Replace(valid, []byte(`"result.classify"`), []byte(`"result\u002eclassify"`), 1)
	surrogates := bytes.Replace(valid, []byte(`"content":"x"`), []byte(`"content":"\ud83d\ude00 \u00e9"`), 1)
	for name, doc := range map[string][]byte{"whitespace": spaced, "escaped operation": escaped, "surrogate pair": surrogates} {
		resp, _ := invokeRaw(t, doc, rid)
		if !resp.OK {
			t.Fatalf("%s: %s\n%s", name, resp.Error, doc)
		}
	}
}

// fill repeats pattern's runes while they fit in n bytes, then pads with 'z'
// to exactly n bytes.
func fill(pattern string, n int) string {
	var b strings.Builder
	for {
		for _, r := range pattern {
			if b.Len()+utf8.RuneLen(r) > n {
				for b.Len() < n {
					b.WriteByte('z')
				}
				return b.String()
			}
			b.WriteRune(r)
		}
	}
}

// A signal file the package may not read is unavailable (retryable): the
// operator can fix the mode. Root reads anything, so this runs unprivileged.
func TestPollUnreadableFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "signal")
	writeFile(t, path, []byte("secret"))
	if err := os.Chmod(path, 0); err != nil {
		t.Fatal(err)
	}
	if f, err := os.Open(path); err == nil {
		f.Close()
		t.Skip("this user reads mode-000 files (root); run unprivileged to cover this")
	}
	resp, _ := invoke(t, "source.poll", pollInput("file:"+path))
	if e := wantError(t, resp, "unavailable"); !e.Retryable {
		t.Fatal("retryable = false")
	}
}
