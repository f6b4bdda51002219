package host_test

import (
	"context"
	"testing"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// [PROTO-2] Each operation decodes its own result shape into its own type
// and refuses another operation's shape; the zero Op names no operation and
// is refused before anything runs.
func TestOpDecode(t *testing.T) {
	if p, err := host.Poll.Decode([]byte(`{"status":"result","output":"x"}`)); err != nil || p.Output != "x" {
		t.Fatalf("poll: %+v %v", p, err)
	}
	if c, err := host.Classify.Decode([]byte(`{"classification":"tick"}`)); err != nil || c.Classification != "tick" {
		t.Fatalf("classify: %+v %v", c, err)
	}
	for _, op := range []host.Op[wire.ResultInput, wire.BoolResult]{host.Terminal, host.Silent} {
		if b, err := op.Decode([]byte(`{"value":true}`)); err != nil || !b.Value {
			t.Fatalf("%s: %+v %v", op.Name(), b, err)
		}
		if _, err := op.Decode([]byte(`{"classification":"tick"}`)); errcode.Of(err) != errcode.ResponseInvalid {
			t.Fatalf("%s took a classification: %v", op.Name(), err)
		}
	}
	var zero host.Op[wire.PollInput, wire.PollResult]
	if _, err := zero.Decode([]byte(`{"status":"no-result","output":""}`)); errcode.Of(err) != errcode.Internal {
		t.Fatalf("zero op decoded: %v", err)
	}
	h, _ := testpkg.Home(t)
	b := &binding.Binding{}
	if _, err := host.Invoke(context.Background(), h, b, zero, wire.PollInput{}, host.Call{}); errcode.Of(err) != errcode.Internal {
		t.Fatalf("zero op invoked: %v", err)
	}
}
