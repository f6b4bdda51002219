// Package adapter is the Go SDK for writing a Firstmate process-event adapter:
// an external package that the Firstmate host (fm) runs to poll a source of
// events, and to classify the results it captured (process-event-adapter/1,
// host protocol 1).
//
// A package is a directory holding a manifest, firstmate-extension.json, and
// one executable entrypoint. The host runs the entrypoint directly (no shell)
// with exactly one argument, the verb "handshake" or "invoke", one JSON
// document on stdin, the package root as working directory and a minimal
// environment. The entrypoint writes one JSON document to stdout and exits.
// This package does all of that protocol work; you write a Handler and call
// Serve from main. docs/protocol.md in the fm repository describes the wire
// protocol for authors in any language; clause ids such as [RID-1] in this
// documentation ("spec [RID-1]") are defined in its docs/spec.md.
//
// The protocol itself (the manifest and envelope types, schema strings,
// bounds, format rules, strict decoding) is defined once, in package wire,
// which the host imports too; its documentation lists those rules. This
// package re-exports the wire types a Handler sees (PollInput, PollResult,
// Code, Error, …), so an adapter needs no other import.
//
// # What you implement
//
// A Handler declares its Identity (the manifest's id, version and adapter
// names) and implements the four operations:
//
//   - Poll (source.poll): wait a bounded time for the next event of a source
//     and return Output(text) — 1 to 32,768 bytes of UTF-8 — or NoResult().
//     The input carries the source id and the operator's config_ref, a
//     one-line string of at most 512 bytes whose meaning you define.
//   - Classify (result.classify): name a captured result with a lower-case
//     token of 1 to 64 bytes matching ^[a-z0-9]+([._-][a-z0-9]+)*$.
//   - Terminal (result.terminal): true retires the source's registration.
//   - Silent (result.silent): true marks the result handled without
//     announcing it.
//
// Classify, Terminal and Silent receive the captured result's content (at most
// 32,768 bytes). A captured result is either an output of your Poll or, when
// a poll failed, a one-line firstmate.process-event-extension-error.v1
// document written by the host (wire.Evidence). A failure of Terminal or Silent counts as
// false.
//
// Every method gets a *Call: the request id, the adapter name (one package
// may provide several adapters), the bound identity, and Env, whose StateDir
// (FIRSTMATE_EXTENSION_STATE) is a private directory for the package's own
// state. Call.Logf writes to stderr within a budget.
//
// # What the SDK does for you
//
// Serve (or Run, for tests) dispatches argv[1]; any other argument list
// prints usage on stderr and exits 2. It reads stdin strictly: at most 65,536
// bytes, UTF-8 only, no byte-order mark, no duplicate or unknown or missing
// key, no null where a value is due, integers where integers are due, nesting
// bounded, exactly one document. It checks schemas, the request id format
// (sha256:<64 lowercase hex>), digests, versions, the extension identity and
// the adapter name before your method runs, so a method only ever sees a
// valid input.
//
// The handshake is answered from Identity: the response echoes the request
// id, names host protocol 1 and process-event-adapter/1, and lists exactly the
// adapter subset the operator enabled. When the request cannot be answered
// truthfully — another extension id or version, an adapter this handler does
// not declare, version 1 of the host protocol or of the capability not
// offered, a malformed request — the handshake response has no way to say
// so: the SDK writes nothing on stdout, logs one line on stderr and exits 1,
// which the host reports as a failed handshake.
//
// An invoke is always answered with one response document and exit status 0,
// ok=false answers included, unless no request id can be read from stdin
// (then nothing is written and the exit status is 1). Before writing, the SDK
// checks your result against its operation's shape and bounds and the whole
// response against 65,536 bytes (a 32,768-byte output of control characters
// escapes to six times its size); a result that breaks a rule is replaced by
// an internal error, so an invalid or oversize document never reaches the
// host. The document is canonical JSON: keys sorted, no insignificant
// whitespace, no trailing newline.
//
// # Errors
//
// Return an error to answer ok=false. Use Errorf to choose one of the five
// codes and whether the host may retry:
//
//	adapter.Errorf(adapter.InvalidRequest, false, "config_ref %q is not dir:<path>", ref)
//	adapter.Errorf(adapter.Unavailable, true, "queue: %w", err)
//
// InvalidRequest: the input is unusable. Incompatible: something this
// package does not speak. Conflict: the request collides with the package's
// state. Unavailable: a dependency is missing for now. Internal: a bug. The
// SDK itself answers InvalidRequest and Incompatible for bad requests. Any
// error that is not an *Error (directly or wrapped) is Internal and not
// retryable; a context cancellation is Unavailable and retryable; a panic is
// Internal. Whatever a method returns or does, an invoke is answered with one
// response document and exit 0: a nil *Error returned as a non-nil error (a
// typed nil: return a plain nil for success), an error whose Error, Unwrap,
// Is or As method panics, a zero result (refused by the result's rules), a
// panic of any value (panic(nil) included, and a value whose String method
// panics) and runtime.Goexit are all answered Internal. Only a panic in a
// goroutine your method started itself ends the process, as in any Go
// program. The message becomes the diagnostic: control characters removed,
// tabs and line breaks turned into spaces, cut to at most 512 bytes at a rune
// boundary. The host reports the failure as extension-<code> and never prints,
// logs or stores the diagnostic: do not rely on it to reach an operator, and
// never put a secret in it.
//
// # Concurrency
//
// A method may use the SDK from several goroutines: Call.Logf is safe for
// concurrent use (whole lines, one at a time, never past LogBudget in
// total); a *Call's fields are set before the method runs and never change;
// Output, NoResult, Errorf, ErrorBodyOf and Diagnostic are pure functions;
// a *Replay holds no mutable state, so its methods may run concurrently
// (two Stores for one source race like two writers of one file: the last
// one wins). The SDK's own tests run under the race detector.
//
// # Rules for the author
//
//   - Never write to stdout: on the wire it carries the one response
//     document. Serve protects you from a slip: from its start until the
//     process exits, fd 1 and os.Stdout point at stderr and the response
//     goes out on a private descriptor, so a stray fmt.Println (even from a
//     goroutine that outlives your method) becomes a line of stderr instead
//     of a broken response (a program that bypasses Serve has no such guard).
//     adaptertest fails a test whose handler writes to os.Stdout all the
//     same, because those bytes count against the stderr bound. Logs go to
//     stderr, preferably through Call.Logf. The host counts stderr, refuses
//     more than 8,192 bytes (failing the invocation), and discards it without
//     showing it. Logf keeps the SDK's own writing within LogBudget bytes.
//   - Bound every wait. Poll must return NoResult before the binding's
//     timeout (--timeout-ms at bind, 300,000 ms by default, as low as 100 ms);
//     a host timeout is a package failure recorded as evidence, not a way to
//     wait. 25 to 55 seconds is a good long-poll. Honour ctx: it is cancelled
//     when the host sends SIGTERM (on its timeout or shutdown).
//   - The handshake runs before every invocation, with a 5-second limit. The
//     SDK answers it without calling your code; keep package start-up cheap.
//   - Make Poll idempotent on the request id. Every poll of a source carries
//     the same request id until the host has durably captured something for
//     that source (your output, or failure evidence), and only then moves to
//     a new id (spec [RID-1]). So you see a repeated id after a no-result
//     answer, and after the host stopped or crashed before capturing your
//     answer. If your poll consumes an event, a repeated id must get the same
//     answer back, or the event is lost. Replay does this.
//   - Stay in your process group. The host runs the entrypoint in a fresh
//     process group and, after the answer, stops that whole group and refuses
//     the answer while any member is alive. Do not call setsid or setpgid, do
//     not double-fork or daemonize, wait for every child you start, and do
//     not leave anything running after you answer.
//   - The environment is minimal: PATH (a fixed system path), LANG=C, LC_ALL=C
//     and the three FIRSTMATE_EXTENSION_* variables; HOME and the XDG and
//     SSH_AUTH_SOCK variables only when the operator granted the
//     credential-store consent. The working directory is the installed
//     package root, which is read-only: write only under Env.StateDir.
//   - config_ref is stored by the host and sent in every request: it is a
//     reference (a path, a name), never a credential.
//
// # Idempotence with Replay
//
// Replay keeps, per source, the last status=result answer and the request id
// it answered, in Env.StateDir/replay. The simplest use wraps a poll
// function that consumes what it returns:
//
//	r, err := call.Replay()
//	if err != nil {
//		return adapter.PollResult{}, err
//	}
//	return r.Poll(call, in, func() (adapter.PollResult, error) {
//		return nextEvent(ctx, in) // consumes one event
//	})
//
// When consumption can be deferred (marking a file seen, committing a queue
// offset), use Load and Store: store the answer with a Key naming what it
// consumed, then commit the consumption; on a replayed Load, commit rec.Key
// again. A crash between the two steps then neither loses nor repeats the
// event. NoResult answers and errors are never stored.
//
// # A complete adapter
//
// This adapter, "echo-file", answers the contents of the file named by
// config_ref once per change of its modification time:
//
//	package main
//
//	import (
//		"context"
//		"os"
//		"strings"
//		"time"
//
//		"firstmate.dev/fm/pkg/adapter"
//	)
//
//	type echo struct{}
//
//	func (echo) Identity() adapter.Identity {
//		return adapter.Identity{
//			ExtensionID:      "org.example.echo-file",
//			ExtensionVersion: "1.0.0",
//			AdapterNames:     []string{"echo-file"},
//		}
//	}
//
//	func (echo) Poll(ctx context.Context, call *adapter.Call, in adapter.PollInput) (adapter.PollResult, error) {
//		path, ok := strings.CutPrefix(in.ConfigRef, "file:")
//		if !ok || !strings.HasPrefix(path, "/") {
//			return adapter.PollResult{}, adapter.Errorf(adapter.InvalidRequest, false, "config_ref must be file:<absolute path>")
//		}
//		r, err := call.Replay()
//		if err != nil {
//			return adapter.PollResult{}, err
//		}
//		return r.Poll(call, in, func() (adapter.PollResult, error) {
//			seen := call.Env.StateDir + "/" + in.SourceID + ".seen"
//			last, _ := os.ReadFile(seen)
//			deadline := time.Now().Add(25 * time.Second)
//			for time.Now().Before(deadline) {
//				if fi, err := os.Stat(path); err == nil && fi.Size() > 0 && fi.Size() <= 16384 {
//					stamp := fi.ModTime().String()
//					if stamp != string(last) {
//						data, err := os.ReadFile(path)
//						if err != nil {
//							return adapter.PollResult{}, adapter.Errorf(adapter.Unavailable, true, "read: %w", err)
//						}
//						if err := os.WriteFile(seen, []byte(stamp), 0o600); err != nil {
//							return adapter.PollResult{}, err
//						}
//						return adapter.Output(string(data)), nil
//					}
//				}
//				select {
//				case <-ctx.Done():
//					return adapter.NoResult(), nil
//				case <-time.After(500 * time.Millisecond):
//				}
//			}
//			return adapter.NoResult(), nil
//		})
//	}
//
//	func (echo) Classify(context.Context, *adapter.Call, adapter.ResultInput) (adapter.ClassifyResult, error) {
//		return adapter.ClassifyResult{Classification: "echo-file"}, nil
//	}
//
//	func (echo) Terminal(context.Context, *adapter.Call, adapter.ResultInput) (adapter.BoolResult, error) {
//		return adapter.BoolResult{Value: false}, nil
//	}
//
//	func (echo) Silent(context.Context, *adapter.Call, adapter.ResultInput) (adapter.BoolResult, error) {
//		return adapter.BoolResult{Value: false}, nil
//	}
//
//	func main() { adapter.Serve(echo{}) }
//
// Its manifest, firstmate-extension.json at the package root:
//
//	{
//	  "schema": "firstmate.extension-manifest.v1",
//	  "id": "org.example.echo-file",
//	  "version": "1.0.0",
//	  "host_protocols": [1],
//	  "entrypoint": "bin/firstmate-extension",
//	  "capabilities": [
//	    {"name": "process-event-adapter", "versions": [1], "adapter_names": ["echo-file"]}
//	  ],
//	  "required_consents": ["artifact-references"]
//	}
//
// Build the entrypoint into a package directory outside any Git work tree
// and outside the fm home, and bind it:
//
//	go build -trimpath -o /opt/echo-file/bin/firstmate-extension .
//	cp firstmate-extension.json /opt/echo-file/
//	chmod -R go-w /opt/echo-file
//	fm extension bind /opt/echo-file --adapter echo-file --trust-same-user-code --consent artifact-references
//	fm procevent register-extension echo-file notes --config-ref file:/home/me/notes.txt
//	fm procevent start notes
//
// The package must hold only regular files and directories (no symlinks, no
// hard links, nothing group- or world-writable). Binding copies it into the
// home; rebuild and bind a new version to change it.
//
// # Depending on the SDK from your own module
//
// The SDK is the package firstmate.dev/fm/pkg/adapter of the module
// firstmate.dev/fm. Until that module is published, an adapter in its own
// repository requires it and replaces it with a checkout of fm:
//
//	go mod init example.com/my-adapter
//	go mod edit -require=firstmate.dev/fm@v0.0.0 -replace=firstmate.dev/fm=/src/fm
//	cp /src/fm/go.sum .
//	go mod tidy
//	go build -trimpath -o /opt/my-adapter/bin/firstmate-extension .
//
// The SDK needs only github.com/go-json-experiment/json and golang.org/x/sys,
// at the versions fm's go.mod names. On a machine without network access they
// must be in the module cache already (any earlier build of fm puts them
// there) and their checksums in your go.sum, which copying fm's go.sum gives
// you without asking the checksum database; then build with
// GOFLAGS=-mod=mod GOPROXY=off. When the module is published, drop the
// replace directive and require a version.
//
// # Testing
//
// Package adaptertest runs a Handler in-process the way the host runs the
// entrypoint, with valid random request ids, and checks every answer as
// strictly as the host does; CheckManifest compares the manifest with
// Identity. Its Home runs the built package under a real fm binary in a
// throwaway home (bind, register-extension, start, classify, handled, the
// inbox and the wakes), which is where process groups, the minimal
// environment and the host's timeouts apply; the package's entrypoint can be
// the test binary itself. The directory examples/go-adapter of the fm
// repository holds a complete adapter (dir-signal) with both kinds of test.
package adapter
