package host

import (
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// Op is one operation of the protocol with its input and result types
// ([PROTO-2]): Invoke takes an In and returns an *Out, so no caller asserts
// the type of an answer. The four values below are the only operations; the
// zero Op names none and every call of it is refused.
type Op[In, Out any] struct{ name string }

// The operations ([PROTO-2]).
var (
	Poll     = Op[wire.PollInput, wire.PollResult]{wire.OpPoll}
	Classify = Op[wire.ResultInput, wire.ClassifyResult]{wire.OpClassify}
	Terminal = Op[wire.ResultInput, wire.BoolResult]{wire.OpTerminal}
	Silent   = Op[wire.ResultInput, wire.BoolResult]{wire.OpSilent}
)

// Name is the operation's protocol name, e.g. "source.poll".
func (o Op[In, Out]) Name() string { return o.name }

// Decode parses raw, the result object of an answer to o, into o's exact
// shape and applies its value rules (protocol.DecodeResult). The one type
// check between the protocol's decoder and o's result type is here.
func (o Op[In, Out]) Decode(raw []byte) (*Out, error) {
	if o.name == "" {
		return nil, errcode.New(errcode.Internal, "no operation named")
	}
	v, err := protocol.DecodeResult(o.name, raw)
	if err != nil {
		return nil, err
	}
	r, ok := v.(*Out)
	if !ok {
		return nil, errcode.New(errcode.Internal, "the %s result decoded as %T, not %T", o.name, v, r)
	}
	return r, nil
}
