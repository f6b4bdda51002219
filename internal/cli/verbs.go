package cli

import "firstmate.dev/fm/internal/remote"

// commands returns the table of fm's command line: every group and its
// verbs, with the synopsis and summary the help prints and the function
// that runs each. It is the one place a verb is registered: a new verb is a
// row here and a named function in its group's file (plain for a verb
// without flags, flagged with a type of its flags). The help, the usage
// errors and the completion script are all derived from it. Main makes the
// table afresh on every run, so no state outlives a run.
func commands() []*group {
	return []*group{
		{name: "extension", summary: "bind, inspect, verify, call and retire extension packages", verbs: extensionVerbs()},
		{name: "procevent", summary: "register, run, capture, handle and retire process-event sources", verbs: proceventVerbs()},
		{name: "wake", summary: "read the durable wake queue", verbs: wakeVerbs()},
		{name: "on", summary: "run an fm command in a secondmate home", verbs: []*Verb{{
			Name: "",
			Args: "[--stdin] [--timeout <duration>] <secondmate-id> <fm-command> [<argument>...]",
			Summary: "run one fm command (extension, procevent, wake, doctor, help, version) in the secondmate home routed by data/secondmates.json: locally, or over ssh (FM_SSH_BIN, default ssh) when the route names a host; only the command's argv crosses, and with --stdin this command's bounded stdin. " +
				"--timeout bounds the whole job (90s, 15m, or milliseconds; default 10m; 0: none): at the deadline the transport's process group is stopped (remote-invalid)",
			Raw:   true,
			Setup: plain(on),
		}}},
		{name: remote.ReceiveVerb, summary: "the remote end of fm on (internal)", hidden: true, verbs: []*Verb{{
			Name:    "",
			Args:    "<job>",
			Summary: "run the job that fm on encoded, in the secondmate home it names (internal: fm on runs this over ssh)",
			Raw:     true,
			Stream:  true,
			Setup:   plain(onReceive),
		}}},
		{name: "doctor", summary: "check a home and print what to fix: fm doctor [--json]", verbs: []*Verb{{
			Name: "",
			Args: "[--json]",
			Summary: "Check the home without changing it or running package code: modes and owners of the home and state\n" +
				"directories, the registry, every installed package, stale invocation records, sources, claims,\n" +
				"whether fm procevent serve is running, unhandled results, the wake queue and the secondmate routes.\n" +
				"One line per finding (ok, warn, FAIL with the fix); exit 0 when nothing failed, 1 otherwise.",
			Setup: flagged(doctorReport),
		}}},
		{name: "home", summary: "move a home of the earlier Firstmate implementation onto fm; see or set its confinement", verbs: []*Verb{{
			Name: "import",
			Args: "[--dry-run] [--json]",
			Summary: "Convert a stopped home of the earlier Firstmate implementation into fm's layout, in place: registrations\n" +
				"(tokens kept), result owners, handled markers, sequence counters, the wake queue, transfer receipts and modes.\n" +
				"Every replaced or removed file is kept under data/imported/<UTC time>/. One line per thing converted, then\n" +
				"imported: sources=<n> results=<n> unhandled=<n> transfers=<n>. Safe to interrupt: run it again to finish.",
			Setup: flagged(homeImport),
		}, {
			Name: "confinement",
			Args: "[enforce|strict|off] [--json]",
			Summary: "See, or set, how the kernel (Landlock) confines packages in this home: enforce (the default) confines each\n" +
				"package to what its binding granted and runs it with what the kernel can enforce, saying what it could not;\n" +
				"strict refuses (confinement-unavailable) what the kernel cannot confine fully; off runs packages with your full\n" +
				"rights. Prints the setting, the kernel's Landlock ABI and each bound package's rules.",
			Setup: flagged(homeConfinement),
		}}},
		{name: "completion", summary: "print a shell completion script: fm completion bash|zsh", verbs: []*Verb{{
			Name:    "",
			Args:    "bash|zsh",
			Summary: "Print a completion script for bash or zsh. Load it with\n  source <(fm completion bash)      # bash\n  source <(fm completion zsh)       # zsh",
			Setup:   plain(completion),
		}}},
	}
}

// extensionVerbs are the verbs of fm extension (CONTRACT §4 to §9 and §13);
// the transfer verbs are §12's: pack-transfer [XFER-1],
// receive-transfer-bind [XFER-3], remote-bind [XFER-5] and retire-transfer
// [XFER-6].
func extensionVerbs() []*Verb {
	return []*Verb{
		{Name: "bind",
			Args:    "<package-dir> --adapter <name> [--adapter <name>...] --trust-same-user-code [--consent <fact>...] [--timeout-ms <n>] [--handshake-timeout-ms <n>] [--show-stderr]",
			Summary: "validate a package directory, install it into this home's store, handshake, and enable the named adapters",
			Setup:   flagged(extensionBind)},
		{Name: "upgrade",
			Args: "<extension-id> <package-dir> --trust-same-user-code [--adapter <name>...] [--consent <fact>...] [--timeout-ms <n>] [--handshake-timeout-ms <n>] [--show-stderr]",
			Summary: "move an extension's sources to a new package version or new settings in one step, under the lifecycle lock: retire its sources and\n" +
				"binding, bind the package, register each source again with its config_ref and print the new owner tokens. Adapters, consents and\n" +
				"--timeout-ms and --handshake-timeout-ms not given are kept. Refuses, changing nothing, while results only the current binding may classify are unhandled\n" +
				"(all listed). Interrupted: run the same command again to finish (fm doctor reports it)",
			// Each step's lines are printed as it is done, so the new
			// tokens of a move that fails later are still shown.
			Stream: true,
			Setup:  flagged(extensionUpgrade)},
		{Name: "list",
			Args:    "[--json]",
			Summary: "list enabled bindings (runs no package code)",
			Setup:   flagged(extensionList)},
		{Name: "inspect",
			Args:    "<extension-id> [--json]",
			Summary: "print the validated binding record (runs no package code)",
			Setup:   flagged(extensionInspect)},
		{Name: "verify",
			Args:    "[<extension-id>]",
			Summary: "revalidate every (or one) binding and its installed package, and run a live handshake; note a source directory that differs from its bound copy",
			Setup:   plain(extensionVerify)},
		{Name: "retire-binding",
			Args:    "<extension-id> --if-binding-digest <sha256:hex>",
			Summary: "disable exactly that binding, keeping it restorable in data/extensions/retired-bindings",
			Setup:   flagged(extensionRetireBinding)},
		{Name: "gc",
			Args:    "[--dry-run] [--include-retired]",
			Summary: "remove store copies (data/extensions/packages/<id>/<version>/<hex>) that no enabled binding, retired binding (unless --include-retired) or invocation references",
			Setup:   flagged(extensionGC)},
		{Name: "cleanup-invocations",
			Args:    "[--binding-digest <sha256:hex>]",
			Summary: "prove the process groups of invocations whose host died gone, and clear their records",
			Setup:   flagged(extensionCleanupInvocations)},
		{Name: "process-event",
			Args:    "<adapter> <operation> [--source-id S --config-ref R [--uncaptured]] [--result-file F] [--request-id ID] [--show-stderr] [--confinement enforce|strict|off]",
			Summary: "call one process-event-adapter/1 operation directly (for operators and tests); changes no state",
			Setup:   flagged(extensionProcessEvent)},
		{Name: "pack-transfer",
			Args:    "<package-dir>",
			Summary: "write the package as one canonical transfer envelope to stdout (the rules of bind and the receiver's limits apply)",
			Setup:   plain(extensionPackTransfer)},
		{Name: "receive-transfer-bind",
			Args:    "--adapter <name> [--adapter <name>...] --trust-same-user-code [--consent <fact>...] [--timeout-ms <n>] < envelope",
			Summary: "validate a transfer envelope from stdin, stage it under data/extensions/staging, and bind the staged package",
			Setup:   flagged(extensionReceiveTransferBind)},
		{Name: "remote-bind",
			Args:    "<secondmate-id> <package-dir> --adapter <name> [--adapter <name>...] --trust-same-user-code [--consent <fact>...] [--timeout-ms <n>] [--timeout <duration>]",
			Summary: "pack the package here and bind it in a secondmate home through fm on --stdin ... receive-transfer-bind; this home gets no binding",
			Setup:   flagged(extensionRemoteBind)},
		{Name: "retire-transfer",
			Args:    "<extension-id> --if-transfer-digest <sha256:hex> --if-binding-digest <sha256:hex>",
			Summary: "disable a transferred binding and retire its staged transfer into data/extensions/retired-staging (resumes an interrupted retirement)",
			Setup:   flagged(extensionRetireTransfer)},
	}
}

// proceventVerbs are the verbs of fm procevent (CONTRACT §10).
func proceventVerbs() []*Verb {
	return []*Verb{
		{Name: "register",
			Args:    "<adapter> <source-id> -- <argv...>",
			Summary: "register a built-in source: argv is stored exactly and run directly (no shell) by the runner",
			Setup:   plain(proceventRegister)},
		{Name: "register-extension",
			Args:    "<adapter> <source-id> --config-ref <ref>",
			Summary: "register a source served by the bound extension that enables the adapter (a new generation with a fresh owner token)",
			Setup:   flagged(proceventRegisterExtension)},
		{Name: "retire",
			Args:    "<source-id> [--if-owner <token> | --if-matches <adapter> -- <argv...> | --if-absent]",
			Summary: "stop the source's running poll and remove its registration (bare form: built-ins only)",
			Setup:   flagged(proceventRetire)},
		{Name: "start",
			Args:    "<source-id>",
			Summary: "run one attached poll of the source, then capture, announce, and ask the silent and terminal verdicts",
			Setup:   plain(proceventStart)},
		{Name: "serve",
			Args:    "[--min-gap <d>] [--max-backoff <d>] [--rescan <d>] [--reannounce-after <d>]",
			Summary: "supervise every registered source of the home until TERM/INT (one serve per home)",
			Stream:  true,
			Setup:   flagged(proceventServe)},
		{Name: "reconcile",
			Args:    "[--reannounce-after <d>]",
			Summary: "run one supervision cycle: clean up after dead runners, re-announce unhandled results, poll every source once",
			Setup:   flagged(proceventReconcile)},
		{Name: "handled",
			Args:    "<source-id> <seq> | <source-id> --all",
			Summary: "mark a captured result handled, or with --all every unhandled result of the source",
			Setup:   flagged(proceventHandled)},
		{Name: "classify",
			Args:    "<result-file>",
			Summary: "print the classification of a captured result by its captured owner (changes no state)",
			Setup:   plain(proceventClassify)},
		{Name: "list",
			Args:    "[--json]",
			Summary: "list registered sources with adapter, owner and pending (unhandled) count",
			Setup:   flagged(proceventList)},
		{Name: "token",
			Args:    "<source-id>",
			Summary: "print an extension source's owner token (from its registration) and the exact command that retires it",
			Setup:   plain(proceventToken)},
		{Name: "status",
			Args:    "[<source-id>] [--json]",
			Summary: "show each source's state (polling, failing, stopped, idle), last poll and outcome, consecutive failures with the last code and detail, unhandled count and next poll; one source in detail with its recent history",
			Setup:   flagged(proceventStatus)},
		{Name: "debug",
			Args:    "<source-id> on|off",
			Summary: "keep (on) or stop keeping (off) the package's stderr of the source's failed polls, escaped and bounded, in the operator's private file <state>/procevent-status/<source-id>.stderr; never in evidence or wakes",
			Setup:   plain(proceventDebug)},
		{Name: "inbox",
			Args:    "[--json]",
			Summary: "list captured results with their owner and handled state",
			Setup:   flagged(proceventInbox)},
		{Name: "sweep-home",
			Args:    "[--preflight]",
			Summary: "retire every registration of the home and prove every invocation group gone",
			Setup:   flagged(proceventSweepHome)},
	}
}

// wakeVerbs are the verbs of fm wake (CONTRACT §11).
func wakeVerbs() []*Verb {
	return []*Verb{
		{Name: "list",
			Args:    "[--after <queue-seq>] [--json]",
			Summary: "print the queued wakes: on a terminal an aligned table, otherwise one stored line each (unix-seconds, queue-seq, kind, key, payload, tab-separated); no wakes (after n) when there is none",
			Setup:   flagged(wakeList)},
		{Name: "watch",
			Args:    "[--after <queue-seq>]",
			Summary: "print the queued wakes, then each new one as it is appended, until TERM/INT",
			Stream:  true,
			Setup:   flagged(wakeWatch)},
		{Name: "compact",
			Args:    "[--keep <n>]",
			Summary: "rewrite the wake queue to its latest wakes and the latest wake of each unhandled result, under the queue's lock; queue-seqs never go back",
			Setup:   flagged(wakeCompact)},
	}
}
