// Package fmjson defines the documents fm prints with --json: one definition
// that fm's CLI encodes and that readers of its output, such as the adapter
// test harness (adaptertest.Home), decode.
//
// The rules, and why each holds:
//
//  1. A document is one JSON object whose one member holds the list (Inbox,
//     Wakes, Bindings, Sources), so that a later member can be added
//     without changing what the list is.
//  2. The CLI prints it canonically (keys sorted), indented by two spaces
//     and ended by one newline; an empty list is [], never null, so that a
//     strict reader needs no special case.
//  3. Every member is always present, except the owner members of a result
//     that no extension captured (tagged omitzero), so that a strict reader
//     can refuse a missing member as a broken document.
//  4. Numbers are integers: times are unix seconds, sequences and counts
//     are counts.
package fmjson

// Inbox is what `fm procevent inbox --json` prints: every captured result of
// the home, in source-id and sequence order.
type Inbox struct {
	Results []Result `json:"results"`
}

// Result is one captured result: its Meta, where its bytes are, and whether
// it was handled.
type Result struct {
	Meta
	// Path is the result file; its bytes are exactly what was captured.
	Path    string `json:"path"`
	Handled bool   `json:"handled"`
}

// Meta is the immutable owner of one captured result, as fm stores it beside
// the result and lists it.
type Meta struct {
	Schema string `json:"schema"`
	// Kind is "extension" (a source served by a binding) or "builtin".
	Kind     string `json:"kind"`
	Adapter  string `json:"adapter"`
	SourceID string `json:"source_id"`
	Sequence int64  `json:"sequence"`
	// Evidence is true when the result is the evidence of a failed poll
	// (a wire.Evidence line) rather than the adapter's output.
	Evidence   bool  `json:"evidence"`
	CapturedAt int64 `json:"captured_at"` // unix seconds

	// The binding that captured the result (Kind "extension" only).
	ExtensionID       string `json:"extension_id,omitzero"`
	ExtensionVersion  string `json:"extension_version,omitzero"`
	CapabilityVersion int64  `json:"capability_version,omitzero"`
	PackageDigest     string `json:"package_digest,omitzero"`
	BindingDigest     string `json:"binding_digest,omitzero"`
}

// Wakes is what `fm wake list --json` prints: the wake queue.
type Wakes struct {
	Wakes []Wake `json:"wakes"`
}

// Wake is one entry of the wake queue. A captured result is announced as
// Kind "check", Key "procevent:<source-id>:<seq>", Payload "check: procevent
// <adapter> <source-id> <seq>", and announced again while nobody marks it
// handled.
type Wake struct {
	Time    int64  `json:"time"` // unix seconds
	Seq     int64  `json:"seq"`  // the queue-seq, one more than the last
	Kind    string `json:"kind"`
	Key     string `json:"key"`
	Payload string `json:"payload"`
}

// Bindings is what `fm extension list --json` prints: the enabled bindings.
type Bindings struct {
	Bindings []Binding `json:"bindings"`
}

// Binding is one enabled binding.
type Binding struct {
	ExtensionID       string   `json:"extension_id"`
	ExtensionVersion  string   `json:"extension_version"`
	Capability        string   `json:"capability"`
	CapabilityVersion int64    `json:"capability_version"`
	AdapterNames      []string `json:"adapter_names"`
	PackageDigest     string   `json:"package_digest"`
	BindingDigest     string   `json:"binding_digest"`
	Binding           string   `json:"binding"` // the binding file
	// HandshakeTimeoutMS is fm's own setting of the binding's handshake
	// bound (--handshake-timeout-ms), stored beside the record.
	HandshakeTimeoutMS int64 `json:"handshake_timeout_ms"`
}

// Sources is what `fm procevent list --json` prints: the registered sources.
type Sources struct {
	Sources []Source `json:"sources"`
}

// Source is one registered source.
type Source struct {
	SourceID string `json:"source_id"`
	Adapter  string `json:"adapter"`
	Kind     string `json:"kind"`  // "extension" or "builtin"
	Owner    string `json:"owner"` // "<extension-id>@<version>" or "built-in"
	// Pending counts the source's unhandled results.
	Pending int64 `json:"pending"`
}

// Statuses is what `fm procevent status --json` prints: whether a serve
// supervises the home, and each registered source's state (one source when
// a source id is given, with its history).
type Statuses struct {
	Serving bool           `json:"serving"`
	Sources []SourceStatus `json:"sources"`
}

// SourceStatus is one source's operator state.
type SourceStatus struct {
	Source
	// BindingDigest is the binding an extension registration uses ("" for a
	// built-in); ConfigRef its config_ref ("" for a built-in).
	BindingDigest string `json:"binding_digest"`
	ConfigRef     string `json:"config_ref"`
	// State is "polling", "failing", "stopped" or "idle".
	State string `json:"state"`
	// LastPoll is when the last recorded pass ended (0: none recorded),
	// LastOutcome what it did: "result", "no-result", "evidence",
	// "collapsed", "error", "check-failed" or "recovered".
	LastPoll    int64  `json:"last_poll"`
	LastOutcome string `json:"last_outcome"`
	// ConsecutiveFailures counts the failed passes since the last success,
	// from FailingSince, the last with LastCode and LastDetail.
	ConsecutiveFailures int64  `json:"consecutive_failures"`
	FailingSince        int64  `json:"failing_since"`
	LastCode            string `json:"last_code"`
	LastDetail          string `json:"last_detail"`
	// Run is the failing run whose evidence is unhandled (Evidence 0: none).
	Run FailRun `json:"run"`
	// NextPoll is when serve scheduled the next poll (0: not scheduled).
	NextPoll int64 `json:"next_poll"`
	// StatusError says why fm's status file of the source was not
	// trusted ("" when it was, or there is none).
	StatusError string `json:"status_error"`
	// DebugLog is where the package's stderr of failed polls is kept,
	// when the operator turned that on for the source ("" when off).
	DebugLog string `json:"debug_log"`
	// History is the recent history, oldest first, for one source; [] in
	// the list of all.
	History []HistoryEntry `json:"history"`
}

// FailRun is a failing run [OP-5]: the evidence captured at its start and
// the failures counted since, with the same code.
type FailRun struct {
	Evidence int64  `json:"evidence"`
	Code     string `json:"code"`
	Count    int64  `json:"count"`
	Since    int64  `json:"since"`
	Last     int64  `json:"last"`
	Detail   string `json:"detail"`
}

// HistoryEntry is one recorded pass (or verdict failure, or recovery).
type HistoryEntry struct {
	Time     int64  `json:"time"`
	Outcome  string `json:"outcome"`
	Sequence int64  `json:"sequence"`
	Code     string `json:"code"`
	Detail   string `json:"detail"`
}

// Confinement is what `fm home confinement --json` prints: the home's
// confinement setting, the kernel's Landlock ABI and what each bound package
// is confined to ([CONF-2]).
type Confinement struct {
	Mode     string              `json:"mode"`     // enforce, strict or off
	Set      bool                `json:"set"`      // false: the default (no config/confinement)
	ABI      int                 `json:"abi"`      // the kernel's Landlock ABI; 0: none
	Summary  string              `json:"summary"`  // the one line doctor and verify print
	Bindings []ConfinedExtension `json:"bindings"` // in id order
}

// ConfinedExtension is what one bound package is confined to.
type ConfinedExtension struct {
	ExtensionID string   `json:"extension_id"`
	Confined    bool     `json:"confined"`
	Rules       []string `json:"rules"`  // the rules in force: "rx /usr", "no tcp", ...
	Lacked      []string `json:"lacked"` // what its ruleset needs and the kernel lacks
}
