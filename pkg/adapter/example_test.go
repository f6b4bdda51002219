package adapter_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"firstmate.dev/fm/pkg/adapter"
)

// echo is the adapter of the package documentation: it answers the contents
// of the file named by config_ref once per change of its modification time.
type echo struct{}

func (echo) Identity() adapter.Identity {
	return adapter.Identity{
		ExtensionID:      "org.example.echo-file",
		ExtensionVersion: "1.0.0",
		AdapterNames:     []string{"echo-file"},
	}
}

func (echo) Poll(ctx context.Context, call *adapter.Call, in adapter.PollInput) (adapter.PollResult, error) {
	path, ok := strings.CutPrefix(in.ConfigRef, "file:")
	if !ok || !strings.HasPrefix(path, "/") {
		return adapter.PollResult{}, adapter.Errorf(adapter.InvalidRequest, false, "config_ref must be file:<absolute path>")
	}
	r, err := call.Replay()
	if err != nil {
		return adapter.PollResult{}, err
	}
	return r.Poll(call, in, func() (adapter.PollResult, error) {
		seen := call.Env.StateDir + "/" + in.SourceID + ".seen"
		last, _ := os.ReadFile(seen)
		deadline := time.Now().Add(25 * time.Second)
		for time.Now().Before(deadline) {
			if fi, err := os.Stat(path); err == nil && fi.Size() > 0 && fi.Size() <= 16384 {
				stamp := fi.ModTime().String()
				if stamp != string(last) {
					data, err := os.ReadFile(path)
					if err != nil {
						return adapter.PollResult{}, adapter.Errorf(adapter.Unavailable, true, "read: %w", err)
					}
					if err := os.WriteFile(seen, []byte(stamp), 0o600); err != nil {
						return adapter.PollResult{}, err
					}
					return adapter.Output(string(data)), nil
				}
			}
			select {
			case <-ctx.Done():
				return adapter.NoResult(), nil
			case <-time.After(500 * time.Millisecond):
			}
		}
		return adapter.NoResult(), nil
	})
}

func (echo) Classify(context.Context, *adapter.Call, adapter.ResultInput) (adapter.ClassifyResult, error) {
	return adapter.ClassifyResult{Classification: "echo-file"}, nil
}

func (echo) Terminal(context.Context, *adapter.Call, adapter.ResultInput) (adapter.BoolResult, error) {
	return adapter.BoolResult{Value: false}, nil
}

func (echo) Silent(context.Context, *adapter.Call, adapter.ResultInput) (adapter.BoolResult, error) {
	return adapter.BoolResult{Value: false}, nil
}

// The entrypoint's main is just adapter.Serve(echo{}). Here Run plays one
// handshake and one poll the way the host would.
func Example() {
	state, _ := os.MkdirTemp("", "echo-state-")
	defer os.RemoveAll(state)
	notes, _ := os.CreateTemp("", "notes-")
	defer os.Remove(notes.Name())
	notes.WriteString("remember the milk\n")
	notes.Close()
	os.Setenv("FIRSTMATE_EXTENSION_STATE", state)
	defer os.Unsetenv("FIRSTMATE_EXTENSION_STATE")

	digest := "sha256:" + strings.Repeat("ab", 32)
	handshake := `{"schema":"firstmate.extension-handshake-request.v1","request_id":"sha256:` + strings.Repeat("1", 64) +
		`","host_protocols":[1],"extension_id":"org.example.echo-file","extension_version":"1.0.0","package_digest":"` + digest +
		`","capability":{"name":"process-event-adapter","versions":[1],"adapter_names":["echo-file"]}}`
	code := adapter.Run([]string{"bin/firstmate-extension", "handshake"}, strings.NewReader(handshake), os.Stdout, os.Stderr, echo{})
	fmt.Println("\nexit", code)

	invoke := `{"schema":"firstmate.extension-request.v1","request_id":"sha256:` + strings.Repeat("2", 64) +
		`","host_protocol":1,"extension_id":"org.example.echo-file","extension_version":"1.0.0","package_digest":"` + digest +
		`","capability":"process-event-adapter","capability_version":1,"adapter":"echo-file","operation":"source.poll",` +
		`"input":{"source_id":"notes","config_ref":"file:` + notes.Name() + `"}}`
	code = adapter.Run([]string{"bin/firstmate-extension", "invoke"}, strings.NewReader(invoke), os.Stdout, os.Stderr, echo{})
	fmt.Println("\nexit", code)

	// Output:
	// {"adapter_names":["echo-file"],"capability":"process-event-adapter","capability_version":1,"extension_id":"org.example.echo-file","extension_version":"1.0.0","host_protocol":1,"request_id":"sha256:1111111111111111111111111111111111111111111111111111111111111111","schema":"firstmate.extension-handshake-response.v1"}
	// exit 0
	// {"error":null,"ok":true,"request_id":"sha256:2222222222222222222222222222222222222222222222222222222222222222","result":{"output":"remember the milk\n","status":"result"},"schema":"firstmate.extension-response.v1"}
	// exit 0
}
