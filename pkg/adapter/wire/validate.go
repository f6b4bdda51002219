package wire

import (
	"slices"
	"unicode/utf8"
)

// Validate checks the request's field formats beyond its JSON shape: schema,
// request id, digest, host protocol, capability, extension identity and
// adapter names. It does not check the identity against a package. Errors are
// *Error with code InvalidRequest or Incompatible.
func (r *HandshakeRequest) Validate() error {
	if err := checkHead("handshake request", r.Schema, HandshakeRequestSchema, r.RequestID); err != nil {
		return err
	}
	if err := checkPackage("handshake request", r.ExtensionID, r.ExtensionVersion, r.PackageDigest); err != nil {
		return err
	}
	if err := CheckVersionList(r.HostProtocols, "host_protocols"); err != nil {
		return errf(InvalidRequest, "handshake request: %v", err)
	}
	if !slices.Contains(r.HostProtocols, HostProtocol) {
		return errf(Incompatible, "handshake request: host protocol %d is not offered", HostProtocol)
	}
	if r.Capability.Name != CapabilityName {
		return errf(Incompatible, "handshake request: capability is not %s", CapabilityName)
	}
	if err := CheckVersionList(r.Capability.Versions, "capability/versions"); err != nil {
		return errf(InvalidRequest, "handshake request: %v", err)
	}
	if !slices.Contains(r.Capability.Versions, CapabilityVersion) {
		return errf(Incompatible, "handshake request: %s version %d is not offered", CapabilityName, CapabilityVersion)
	}
	if err := CheckAdapterNames(r.Capability.AdapterNames); err != nil {
		return errf(InvalidRequest, "handshake request: capability/%v", err)
	}
	return nil
}

// Validate checks the request's field formats beyond its JSON shape. A wrong
// schema, host protocol, capability, capability version or an unknown
// operation is Incompatible; a malformed id or digest is InvalidRequest. It
// does not check the identity or adapter against a package, nor the input
// (PollInput and ResultInput do).
func (r *Request) Validate() error {
	if err := checkHead("request", r.Schema, RequestSchema, r.RequestID); err != nil {
		return err
	}
	switch {
	case r.HostProtocol != HostProtocol:
		return errf(Incompatible, "request: host_protocol %d is not supported (only %d)", r.HostProtocol, HostProtocol)
	case r.Capability != CapabilityName:
		return errf(Incompatible, "request: capability is not %s", CapabilityName)
	case r.CapabilityVersion != CapabilityVersion:
		return errf(Incompatible, "request: capability_version %d is not supported (only %d)", r.CapabilityVersion, CapabilityVersion)
	}
	if err := checkPackage("request", r.ExtensionID, r.ExtensionVersion, r.PackageDigest); err != nil {
		return err
	}
	if !ValidAdapterName(r.Adapter) {
		return errf(InvalidRequest, "request: adapter is not a valid adapter name")
	}
	if !slices.Contains(Operations, r.Operation) {
		return errf(Incompatible, "request: operation %q is not part of %s/%d", Clip(r.Operation, 40), CapabilityName, CapabilityVersion)
	}
	return nil
}

// checkHead checks what every request starts with: its schema (another is
// Incompatible) and its request id.
func checkHead(what, schema, want, requestID string) error {
	if schema != want {
		return errf(Incompatible, "%s: schema is not %s", what, want)
	}
	if !ValidRequestID(requestID) {
		return errf(InvalidRequest, "%s: request_id is not sha256:<64 lowercase hex>", what)
	}
	return nil
}

// checkPackage checks the bound package identity every request names: the
// extension id and version, and the package digest.
func checkPackage(what, id, version, digest string) error {
	switch {
	case !ValidExtensionID(id):
		return errf(InvalidRequest, "%s: extension_id is not a valid id", what)
	case !ValidVersion(version):
		return errf(InvalidRequest, "%s: extension_version is not a semantic version", what)
	case !ValidRequestID(digest):
		return errf(InvalidRequest, "%s: package_digest is not sha256:<64 lowercase hex>", what)
	}
	return nil
}

// Validate checks the source id and config_ref formats ([OP-1]).
func (in PollInput) Validate() error {
	if !ValidSourceID(in.SourceID) {
		return errf(InvalidRequest, "input: source_id is not [A-Za-z0-9._-]{1,64} without a leading dot")
	}
	if !ValidConfigRef(in.ConfigRef) {
		return errf(InvalidRequest, "input: config_ref is not one line of 1..512 bytes without control characters")
	}
	return nil
}

// Validate checks the source id, sequence and content bound ([OP-1]).
func (in ResultInput) Validate() error {
	if !ValidSourceID(in.SourceID) {
		return errf(InvalidRequest, "input: source_id is not [A-Za-z0-9._-]{1,64} without a leading dot")
	}
	if in.Sequence < 1 {
		return errf(InvalidRequest, "input: sequence %d is not 1 or more", in.Sequence)
	}
	if len(in.Content) > MaxContentBytes {
		return errf(InvalidRequest, "input: content is larger than %d bytes", MaxContentBytes)
	}
	return nil
}

// Validate checks a poll result: status "result" with 1..32,768 bytes of
// UTF-8 output that take at most 64,696 bytes JSON-escaped (the host
// refuses a larger one as response-oversized: it could not be carried into
// the result's verdict requests), or status "no-result" with empty output.
func (p PollResult) Validate() error {
	switch p.Status {
	case StatusResult:
		if len(p.Output) == 0 {
			return errf(Internal, "poll result: status result with empty output (return adapter.NoResult() instead)")
		}
		if len(p.Output) > MaxOutputBytes {
			return errf(Internal, "poll result: output is %d bytes, more than %d", len(p.Output), MaxOutputBytes)
		}
		if n := EscapedLen(p.Output); n > MaxEscapedOutputBytes {
			return errf(Internal, "poll result: output takes %d bytes JSON-escaped, more than %d", n, MaxEscapedOutputBytes)
		}
		if !utf8.ValidString(p.Output) {
			return errf(Internal, "poll result: output is not valid utf-8")
		}
	case StatusNoResult:
		if p.Output != "" {
			return errf(Internal, "poll result: status no-result with non-empty output")
		}
	default:
		return errf(Internal, "poll result: status %q is neither %q nor %q", Clip(p.Status, 40), StatusResult, StatusNoResult)
	}
	return nil
}

// Validate checks the classification token.
func (c ClassifyResult) Validate() error {
	if !ValidClassification(c.Classification) {
		return errf(Internal, "classify result: classification is not a lower-case token of 1..64 bytes matching ^[a-z0-9]+([._-][a-z0-9]+)*$")
	}
	return nil
}
