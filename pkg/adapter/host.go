package adapter

import (
	"firstmate.dev/fm/internal/manifest"
	"firstmate.dev/fm/internal/protocol"
)

// The exported constants of this package are written out so that go doc
// shows their values to adapter authors. Each one the host also defines is
// tied here to the host's value: should the two ever differ, that line's map
// literal holds the key false twice and the package does not compile.
func _() {
	type same = map[bool]struct{}
	_ = same{false: {}, HandshakeRequestSchema == protocol.HandshakeRequestSchema: {}}
	_ = same{false: {}, HandshakeResponseSchema == protocol.HandshakeResponseSchema: {}}
	_ = same{false: {}, RequestSchema == protocol.RequestSchema: {}}
	_ = same{false: {}, ResponseSchema == protocol.ResponseSchema: {}}
	_ = same{false: {}, CapabilityName == protocol.Capability: {}}
	_ = same{false: {}, CapabilityName == manifest.CapabilityName: {}}
	_ = same{false: {}, OpPoll == protocol.OpPoll: {}}
	_ = same{false: {}, OpClassify == protocol.OpClassify: {}}
	_ = same{false: {}, OpTerminal == protocol.OpTerminal: {}}
	_ = same{false: {}, OpSilent == protocol.OpSilent: {}}
	_ = same{false: {}, MaxEnvelopeBytes == protocol.MaxEnvelope: {}}
	_ = same{false: {}, MaxOutputBytes == protocol.MaxPollOutput: {}}
	_ = same{false: {}, MaxEscapedOutputBytes == protocol.MaxEscapedOutput: {}}
	_ = same{false: {}, MaxContentBytes == protocol.MaxContent: {}}
	_ = same{false: {}, MaxConfigRefBytes == protocol.MaxConfigRef: {}}
	_ = same{false: {}, MaxDiagnosticBytes == protocol.MaxDiagnostic: {}}
	_ = same{false: {}, MaxClassificationBytes == protocol.MaxClassifyToken: {}}
	_ = same{false: {}, MaxStderrBytes == protocol.MaxStderr: {}}
	_ = same{false: {}, ManifestFile == manifest.File: {}}
	_ = same{false: {}, ManifestSchema == manifest.Schema: {}}
}
